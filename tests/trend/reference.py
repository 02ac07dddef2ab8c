"""The right answers, computed in plain Python from the log files, to check the Spark job against.

Written from docs/trend.md's definitions, not from the job's code: availability here is the
observed span minus the union of down intervals, where the job sums up segments.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = {
    "request", "worker_join", "worker_leave", "heartbeat_gap", "peer_up", "peer_down",
    "broker_start", "broker_stop", "state_change", "config_applied", "config_refused",
    "mgmt_command", "task",
}  # fmt: skip
WORKER = {"worker_join": (1, 2), "heartbeat_gap": (1, 1), "worker_leave": (0, 0)}
BROKER = {
    "broker_start": (1, 2),
    "peer_up": (1, 2),
    "heartbeat_gap": (1, 1),
    "broker_stop": (0, 0),
    "peer_down": (0, 0),
}


@dataclass
class Reference:
    good: list[dict[str, Any]] = field(default_factory=list)
    corrupt: int = 0
    newer: int = 0
    files: int = 0

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [r for r in self.good if r["kind"] == "request"]

    @property
    def end_ms(self) -> int:
        return max(r["ts_ms"] for r in self.good)


def read(directory: Path) -> Reference:
    ref = Reference()
    for path in sorted(directory.rglob("*.jsonl")):
        if path.name.startswith((".", "_")):
            continue
        ref.files += 1
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                ref.corrupt += 1
                continue
            if record.get("v", 0) > 1:
                ref.newer += 1
            elif record.get("kind") in KINDS:
                ref.good.append(record)
    return ref


def grouped(ref: Reference, ms: int) -> dict[tuple[str, int], dict[str, Any]]:
    """(service, bucket start ms) -> requests, errors, bytes, sorted latencies, statuses."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in ref.requests:
        key = (r["service"], r["ts_ms"] // ms * ms)
        g = out.setdefault(
            key,
            {"requests": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0, "lat": [],
             "status": Counter()},
        )  # fmt: skip
        g["requests"] += 1
        g["errors"] += r["status"] >= 400
        g["bytes_in"] += r["bytes_in"]
        g["bytes_out"] += r["bytes_out"]
        g["lat"].append(r["latency_ms"])
        g["status"][r["status"]] += 1
    for g in out.values():
        g["lat"].sort()
    return out


def percentile_bounds(values: list[float], p: float, accuracy: int) -> tuple[float, float]:
    """The values percentile_approx may return: ranks within n/accuracy of the exact rank
    (docs/trend.md), the exact one being the smallest value with at least p*n values <= it."""
    n = len(values)
    slack = math.ceil(n / accuracy)
    rank = max(1, math.ceil(p * n))
    low = max(1, rank - slack)
    high = min(n, rank + slack)
    return values[low - 1], values[high - 1]


def _down_length(events: list[tuple[int, int, int, int | None]], first: int, end: int) -> int:
    """|union of down intervals ∩ [first, end]| for (ts, order, up_after, gap) in order."""
    intervals: list[tuple[int, int]] = []
    up: bool | None = None
    down_since: int | None = None
    for ts, _, up_after, gap in events:
        if gap is not None and up:
            intervals.append((ts - gap, ts))
        if up_after and down_since is not None:
            intervals.append((down_since, ts))
            down_since = None
        if not up_after and down_since is None:
            down_since = ts
        up = bool(up_after)
    if down_since is not None:
        intervals.append((down_since, end))
    total, reach = 0, first
    for a, b in sorted((max(a, first), min(b, end)) for a, b in intervals):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def availability(ref: Reference) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any]]:
    """Workers keyed (broker, worker) and brokers keyed by name: up_ms, observed_ms, share."""
    end = ref.end_ms
    worker_events: dict[tuple[str, str], list[tuple[int, int, int, int | None]]] = defaultdict(list)
    broker_events: dict[str, list[tuple[int, int, int, int | None]]] = defaultdict(list)
    for r in ref.good:
        kind = r["kind"]
        if kind in WORKER and r.get("worker"):
            up, order = WORKER[kind]
            worker_events[(r["broker"], r["worker"])].append(
                (r["ts_ms"], order, up, r.get("gap_ms"))
            )
        if kind in BROKER and (kind != "heartbeat_gap" or r.get("peer")):
            up, order = BROKER[kind]
            subject = (
                r["peer"] if kind in ("peer_up", "peer_down", "heartbeat_gap") else r["broker"]
            )
            broker_events[subject].append((r["ts_ms"], order, up, r.get("gap_ms")))

    def timeline(events: list[tuple[int, int, int, int | None]]) -> dict[str, Any]:
        events.sort(key=lambda e: (e[0], e[1]))
        first = events[0][0]
        observed = end - first
        up_ms = observed - _down_length(events, first, end)
        return {"observed_ms": observed, "up_ms": up_ms, "availability": up_ms / observed}

    workers = {key: timeline(ev) for key, ev in worker_events.items()}
    brokers = {key: timeline(ev) for key, ev in broker_events.items()}
    served = Counter((r["broker"], r["worker"]) for r in ref.requests if r.get("worker"))
    per_broker = Counter()
    for (broker, _), n in served.items():
        per_broker[broker] += n
    for key, n in served.items():
        workers.setdefault(key, {"availability": None})["load_share"] = n / per_broker[key[0]]
    at_broker = Counter(r["broker"] for r in ref.requests)
    total = sum(at_broker.values())
    for broker, n in at_broker.items():
        brokers.setdefault(broker, {"availability": None})["load_share"] = n / total
    return workers, brokers
