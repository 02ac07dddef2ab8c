"""What a client or worker decides, without sockets: negotiation, resend, failover, typed views.

Pure like ``scale0.core`` (import contract in setup.cfg): no zmq, no tornado, no clock reads, no
random ids; time, ids and jitter are passed in. ``scale0.net.client`` and ``scale0.net.worker``
own the sockets and drive these classes: ``view`` (the config view a broker sends), ``link``
(one DEALER's negotiation and liveness), ``failover`` (which broker next), ``requests`` (a
client's requests), ``worker`` (a worker's session), ``errors`` (what a request fails with).
"""
