"""The host of the ``c-lru-loop`` and ``c-lru-asyncio`` bench cases: the strict-LRU floor's
routing in C (tools/mdp_lru_loop.c, the extension ``_mdp_lru_loop`` that
tools/mdp_brokers.py builds) inside a Python event loop, as a C lane inside Scale0's node would
run: Tornado's IOLoop (``--loop tornado``, what Scale0 runs, on asyncio) or asyncio's own loop
without Tornado (``--loop asyncio``). The loop watches both sockets' ZMQ_FDs and calls the C
function ``wake`` itself, no Python in between, once per wake-up; a timer calls ``tick`` every
heartbeat interval. So its CPU above ``c-lru``'s is what the Python loop's wake-ups cost.
With ``--loop thread`` (``c-lru-thread``) the C routing runs in a thread of its own instead,
waiting in zmq_poll as mdp-lru does, beside an idle Tornado loop: a lane outside the loop.

    python tools/mdp_lru_loop.py --module-dir DIR [--loop tornado|asyncio|thread]
        [-i HEARTBEAT_MS] [-l LIVENESS] FRONTEND BACKEND

It binds both ROUTERs (``tcp://127.0.0.1:*`` picks a port) with mdp-lru's options, prints
``frontend <endpoint>`` and ``backend <endpoint>`` on stdout, and on SIGTERM/SIGINT prints
mdp-lru's ``stats ...`` line on stderr and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import zmq

HWM = 100_000  # as tools/c_broker.h's bound()


def bound(ctx: zmq.Context[Any], endpoint: str, name: str) -> zmq.Socket[Any]:
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.sndhwm = HWM
    sock.rcvhwm = HWM
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        sys.exit(f"mdp-lru-loop: cannot bind {name} {endpoint}: {e}")
    print(f"{name} {sock.getsockopt_string(zmq.LAST_ENDPOINT)}")
    return sock


def run_tornado(lane: ModuleType, fds: list[int], heartbeat_ms: float) -> None:
    from tornado.ioloop import IOLoop, PeriodicCallback  # noqa: PLC0415 (only this loop)

    async def serve() -> None:
        loop = IOLoop.current()
        stopped = asyncio.Event()
        lane_start(lane, lambda: loop.add_callback(lane.wake))
        for fd in fds:
            loop.add_handler(fd, lane.wake, IOLoop.READ)
        PeriodicCallback(lane.tick, heartbeat_ms).start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stopped.set)
        loop.add_callback(lane.wake)  # input queued before add_handler: its edge is gone
        await stopped.wait()

    asyncio.run(serve())


def run_asyncio(lane: ModuleType, fds: list[int], heartbeat_ms: float) -> None:
    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        lane_start(lane, lambda: loop.call_soon(lane.wake))
        for fd in fds:
            loop.add_reader(fd, lane.wake)

        def tick() -> None:
            lane.tick()
            loop.call_later(heartbeat_ms / 1000, tick)

        loop.call_later(heartbeat_ms / 1000, tick)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        loop.call_soon(lane.wake)
        await stopped.wait()

    asyncio.run(serve())


def run_thread(lane: ModuleType, fds: list[int], heartbeat_ms: float) -> None:
    """The lane in a C thread of its own (zmq_poll, as mdp-lru), a Tornado loop beside it with
    nothing to do but wait for the stop signal: a control plane, not on the request path."""
    from tornado.ioloop import IOLoop  # noqa: PLC0415 (only this loop)

    async def serve() -> None:
        IOLoop.current()  # Tornado's loop on asyncio, as Scale0's node starts it
        stopped = asyncio.Event()
        lane_start(lane, lambda: None)  # `again` is for wake(), which this host never calls
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stopped.set)
        lane.run_thread()
        try:
            await stopped.wait()
        finally:
            lane.stop_thread()

    asyncio.run(serve())


#: filled in by main() before a loop starts: the sockets' handles and the lane's settings
_START: dict[str, Any] = {}


def lane_start(lane: ModuleType, again: Any) -> None:
    lane.start(
        _START["frontend"], _START["backend"], _START["heartbeat_ms"], _START["liveness"], again
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mdp-lru-loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--module-dir", type=Path, required=True, help="where _mdp_lru_loop is")
    parser.add_argument("--loop", choices=("tornado", "asyncio", "thread"), default="tornado")
    parser.add_argument("-i", dest="heartbeat_ms", type=float, default=2500.0)
    parser.add_argument("-l", dest="liveness", type=int, default=3)
    parser.add_argument("frontend")
    parser.add_argument("backend")
    args = parser.parse_args(argv)
    if args.heartbeat_ms <= 0 or args.liveness < 1:
        parser.error("-i must be > 0 and -l >= 1")
    sys.path.insert(0, str(args.module_dir))
    lane = importlib.import_module("_mdp_lru_loop")
    ctx: zmq.Context[Any] = zmq.Context()
    front = bound(ctx, args.frontend, "frontend")
    back = bound(ctx, args.backend, "backend")
    sys.stdout.flush()
    _START.update(
        frontend=front.underlying,
        backend=back.underlying,
        heartbeat_ms=args.heartbeat_ms,
        liveness=args.liveness,
    )
    fds = [int(front.getsockopt(zmq.FD)), int(back.getsockopt(zmq.FD))]
    try:
        {"tornado": run_tornado, "asyncio": run_asyncio, "thread": run_thread}[args.loop](
            lane, fds, args.heartbeat_ms
        )
    finally:
        print(lane.stats(), file=sys.stderr, flush=True)
        lane.close()
        front.close(0)
        back.close(0)
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
