#!/usr/bin/env python3
"""The broker's main-thread Python per S0P request at capacity 25, in-process: no loop, no I/O.

A profile aid beside ``tools/bench`` (which times whole processes on real sockets). It starts a
real ``BrokerNode`` (its sockets bound on 127.0.0.1, never read), negotiates one client and 4
workers of capacity 25, then hands the node's own batch handler (``_drain_hot``, what a
wake-up runs for each port) batches of raw frames as ``recv_batch`` gives them: 100 plain
REQUESTs with fresh request ids, then the 100 REPLYs to the REQUESTs the node queued for the
workers. The outbox (what ``_flush`` would send) is emptied without sending. So it times what
the capacity-25 broker's main thread runs in Python per request: the fast-path readers, the
core, the effects and their encoding; not libzmq's receive and send. It prints the CPU µs per
request (best of 5 runs).

    tools/bench_node_core.py [--requests N] [--tree DIR ...] [--profile]

Each ``--tree`` (a source tree holding scale0/, e.g. ``git archive HEAD~1 scale0 | tar -x -C
DIR``) runs in a process of its own, interleaved with the others over 3 rounds, so a change is
timed against its own "before" in one invocation; without ``--tree``, the tree this file is in.
``--profile`` runs this tree once under cProfile and prints the top functions instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools._trees import time_trees, trees_of

_ONE = r"""
import asyncio, sys, time
from scale0.config.model import BrokerConfig, BrokerEntry, NetworkConfig
from scale0.core.effects import Channel
from scale0.cli.broker import tune_gc
from scale0.net.node import BrokerNode
from scale0.wire.client import CheckConfig
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.registry import encode
from scale0.wire.worker import Ready

WINDOW, WORKERS, CAPACITY = 100, 4, 25
entry = BrokerEntry(identity="b1", frontend="tcp://127.0.0.1:7001",
    backend="tcp://127.0.0.1:7002", peer="tcp://127.0.0.1:7003",
    config_pub="tcp://127.0.0.1:7004", config_source=True)
network = NetworkConfig(family="bench", config_version=1, brokers=(entry,))
config = BrokerConfig(identity="b1", frontend_port=0, backend_port=0, peer_port=0,
    config_pub_port=0, state="active", config_source=True, network_config="n.yaml",
    signing_key="s.key", trusted_keys=("s.pub",), bind_address="127.0.0.1")
body, answer = b"x" * 100, b"y" * 100


def main(n, profile):
    node = BrokerNode(config, network, signature=None)
    node.start()
    front, back = node._ports["frontend"], node._ports["backend"]
    # the batch handler a wake-up runs for each port (_drain_beats before this tool's branch)
    drain = getattr(node, "_drain_hot", None) or node._drain_beats
    wall = time.time()

    def feed(port, channel, sig, batch):
        drain(port, channel, sig, batch, [-1] * len(batch), time.monotonic(), wall)
        out = node._outbox
        node._outbox = []
        return out

    client = b"\x00client"
    feed(front, Channel.FRONTEND, SIG_CLIENT,
         [[client, *encode(CheckConfig(ConfigType.JSON, 1, protocol=SIG_CLIENT))]])
    workers = [b"\x00W%d" % i for i in range(WORKERS)]
    for w in workers:
        feed(back, Channel.BACKEND, SIG_WORKER,
             [[w, *encode(CheckConfig(ConfigType.JSON, 1, protocol=SIG_WORKER))]])
        ready = Ready(services=("echo",), heartbeat=True, hbeatinterval_ms=60_000,
                      time=time.time(), config_version=1, capacity=CAPACITY)
        feed(back, Channel.BACKEND, SIG_WORKER, [[w, *encode(ready)]])
    seq = [0]

    def run(count):
        answered = 0
        for _ in range(count // WINDOW):
            batch = []
            for _ in range(WINDOW):
                seq[0] += 1
                batch.append([client, b"", SIG_CLIENT, b"REQUEST", b"echo", b"%d" % seq[0], body])
            sent = feed(front, Channel.FRONTEND, SIG_CLIENT, batch)
            # (io, worker, [empty, S0W1, REQUEST, ticket, service, body...])
            replies = [[w, b"", SIG_WORKER, b"REPLY", f[3], b"200", answer]
                       for _, w, f in sent if f[2] == b"REQUEST"]
            answered += len(feed(back, Channel.BACKEND, SIG_WORKER, replies))
        if answered < count:
            sys.exit(f"only {answered} of {count} requests answered")

    run(2000)
    tune_gc()  # as scale0-broker does before it serves
    if profile:
        import cProfile, pstats
        cProfile.runctx("run(n)", globals(), {"run": run, "n": n}, "/tmp/bench_node_core.prof")
        pstats.Stats("/tmp/bench_node_core.prof").sort_stats("tottime").print_stats(25)
        return
    best = min(
        (lambda t: (run(n), time.process_time() - t)[1])(time.process_time()) for _ in range(5)
    )
    print(f"{best / n * 1e6:.2f}")


async def amain():
    main(int(sys.argv[1]), len(sys.argv) > 2)

asyncio.run(amain())
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per timed run")
    parser.add_argument("--tree", action="append", default=[], help="a source tree (repeatable)")
    parser.add_argument("--profile", action="store_true", help="cProfile this tree once")
    args = parser.parse_args(argv)
    if args.profile:
        sys.argv = [sys.argv[0], str(args.requests), "profile"]
        exec(compile(_ONE, "bench_node_core", "exec"), {"__name__": "bench"})  # noqa: S102
        return
    trees = trees_of(parser, args.tree)
    results = time_trees(_ONE, str(args.requests), trees, 600)
    for tree, runs in results.items():
        print(f"{tree}: µs CPU per request, rounds 1-3: {' / '.join(runs)}")
    print(f"({time.strftime('%H:%M:%S')}; each: best of 5 x {args.requests} requests)")


if __name__ == "__main__":
    main()
