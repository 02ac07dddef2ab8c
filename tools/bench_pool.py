#!/usr/bin/env python3
"""The worker pool's per-request cost: the C Pool (scale0.core._pool) against WorkerPool.

One request, as the hot path does it: take a worker for the service, hold the request's ticket,
release it when the reply comes, list the worker ready again. WorkerPool is driven as the ledger
drives it (``take`` -> a Worker, ``in_flight.add``, ``in_flight.discard``, ``list_ready(worker)``),
the C Pool by routing id. Both in one process, one invocation, interleaved rounds; it prints the
CPU ns per request (best round) and the ratio C / Python, for 4 strict-LRU workers (capacity 1)
and 4 workers of capacity 25 each holding 20 tickets (the LRU queue turns on every request).

    tools/bench_pool.py [--requests N] [--rounds R] [--only c|python|none [--capacity 1|25]]

``--only`` runs one side and one case alone, once, with no timing output, for an instruction
counter: the cost of one request is the slope between two --requests (docs/performance.md gives
the command); ``--only none`` makes the tickets and runs the empty loop, the part to subtract.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale0.core.workers import Worker, WorkerPool

try:
    from scale0.core._pool import Pool
except ImportError:  # not built (no C compiler): only --only python can run
    Pool = None

SERVICE = "echo"
WORKERS = [b"\x00\x80\x00\x00%c" % i for i in range(4)]  # libzmq-style routing ids


def python_loop(capacity: int, held: int, tickets: list[bytes]) -> Callable[[], None]:
    pool = WorkerPool()
    for rid in WORKERS:
        worker = Worker(rid, (SERVICE,), capacity, heartbeat=False, interval_s=0.0)
        pool.add(worker)
        worker.in_flight.update(b"h%d" % i for i in range(held))
        pool.list_ready(worker)

    def run() -> None:
        take, list_ready = pool.take, pool.list_ready
        for ticket in tickets:
            worker = take(SERVICE)
            assert worker is not None
            worker.in_flight.add(ticket)  # Ledger.dispatched
            in_flight = worker.in_flight  # Ledger.answer
            if ticket in in_flight:
                in_flight.discard(ticket)
            list_ready(worker)

    return run


def c_loop(capacity: int, held: int, tickets: list[bytes]) -> Callable[[], None]:
    if Pool is None:
        sys.exit("bench_pool: scale0.core._pool is not built (python setup.py build_ext --inplace)")
    pool = Pool()
    for rid in WORKERS:
        pool.add(rid, (SERVICE,), capacity)
        for i in range(held):
            pool.hold(rid, b"h%d" % i)
        pool.list_ready(rid)

    def run() -> None:
        take, hold, release, list_ready = pool.take, pool.hold, pool.release, pool.list_ready
        for ticket in tickets:
            rid = take(SERVICE)
            assert rid is not None
            hold(rid, ticket)
            release(rid, ticket)
            list_ready(rid)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=["c", "python", "none"])
    parser.add_argument("--capacity", type=int, choices=[1, 25], default=1)
    args = parser.parse_args()
    tickets = [b"%016x" % i for i in range(args.requests)]  # fresh ids, made before timing
    cases = [("capacity 1", 1, 0), ("capacity 25, 20 held", 25, 20)]
    if args.only:
        if args.only == "none":  # the tickets and the loop alone, to subtract
            for _ticket in tickets:
                pass
            return
        make = c_loop if args.only == "c" else python_loop
        for _, capacity, held in cases:
            if capacity == args.capacity:
                make(capacity, held, tickets)()
        return
    for name, capacity, held in cases:
        runs = {
            "python": python_loop(capacity, held, tickets),
            "c": c_loop(capacity, held, tickets),
        }
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.rounds):
            for side, run in runs.items():
                start = time.process_time_ns()
                run()
                best[side] = min(best[side], (time.process_time_ns() - start) / args.requests)
        print(
            f"{name}: WorkerPool {best['python']:.0f} ns/request, C Pool {best['c']:.0f} "
            f"ns/request, C / Python {best['c'] / best['python']:.2f}"
        )


if __name__ == "__main__":
    main()
