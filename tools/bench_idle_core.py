"""The broker's own Python cost of liveness, in-process: no sockets, no loop, no libzmq thread.

A profile aid beside ``tools/bench idle`` (which times a whole broker process on real sockets,
and on this loaded 2-core machine moves with the load): it registers 2 000 clients and 2 000
workers with one Broker, then plays simulated seconds of their HEARTBEATs as raw frames (each
connection every 0.8 s, in 80 groups of 25 + 25 spread over that period, one batch per group,
as ``tools/bench idle``'s drivers send them), a ``Tick`` after each batch, and encodes every Send
once per message object, as the node does. Each tree is fed the way its node reads a batch:
``heartbeat_items`` and ``Broker.handle_heartbeats`` where the tree has them, else
``heartbeat_fields`` and ``handle_heartbeat`` per message. It prints the CPU µs per HEARTBEAT
in or out (best of 3 runs); the network config's defaults (interval 1 s, liveness 3).

    tools/bench_idle_core.py [--seconds S] [--tree DIR ...]

Each ``--tree`` (a source tree holding scale0/) runs in a process of its own, interleaved with
the others over 3 rounds; without ``--tree``, the tree this file is in. The C reader is used
where the tree has it and its extension is built (as the broker would).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools._trees import time_trees, trees_of

_ONE = r"""
import json, sys, time
import zmq  # the C extension finds pyzmq's libzmq
from scale0.config.model import BrokerEntry, NetworkConfig
from scale0.core.broker import Broker
from scale0.core.effects import Channel, Received, Send, Tick
from scale0.wire.client import CheckConfig, Heartbeat
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.registry import encode
from scale0.wire.worker import Ready
from scale0.wire import hot
try:
    from scale0.net.frames_io import heartbeat_items
except ImportError:
    heartbeat_items = None

FRONT, BACK = Channel.FRONTEND, Channel.BACKEND
entry = BrokerEntry(identity="b1", frontend="tcp://127.0.0.1:7001",
    backend="tcp://127.0.0.1:7002", peer="tcp://127.0.0.1:7003",
    config_pub="tcp://127.0.0.1:7004", config_source=True)
network = NetworkConfig(family="bench", config_version=1, brokers=(entry,))
now, wall = 1000.0, 1.7e9
broker = Broker("b1", network, state="active", boot_id=b"BOOT", signature=None, now=now)
N, GROUPS, PERIOD = 2000, 80, 0.8
clients = [b"\x00c%d" % i for i in range(N)]
workers = [b"\x00w%d" % i for i in range(N)]
for rid in clients:
    broker.handle(Received(FRONT, rid, CheckConfig(ConfigType.JSON, 1, protocol=SIG_CLIENT)),
                  now, wall)
for rid in workers:
    broker.handle(Received(BACK, rid, CheckConfig(ConfigType.JSON, 1, protocol=SIG_WORKER)),
                  now, wall)
    ready = Ready(services=("idle",), heartbeat=True, hbeatinterval_ms=1000, time=wall,
                  config_version=1, capacity=1)
    broker.handle(Received(BACK, rid, ready), now, wall)
lean = heartbeat_items is not None and hasattr(broker, "handle_heartbeats")
per = N // GROUPS
last = [None, None]
counted = [0, 0]  # HEARTBEATs in, out

def perform(out):
    for effect in out:
        if type(effect) is Send:
            if effect.message is not last[0]:
                last[0], last[1] = effect.message, encode(effect.message)
            if type(effect.message) is Heartbeat:
                counted[1] += 1

def batch(rids, signature, t):
    options = json.dumps({"time": t, "config_version": 1}).encode()
    return [[rid, b"", signature, b"HEARTBEAT", options] for rid in rids]

def run(seconds):
    global now, wall
    counted[0] = counted[1] = 0
    for step in range(int(seconds / PERIOD * GROUPS)):
        now += PERIOD / GROUPS
        wall += PERIOD / GROUPS
        g = step % GROUPS
        for channel, rids, signature in ((FRONT, clients, SIG_CLIENT),
                                         (BACK, workers, SIG_WORKER)):
            frames = batch(rids[g * per:(g + 1) * per], signature, wall)
            counted[0] += len(frames)
            if lean:
                items = heartbeat_items(frames, signature, 1 << 20)
                perform(broker.handle_heartbeats(channel, items, now, wall))
            else:
                for f in frames:
                    fields = hot.heartbeat_fields(f, signature, 1 << 20)
                    perform(broker.handle_heartbeat(channel, f[0], *fields, now, wall))
        perform(broker.handle(Tick(), now, wall))
    if len(broker.sessions.clients) != N or len(broker.sessions.workers) != N:
        sys.exit("a session was lost: the simulation is wrong")
    return counted[0] + counted[1]

seconds = float(sys.argv[1])
run(2.0)
best = None
for _ in range(3):
    t = time.process_time()
    beats = run(seconds)
    cost = (time.process_time() - t) / beats * 1e6
    best = cost if best is None else min(best, cost)
print(f"{best:.2f} ({'heartbeat_items + handle_heartbeats' if lean else 'one by one'}, "
      f"{beats / seconds:.0f} HEARTBEATs/s)")
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated seconds per run")
    parser.add_argument("--tree", action="append", default=[], help="a source tree (repeatable)")
    args = parser.parse_args(argv)
    trees = trees_of(parser, args.tree)
    results = time_trees(_ONE, str(args.seconds), trees, 900)
    for tree, runs in results.items():
        print(f"{tree}: µs CPU per HEARTBEAT in or out, rounds 1-3: {' / '.join(runs)}")
    print(f"({time.strftime('%H:%M:%S')}; each: best of 3 x {args.seconds:g} simulated s)")


if __name__ == "__main__":
    main()
