"""Synthetic event logs: days of a family's traffic, deterministic from a seed (tools/gen-events).

What a family of brokers would write (docs/trend.md): requests to many services with a daily
rhythm, per-service latency and failure rates, workers joining, leaving, expiring and
rejoining, heartbeat gaps, one broker's outage (its peers' ``peer_down``/``peer_up``), config
versions applied and one refused, a broker disabled and enabled by a management command, and
task transitions from a coordinator. Optionally corrupt lines (a crash mid-write) and records of
a newer schema version, to exercise the job's handling of bad input. Same seed, same bytes.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from scale0.trend.eventlog import Item, SegmentFiles, encode

MINUTE_MS = 60_000
SERVICE_NAMES = (
    "echo",
    "search",
    "thumbnail",
    "billing",
    "auth",
    "geo",
    "pdf",
    "mail",
    "ocr",
    "upper",
    "quote",
    "inventory",
)
COORDINATOR = "coordinator"
DEFAULT_START_MS = 1_795_000_000_000 - 1_795_000_000_000 % 86_400_000  # 2026-11-18T00:00Z


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int = 1
    start_ms: int = DEFAULT_START_MS
    days: float = 1.0
    rate: float = 20.0  # mean requests per second, family-wide
    brokers: tuple[str, ...] = ("a", "b", "c")
    services: int = 8
    workers_per_broker: int = 4
    outage: bool = True  # the last broker is down for outage_min minutes at 40 % of the span
    outage_min: int = 30
    tasks_per_min: float = 2.0
    corrupt: int = 0  # lines cut short, spread over the files
    newer: int = 0  # records with v = 2
    max_bytes: int = 64 * 1024 * 1024


@dataclass
class Totals:
    """What was written, by kind; plus the bad lines injected."""

    kinds: Counter[str] = field(default_factory=Counter)
    corrupt: int = 0
    newer: int = 0
    files: int = 0

    @property
    def records(self) -> int:
        return sum(self.kinds.values())


class _Family:
    def __init__(self, plan: Plan, rng: random.Random) -> None:
        self.plan = plan
        self.rng = rng
        names = list(SERVICE_NAMES)
        self.services = [
            names[i] if i < len(names) else f"svc{i}" for i in range(max(1, plan.services))
        ]
        # Zipf-like popularity, per-service median latency and failure rate.
        self.service_weights = [1.0 / (i + 1) for i in range(len(self.services))]
        self.median_ms = {s: rng.choice([1.5, 3, 8, 20, 45, 120]) for s in self.services}
        self.fail_p = {s: rng.choice([0.001, 0.005, 0.01, 0.03]) for s in self.services}
        self.up_brokers = set(plan.brokers)
        self.enabled = set(plan.brokers)
        self.workers: dict[str, dict[str, list[str]]] = {}  # broker -> worker -> services
        self.up_workers: dict[str, set[str]] = {b: set() for b in plan.brokers}
        for broker in plan.brokers:
            self.workers[broker] = {}
            for i in range(plan.workers_per_broker):
                k = rng.randint(1, min(3, len(self.services)))
                served = rng.sample(self.services, k)
                if i == 0:
                    served = list(self.services)  # every service has a worker somewhere
                self.workers[broker][f"{broker}-w{i}"] = served


def _schedule(plan: Plan, fam: _Family, rng: random.Random) -> list[tuple[int, int, Item]]:
    """Lifecycle records as (ts_ms, seq, item-with-broker-in-kind) in time order.

    The item's broker rides in a wrapper: (kind, ts_ms, fields) with fields["__broker"]."""
    start = plan.start_ms
    span = int(plan.days * 86_400_000)
    end = start + span
    out: list[tuple[int, int, Item]] = []
    seq = 0

    def add(ts: int, broker: str, kind: str, **fields: object) -> None:
        nonlocal seq
        if start <= ts < end:
            seq += 1
            out.append((ts, seq, (kind, ts, {"__broker": broker, **fields})))

    for n, broker in enumerate(plan.brokers):
        t = start + 100 * n
        add(t, broker, "broker_start")
        add(t + 5, broker, "config_applied", config_version=1, sha256=f"{1:064x}")
        for m, other in enumerate(plan.brokers):
            if other != broker:
                add(t + 1000 + 10 * m, broker, "peer_up", peer=other)
        for i, worker in enumerate(fam.workers[broker]):
            add(
                t + 200 + 37 * i,
                broker,
                "worker_join",
                worker=worker,
                services=fam.workers[broker][worker],
            )
    # Config versions every ~6 hours (3 at least); the second broker refuses version 3.
    version = 1
    every = min(6 * 3_600_000, span // 4)
    ts = start + every
    while ts < end:
        version += 1
        for n, broker in enumerate(plan.brokers):
            if version == 3 and n == 1:
                add(
                    ts + 40 * n,
                    broker,
                    "config_refused",
                    config_version=version,
                    sha256=f"{version:064x}",
                    reason="signature does not verify",
                )
            else:
                add(
                    ts + 40 * n,
                    broker,
                    "config_applied",
                    config_version=version,
                    sha256=f"{version:064x}",
                )
        ts += every + rng.randint(-every // 20, every // 20)
    # Worker churn: each worker leaves and rejoins a few times; some expire (silence first).
    for broker in plan.brokers:
        for worker, served in fam.workers[broker].items():
            for _ in range(max(1, int(plan.days * 3))):
                leave = start + rng.randint(3_600_000, max(3_600_001, span - 60_000))
                expired = rng.random() < 0.5
                back = leave + rng.randint(20_000, 1_800_000)
                if expired:
                    add(leave, broker, "worker_leave", worker=worker, reason="expired", gap_ms=3000)
                else:
                    add(leave, broker, "worker_leave", worker=worker, reason="disconnect")
                add(back, broker, "worker_join", worker=worker, services=served)
            for _ in range(max(1, int(plan.days * 4))):
                gap_at = start + rng.randint(600_000, max(600_001, span - 1000))
                add(gap_at, broker, "heartbeat_gap", worker=worker, gap_ms=rng.randint(2500, 9000))
    # One broker disabled for ten minutes by a management command, then enabled.
    first = plan.brokers[0]
    when = start + span // 4
    add(when, first, "mgmt_command", user="admin", command="disable", result="ok")
    add(
        when + 1, first, "state_change", state="disabled", prev_state="enabled", reason="management"
    )
    add(when + 600_000, first, "mgmt_command", user="admin", command="enable", result="ok")
    add(
        when + 600_001,
        first,
        "state_change",
        state="enabled",
        prev_state="disabled",
        reason="management",
    )
    add(when + 700_000, first, "mgmt_command", user="guest", command="disable", result="denied")
    out.sort(key=lambda e: (e[0], e[1]))
    return _resolve(plan, fam, out, start, span)


def _resolve(
    plan: Plan, fam: _Family, events: list[tuple[int, int, Item]], start: int, span: int
) -> list[tuple[int, int, Item]]:
    """Add the outage, then drop lifecycle records that contradict the state: a join of a
    worker already up, a leave of one already down, a gap overlapping the previous record, and
    everything the dead broker would have written."""
    victim = plan.brokers[-1] if plan.outage and len(plan.brokers) > 1 else None
    down_at = start + int(span * 0.4)
    up_at = down_at + plan.outage_min * MINUTE_MS
    extra: list[tuple[int, int, Item]] = []
    if victim is not None:
        seq = 10**9

        def add(ts: int, broker: str, kind: str, **fields: object) -> None:
            nonlocal seq
            seq += 1
            if start <= ts < start + span:
                extra.append(
                    (ts, seq, (kind, ts, {"__broker": broker, "__outage": True, **fields}))
                )

        # The victim is SIGKILLed: it writes nothing until it restarts; its peers notice.
        others = [b for b in plan.brokers if b != victim]
        for n, broker in enumerate(others):
            add(
                down_at + 3000 + 50 * n,
                broker,
                "peer_down",
                peer=victim,
                gap_ms=3000,
                reason="heartbeats stopped",
            )
        add(up_at, victim, "broker_start")
        for n, broker in enumerate(others):
            add(up_at + 1000 + 50 * n, broker, "peer_up", peer=victim)
        for i, worker in enumerate(fam.workers[victim]):
            add(
                up_at + 500 + 37 * i,
                victim,
                "worker_join",
                worker=worker,
                services=fam.workers[victim][worker],
            )
    merged = sorted(events + extra, key=lambda e: (e[0], e[1]))
    out: list[tuple[int, int, Item]] = []
    up: dict[tuple[str, str], bool] = {}
    last: dict[tuple[str, str], int] = {}
    for ts, s, item in merged:
        kind, _, fields = item
        assert isinstance(fields, dict)  # built above, not input
        broker = str(fields["__broker"])
        if (
            victim is not None
            and broker == victim
            and down_at <= ts < up_at + 1000
            and not fields.get("__outage")
        ):
            continue  # the victim is dead: no records
        if kind in ("worker_join", "worker_leave", "heartbeat_gap"):
            key = (broker, str(fields["worker"]))
            now_up = up.get(key, False)
            if kind == "worker_join" and now_up and not fields.get("__outage"):
                continue
            if kind == "worker_leave" and not now_up:
                continue
            if kind == "heartbeat_gap":
                gap = fields["gap_ms"]
                assert isinstance(gap, int)
                if not now_up or ts - gap <= last.get(key, 0):
                    continue
            up[key] = kind != "worker_leave"
            last[key] = ts
        fields.pop("__outage", None)
        out.append((ts, s, item))
    return out


def _diurnal(ts_ms: int) -> float:
    """Traffic through the day: a trough at 04:00 UTC, a peak at 16:00, between 0.3 and 1.7."""
    hour = (ts_ms % 86_400_000) / 3_600_000
    return 1.0 - 0.7 * math.cos((hour - 4.0) / 24.0 * 2 * math.pi)


def generate(out_dir: str | Path, plan: Plan) -> Totals:
    """Write the plan's logs under ``out_dir`` (the layout of docs/trend.md)."""
    rng = random.Random(plan.seed)  # noqa: S311 (synthetic data, reproducible on purpose)
    fam = _Family(plan, rng)
    lifecycle = _schedule(plan, fam, rng)
    now_ms = [plan.start_ms]
    writers = {
        b: SegmentFiles(
            out_dir,
            b,
            max_bytes=plan.max_bytes,
            fsync=False,
            clock=lambda: now_ms[0] / 1000,  # file names carry the records' time, not ours
            max_age_s=3600.0,
            tag="gen",
        )
        for b in (*plan.brokers, COORDINATOR)
    }
    totals = Totals()
    start = plan.start_ms
    span = int(plan.days * 86_400_000)
    minutes = span // MINUTE_MS
    services, weights = fam.services, list(fam.service_weights)
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)
    pos = 0
    victim = plan.brokers[-1] if plan.outage and len(plan.brokers) > 1 else None
    task_heap: list[tuple[int, int, str, str]] = []
    task_seq = 0

    def write(broker: str, item: Item) -> None:
        now_ms[0] = item[1]
        files = writers[broker]
        files.rotate_if_old()
        files.write(item[1], encode(broker, item))
        totals.kinds[item[0]] += 1

    for minute in range(minutes):
        m0 = start + minute * MINUTE_MS
        mu = plan.rate * 60 * _diurnal(m0)
        n = max(0, round(rng.gauss(mu, math.sqrt(mu)))) if mu > 0 else 0
        times = sorted(m0 + rng.randrange(MINUTE_MS) for _ in range(n))
        # Tasks: queued now, running after a wait, then done or failed.
        for _ in range(int(plan.tasks_per_min) + (rng.random() < plan.tasks_per_min % 1)):
            task_seq += 1
            tid = f"t{task_seq:07d}"
            q = m0 + rng.randrange(MINUTE_MS)
            r = q + int(rng.expovariate(1 / 4000)) + 1
            d = r + int(rng.expovariate(1 / 20000)) + 1
            heapq.heappush(task_heap, (q, task_seq * 3, tid, "queued"))
            heapq.heappush(task_heap, (r, task_seq * 3 + 1, tid, "running"))
            heapq.heappush(
                task_heap, (d, task_seq * 3 + 2, tid, "failed" if rng.random() < 0.05 else "done")
            )
        end = m0 + MINUTE_MS
        for ts in times:
            while pos < len(lifecycle) and lifecycle[pos][0] <= ts:
                _apply(fam, lifecycle[pos][2], victim)
                item = lifecycle[pos][2]
                fields = dict(item[2])  # type: ignore[arg-type]
                broker = str(fields.pop("__broker"))
                write(broker, (item[0], item[1], fields))
                pos += 1
            _request(fam, rng, ts, services, cum, write)
        while pos < len(lifecycle) and lifecycle[pos][0] < end:
            _apply(fam, lifecycle[pos][2], victim)
            item = lifecycle[pos][2]
            fields = dict(item[2])  # type: ignore[arg-type]
            broker = str(fields.pop("__broker"))
            write(broker, (item[0], item[1], fields))
            pos += 1
        prev_state = {"queued": "new", "running": "queued"}
        while task_heap and task_heap[0][0] < end:
            ts, _, tid, state = heapq.heappop(task_heap)
            write(
                COORDINATOR,
                (
                    "task",
                    ts,
                    {
                        "task_id": tid,
                        "state": state,
                        "prev_state": prev_state.get(state, "running"),
                    },
                ),
            )
    _bad_lines(plan, rng, writers, totals)
    for files in writers.values():
        files.close()
        totals.files += len(files.closed_files)
    return totals


def _apply(fam: _Family, item: Item, victim: str | None) -> None:
    """Follow the lifecycle so requests go only where a worker and its broker are up."""
    kind, _, fields = item
    assert isinstance(fields, dict)
    broker = str(fields["__broker"])
    if kind == "worker_join":
        fam.up_workers[broker].add(str(fields["worker"]))
    elif kind == "worker_leave":
        fam.up_workers[broker].discard(str(fields["worker"]))
    elif kind == "peer_down" and fields.get("peer") == victim:
        fam.up_brokers.discard(str(victim))
        fam.up_workers[str(victim)].clear()
    elif kind == "broker_start":
        fam.up_brokers.add(broker)
    elif kind == "state_change":
        if fields.get("state") == "disabled":
            fam.enabled.discard(broker)
        else:
            fam.enabled.add(broker)


def _request(
    fam: _Family,
    rng: random.Random,
    ts: int,
    services: Sequence[str],
    cum: Sequence[float],
    write: object,
) -> None:
    service = services[bisect.bisect_left(cum, rng.random() * cum[-1])]
    entry = rng.choice(fam.plan.brokers)
    if entry not in fam.up_brokers or entry not in fam.enabled:
        live = [b for b in fam.plan.brokers if b in fam.up_brokers and b in fam.enabled]
        if not live:
            return
        entry = rng.choice(live)
    # Served by a local worker if one is up, else forwarded to a peer that has one.
    serving, forwarded_from = entry, None
    local = [w for w in fam.up_workers[entry] if service in fam.workers[entry][w]]
    if not local:
        for peer in fam.plan.brokers:
            if peer != entry and peer in fam.up_brokers:
                cands = [w for w in fam.up_workers[peer] if service in fam.workers[peer][w]]
                if cands:
                    serving, forwarded_from, local = peer, entry, cands
                    break
    latency = fam.median_ms[service] * math.exp(rng.gauss(0.0, 0.6))
    bytes_in = int(rng.expovariate(1 / 400)) + 1
    attempts = 1
    worker: str | None
    if not local:
        status, worker, bytes_out, latency = 503, None, 0, rng.uniform(0.05, 0.3)
    else:
        worker = sorted(local)[rng.randrange(len(local))]
        r = rng.random()
        fail = fam.fail_p[service]
        if r < fail:
            status, bytes_out = 500, 40
        elif r < fail + 0.001:
            status, bytes_out, attempts = 504, 0, 2
            latency += 3000.0
        else:
            status, bytes_out = 200, int(rng.expovariate(1 / 2000)) + 1
    latency = round(latency, 3)
    received = ts - int(latency)
    client = f"{rng.randrange(64):04x}"
    assert callable(write)
    write(
        serving,
        (
            "request",
            ts,
            (
                service,
                worker,
                client,
                forwarded_from,
                received,
                latency,
                bytes_in,
                bytes_out,
                status,
                attempts,
            ),
        ),
    )


def _bad_lines(
    plan: Plan, rng: random.Random, writers: dict[str, SegmentFiles], totals: Totals
) -> None:
    """Append corrupt lines (records cut short) and newer-version records to the open files."""
    brokers = list(plan.brokers)
    ts = plan.start_ms + int(plan.days * 86_400_000) - 1
    for i in range(plan.corrupt):
        broker = brokers[i % len(brokers)]
        line = json.dumps(
            {
                "v": 1,
                "ts_ms": ts,
                "kind": "request",
                "broker": broker,
                "service": "echo",
                "latency_ms": 1.0,
            }
        )
        writers[broker].write(ts, line[: rng.randint(5, len(line) - 2)])
        totals.corrupt += 1
    for i in range(plan.newer):
        broker = brokers[i % len(brokers)]
        line = json.dumps(
            {
                "v": 2,
                "ts_ms": ts,
                "kind": "request",
                "broker": broker,
                "service": "echo",
                "latency_ms": "1.5ms",
                "region": "eu",
            }
        )
        writers[broker].write(ts, line)
        totals.newer += 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/gen-events", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="event log directory to fill")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=20.0, help="mean requests/s, family-wide")
    parser.add_argument(
        "--events", type=int, help="aim at this many records in all (sets --rate from --days)"
    )
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--services", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4, help="workers per broker")
    parser.add_argument("--no-outage", action="store_true")
    parser.add_argument("--tasks-per-min", type=float, default=2.0)
    parser.add_argument("--corrupt", type=int, default=0, help="lines cut short to inject")
    parser.add_argument("--newer", type=int, default=0, help="schema version 2 records to inject")
    parser.add_argument("--start-date", help="first UTC day, YYYY-MM-DD (default 2026-11-18)")
    args = parser.parse_args(argv)
    if args.days <= 0 or args.brokers < 1 or args.services < 1 or args.workers < 1:
        parser.error("--days, --brokers, --services and --workers must be positive")
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out}: not empty (the generator never overwrites logs)")
    rate = args.rate
    if args.events is not None:
        rate = max(0.001, args.events / (args.days * 86_400))
    start_ms = DEFAULT_START_MS
    if args.start_date:
        try:
            day = datetime.strptime(args.start_date, "%Y-%m-%d").replace(tzinfo=UTC)
        except ValueError:
            parser.error(f"--start-date {args.start_date!r}: not YYYY-MM-DD")
        start_ms = int(day.timestamp() * 1000)
    plan = Plan(
        seed=args.seed,
        start_ms=start_ms,
        days=args.days,
        rate=rate,
        brokers=tuple(
            "abcdefghijklmnopqrstuvwxyz"[i] if i < 26 else f"b{i}" for i in range(args.brokers)
        ),
        services=args.services,
        workers_per_broker=args.workers,
        outage=not args.no_outage,
        tasks_per_min=args.tasks_per_min,
        corrupt=args.corrupt,
        newer=args.newer,
    )
    totals = generate(args.out, plan)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(totals.kinds.items()))
    print(
        f"wrote {totals.records} records ({kinds})"
        f", {totals.corrupt} corrupt and {totals.newer} newer-version lines, in {totals.files} "
        f"files under {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
