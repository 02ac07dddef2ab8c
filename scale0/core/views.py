"""Views: what management (``status``, ``list_*``, /metrics) and tests read of a broker.

Read-only: nothing here changes the broker. Each function takes the broker's rooms it reads.
"""

from __future__ import annotations

from typing import Protocol

from scale0.core.context import Core
from scale0.core.metrics import LATENCY_BUCKETS_S, Histogram
from scale0.core.ports import FamilyPort, GuardPort, LedgerPort, SessionsPort
from scale0.wire.frames import JsonValue

__all__ = [
    "Viewed",
    "client_table",
    "service_table",
    "services",
    "stats",
    "status",
    "worker_table",
]


class Viewed(Protocol):
    """What the views read of a broker: scale0.core.broker.Broker is one."""

    @property
    def core(self) -> Core: ...

    @property
    def sessions(self) -> SessionsPort: ...

    @property
    def ledger(self) -> LedgerPort: ...

    @property
    def guard(self) -> GuardPort: ...

    @property
    def family(self) -> FamilyPort: ...

    @property
    def io_counters(self) -> dict[str, int]: ...

    @property
    def config_source(self) -> bool: ...

    def config_view(self) -> dict[str, JsonValue]: ...


def stats(broker: Viewed) -> dict[str, int]:
    """The counters with the sizes of what the broker holds."""
    ledger = broker.ledger
    return {
        **broker.core.counters,
        "clients": len(broker.sessions.clients),
        "workers": ledger.worker_count(),
        "in_flight": ledger.in_flight_count(),
        "queued": ledger.waiting_total(),
        "reply_cache": ledger.cached_count(),
        "banned_senders": len(broker.guard.banned),
        "connections": len(broker.guard.conns),  # frontend, backend and peer, as monitors say
        "unnegotiated": len(broker.guard.unnegotiated),  # frontend and backend not negotiated (R20)
        "unnegotiated_peers": len(broker.guard.unnegotiated_peers),  # peer port, no HELLO (R22)
        "timers": len(broker.core.timers),
    }


def services(broker: Viewed) -> dict[str, dict[str, int]]:
    """Per service: workers offering it, ready workers, requests waiting."""
    ledger = broker.ledger
    names = set(ledger.offered()) | ledger.waiting_services()
    return {
        s: {
            "workers": ledger.workers_of(s),
            "ready": ledger.ready_count(s),
            "queued": ledger.waiting_count(s),
        }
        for s in sorted(names)
    }


def service_table(broker: Viewed) -> list[JsonValue]:
    """Per service: workers, ready and busy workers, queue depth, answers and latency."""
    ledger = broker.ledger
    workers = ledger.workers()
    metrics = broker.core.metrics
    names = set(ledger.offered()) | ledger.waiting_services() | set(metrics.services)
    rows: list[JsonValue] = []
    for name in sorted(names):
        offering = [w for w in workers if name in w.services]
        stats = metrics.services.get(name)
        latency = stats.latency if stats is not None else None
        rows.append(
            {
                "service": name,
                "workers": len(offering),
                "ready": ledger.ready_count(name),
                "busy": sum(1 for w in offering if ledger.used(w)),
                "queued": ledger.waiting_count(name),
                "replies": {str(k): v for k, v in sorted(stats.replies.items())}
                if stats is not None
                else {},
                "latency_count": latency.count if latency is not None else 0,
                "latency_sum_s": latency.sum_s if latency is not None else 0.0,
                "latency_p50_s": latency.quantile(0.5) if latency is not None else None,
                "latency_p95_s": latency.quantile(0.95) if latency is not None else None,
                # cumulative counts per bound of status' latency_buckets_s, +Inf last
                "latency_buckets": list(
                    latency.cumulative() if latency is not None else Histogram().cumulative()
                ),
            }
        )
    return rows


def client_table(broker: Viewed, now: float) -> list[JsonValue]:
    """The client sessions: id, connection, how long silent, requests waiting or running."""
    open_requests = broker.ledger.open_by_connection()
    clients = sorted(broker.sessions.clients.values(), key=lambda s: s.client_id)
    return [
        {
            "client_id": s.client_id,
            "routing_id": s.routing_id.hex(),
            "config_version": s.config_version,
            "idle_s": round(now - s.last_seen, 3),
            "requests": open_requests.get(s.routing_id, 0),
            "promise_ms": s.promise_ms,  # idle beating's promise (§3.4); 0: the interval
        }
        for s in clients
    ]


def worker_table(broker: Viewed, now: float) -> list[JsonValue]:
    """The READY workers: id, services, capacity, requests running, heartbeat, silence."""
    sessions = broker.sessions.workers
    ledger = broker.ledger
    rows: list[dict[str, JsonValue]] = []
    for worker in ledger.workers():
        routing_id = worker.routing_id
        session = sessions.get(routing_id)
        rows.append(
            {
                "worker_id": session.client_id if session is not None else None,
                "routing_id": routing_id.hex(),
                "services": list(worker.services),
                "capacity": worker.capacity,
                "in_flight": ledger.used(worker),
                "heartbeat": worker.heartbeat,
                "interval_ms": round(worker.interval_s * 1000),
                "idle_s": round(now - session.last_seen, 3) if session is not None else None,
                "promise_ms": session.promise_ms if session is not None else 0,
            }
        )
    rows.sort(key=lambda row: str(row["worker_id"]))
    return list(rows)


def status(broker: Viewed, now: float, wall: float) -> dict[str, JsonValue]:
    """The ``status`` command: state, config, the /metrics counters, services, history."""
    core = broker.core
    counts = stats(broker)
    totals = core.metrics.totals()
    counters: dict[str, JsonValue] = dict(core.counters)
    counters.update({f"net_{k}": v for k, v in broker.io_counters.items()})
    peers = broker.family.peers
    return {
        "broker": core.identity,
        "family": core.network.family,
        "state": core.state.value,
        "config_version": core.network.config_version,
        "sha256": core.sha256,
        "uptime_s": round(now - core.started, 3),
        "time": wall,
        "clients": counts["clients"],
        "workers": counts["workers"],
        "in_flight": counts["in_flight"],
        "queued": counts["queued"],
        "banned_senders": counts["banned_senders"],
        "connections": counts["connections"],
        "unnegotiated": counts["unnegotiated"],
        "unnegotiated_peers": counts["unnegotiated_peers"],
        "requests": core.counters["requests"],
        "replies": int(totals["replies"]),
        "replies_by_status": {str(k): v for k, v in sorted(core.metrics.replies.items())},
        "latency_count": int(totals["latency_count"]),
        "latency_sum_s": totals["latency_sum_s"],
        "latency_buckets_s": list(LATENCY_BUCKETS_S),
        "dropped": core.counters["dropped"]
        + broker.io_counters.get("banned_dropped", 0)
        + broker.io_counters.get("send_dropped", 0),
        "counters": counters,
        "event_log": None if core.event_log is None else {**core.event_log},
        "lane": None if core.lane is None else dict(core.lane()),
        "config_source": broker.config_source,
        "peers": len(peers),
        "peers_up": sum(1 for p in peers.values() if p.status == "up"),
        "config_conflicts": broker.config_view()["conflicts"],
        "services": service_table(broker),
        "history": [dict(sample) for sample in core.metrics.history],
    }
