"""Sockets, timers and the clock: Tornado IOLoop + pyzmq streams that carry out core effects."""
