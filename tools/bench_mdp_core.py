"""The broker core's own cost per Majordomo request, in-process: no sockets, no loop.

A profile aid beside ``tools/bench`` (which times whole processes on real sockets): it feeds
one Broker the fast path's entry points (``handle_mdp_request`` / ``handle_mdp_reply``, the
fields scale0.wire.hot reads) for a majortomo client and 4 MDP/0.2 workers, 100-byte bodies,
and encodes every Send as the node would. It prints the CPU µs per request (best of 5 runs).

    tools/bench_mdp_core.py [--requests N] [--tree DIR ...]

Each ``--tree`` (a source tree holding scale0/, e.g. ``git archive HEAD~1 scale0 | tar -x -C
DIR``) runs in a process of its own, interleaved with the others over 3 rounds, so a change is
timed against its own "before" in one invocation; without ``--tree``, the tree this file is in.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools._trees import time_trees, trees_of

_ONE = r"""
import sys, time
from scale0.config.model import BrokerEntry, NetworkConfig
from scale0.core.broker import Broker
from scale0.core.effects import Channel, Received, Send
from scale0.wire.hot import MAJORTOMO_READING
from scale0.wire.mdp import MDPW02, MdpWorkerReady
from scale0.wire.registry import encode

entry = BrokerEntry(identity="b1", frontend="tcp://127.0.0.1:7001",
    backend="tcp://127.0.0.1:7002", peer="tcp://127.0.0.1:7003",
    config_pub="tcp://127.0.0.1:7004", config_source=True)
network = NetworkConfig(family="bench", config_version=1, brokers=(entry,))
now = 1000.0
broker = Broker("b1", network, state="active", boot_id=b"BOOT", signature=None, now=now)
for i in range(4):
    broker.handle(Received(Channel.BACKEND, b"W%d" % i, MdpWorkerReady("echo", protocol=MDPW02)),
                  now, 1.7e9)
body, answer = (b"x" * 100,), (b"y" * 100,)
held = []
answered = [0]

def perform(out):
    for effect in out:
        if type(effect) is Send:
            frames = encode(effect.message)
            if effect.channel is Channel.BACKEND:
                held.append((effect.routing_id, effect.message.ticket))
            elif frames[-1] == answer[0]:
                answered[0] += 1

def run(n):
    answered[0] = 0
    for _ in range(n):
        perform(broker.handle_mdp_request(b"\x00client", MAJORTOMO_READING, "echo", body, now))
        while len(held) > 2:  # two requests at workers, the others answered
            worker, ticket = held.pop(0)
            perform(broker.handle_mdp_reply(worker, ticket, answer, now))
    if answered[0] < n - 2:
        sys.exit(f"only {answered[0]} of {n} requests answered")

n = int(sys.argv[1])
run(2000)
best = min(
    (lambda t: (run(n), time.process_time() - t)[1])(time.process_time()) for _ in range(5)
)
print(f"{best / n * 1e6:.2f}")
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per timed run")
    parser.add_argument("--tree", action="append", default=[], help="a source tree (repeatable)")
    args = parser.parse_args(argv)
    trees = trees_of(parser, args.tree)
    results = time_trees(_ONE, str(args.requests), trees, 600)
    for tree, runs in results.items():
        print(f"{tree}: µs CPU per request, rounds 1-3: {' / '.join(runs)}")
    print(f"({time.strftime('%H:%M:%S')}; each: best of 5 x {args.requests} requests)")


if __name__ == "__main__":
    main()
