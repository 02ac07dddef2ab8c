"""Prometheus text exposition (format 0.0.4) of a broker's ``status`` result: ``/metrics``.

Rendering from ``status`` keeps one source for both: the management command and the scrape
show the same counters. Names follow Prometheus conventions (``_total`` counters, seconds).
:class:`MetricsWriter` is the exposition itself, shared with the task coordinator's
``/metrics`` (scale0/mgmt/taskpage.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MetricsWriter", "render_metrics"]

_STATES = ("joining", "active", "disabled")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
    return "{" + inner + "}"


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return "0"


class MetricsWriter:
    """Families of samples in exposition format; ``labels`` go on every sample."""

    def __init__(self, labels: Mapping[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.labels = dict(labels or {})

    def family(
        self, name: str, kind: str, text: str, samples: Iterable[tuple[dict[str, str], Any]]
    ) -> None:
        self.lines.append(f"# HELP {name} {text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.sample(name, labels, value)

    def sample(self, name: str, labels: dict[str, str], value: Any) -> None:
        self.lines.append(f"{name}{_labels({**self.labels, **labels})} {_number(value)}")

    def text(self) -> str:
        """The exposition: every line, ending in a newline."""
        return "\n".join(self.lines) + "\n"


def render_metrics(status: Mapping[str, Any]) -> str:
    """The exposition text for one broker's ``status`` result (see docs/management.md)."""
    w = MetricsWriter({"broker": str(status.get("broker", ""))})
    counters: Mapping[str, Any] = status.get("counters", {})
    services: list[Mapping[str, Any]] = list(status.get("services", []))
    state = status.get("state")
    w.family(
        "scale0_broker_state",
        "gauge",
        "1 for the broker's current state (joining, active, disabled).",
        (({"state": s}, int(s == state)) for s in _STATES),
    )
    w.family(
        "scale0_config_version",
        "gauge",
        "Version of the network config the broker runs.",
        [({}, status.get("config_version", 0))],
    )
    w.family(
        "scale0_uptime_seconds",
        "gauge",
        "Seconds since the broker started.",
        [({}, status.get("uptime_s", 0.0))],
    )
    w.family(
        "scale0_requests_total",
        "counter",
        "Requests taken on: from clients and forwarded by peers (docs/management.md).",
        [({}, status.get("requests", 0))],
    )
    w.family(
        "scale0_replies_total",
        "counter",
        "Final answers to clients, by status (worker replies and the broker's own errors).",
        (({"status": code}, n) for code, n in status.get("replies_by_status", {}).items()),
    )
    w.family(
        "scale0_service_replies_total",
        "counter",
        "Final answers to requests of a service, by status.",
        (
            ({"service": str(s["service"]), "status": code}, n)
            for s in services
            for code, n in s.get("replies", {}).items()
        ),
    )
    bounds = [float(b) for b in status.get("latency_buckets_s", [])]
    name = "scale0_request_latency_seconds"
    w.lines.append(f"# HELP {name} Time from a request's arrival to its final answer, per service.")
    w.lines.append(f"# TYPE {name} histogram")
    for s in services:
        service = str(s["service"])
        cumulative = list(s.get("latency_buckets", []))
        if len(cumulative) != len(bounds) + 1:
            continue
        for bound, count in zip(bounds, cumulative, strict=False):
            w.sample(f"{name}_bucket", {"service": service, "le": _number(bound)}, count)
        w.sample(f"{name}_bucket", {"service": service, "le": "+Inf"}, cumulative[-1])
        w.sample(f"{name}_sum", {"service": service}, float(s.get("latency_sum_s", 0.0)))
        w.sample(f"{name}_count", {"service": service}, s.get("latency_count", 0))
    for metric, key, text in (
        ("scale0_service_workers", "workers", "Workers offering the service."),
        ("scale0_service_workers_ready", "ready", "Workers with spare capacity for it."),
        ("scale0_service_workers_busy", "busy", "Workers running at least one request."),
        ("scale0_queue_depth", "queued", "Requests waiting for a worker of the service."),
    ):
        w.family(
            metric, "gauge", text, (({"service": str(s["service"])}, s[key]) for s in services)
        )
    for metric, key, text in (
        ("scale0_clients", "clients", "Client sessions."),
        ("scale0_workers", "workers", "Connected workers."),
        ("scale0_in_flight", "in_flight", "Requests at a worker now."),
        ("scale0_banned_senders", "banned_senders", "Senders on error_clients now."),
        ("scale0_connections", "connections", "Frontend and backend connections open now."),
        (
            "scale0_unnegotiated_connections",
            "unnegotiated",
            "Of them, not negotiated yet (hung up past negotiate_timeout_ms or max_unnegotiated).",
        ),
        ("scale0_peers", "peers", "Other brokers of the family (from the network config)."),
        ("scale0_peers_up", "peers_up", "Other brokers heard from within liveness intervals."),
    ):
        w.family(metric, "gauge", text, [({}, status.get(key, 0))])
    w.family(
        "scale0_dropped_messages_total",
        "counter",
        "Messages dropped: unroutable (unknown ticket, unsupported), from banned senders, "
        "or not sent (peer gone, high-water mark).",
        [
            ({"reason": "unroutable"}, counters.get("dropped", 0)),
            ({"reason": "banned"}, counters.get("net_banned_dropped", 0)),
            ({"reason": "send_failed"}, counters.get("net_send_dropped", 0)),
        ],
    )
    w.family(
        "scale0_malformed_messages_total",
        "counter",
        "Messages that failed to decode (400/501).",
        [({}, counters.get("malformed", 0))],
    )
    w.family(
        "scale0_bans_total", "counter", "Senders banned so far.", [({}, counters.get("banned", 0))]
    )
    w.family(
        "scale0_worker_losses_total",
        "counter",
        "Workers lost (silent or disconnected).",
        [({}, counters.get("workers_lost", 0))],
    )
    event_log: Mapping[str, Any] | None = status.get("event_log")
    if event_log is not None:  # only while the broker writes an event log (docs/trend.md)
        w.family(
            "scale0_event_log_records_total",
            "counter",
            "Event log records: written to disk, dropped (buffer full) or lost to a failed write.",
            [
                ({"outcome": "written"}, event_log.get("written", 0)),
                ({"outcome": "dropped"}, event_log.get("dropped", 0)),
                ({"outcome": "write_failed"}, event_log.get("write_failed", 0)),
            ],
        )
        w.family(
            "scale0_event_log_queued",
            "gauge",
            "Event log records waiting for the writer thread.",
            [({}, event_log.get("queued", 0))],
        )
    lane: Mapping[str, Any] | None = status.get("lane")
    if lane is not None:  # only while the C lane runs (lane: true, docs/architecture.md)
        w.family(
            "scale0_lane_messages_total",
            "counter",
            "Messages through the C lane: HEARTBEATs it took, its answers, messages it passed "
            "to the loop, the loop's it sent, and those refused or lost.",
            [
                ({"outcome": outcome}, lane.get(key, 0))
                for outcome, key in (
                    ("taken", "beats"),
                    ("answered", "answers"),
                    ("passed", "passed"),
                    ("sent", "sent"),
                    ("send_dropped", "send_dropped"),
                    ("lost", "lost"),
                )
            ],
        )
        w.family(
            "scale0_lane_requests_total",
            "counter",
            "S0P and Majordomo requests the C lane took (dispatched or queued), answered, "
            "queued, and handed to the loop (a PARTIAL, a lost worker, a deadline, a resend, a "
            "change of state).",
            [
                ({"outcome": outcome}, lane.get(key, 0))
                for outcome, key in (
                    ("taken", "requests"),
                    ("answered", "replies"),
                    ("queued", "queued"),
                    ("handed", "handed"),
                )
            ],
        )
        w.family(
            "scale0_lane_forwards_total",
            "counter",
            "Peers' FORWARDs the C lane took and dispatched (counted in "
            "scale0_lane_requests_total's taken too).",
            [({}, lane.get("forwards", 0))],
        )
        w.family(
            "scale0_lane_forwarded_total",
            "counter",
            "Clients' requests the C lane forwarded to peers itself (counted in "
            "scale0_lane_requests_total's taken too).",
            [({}, lane.get("forwarded", 0))],
        )
        w.family(
            "scale0_lane_waiting",
            "gauge",
            "Requests waiting in the C lane's queue for a worker.",
            [({}, lane.get("waiting", 0))],
        )
        w.family(
            "scale0_lane_stalled_total",
            "counter",
            "Times the lane found its pipe to the loop full (it stopped reading that socket).",
            [({}, lane.get("stalled", 0))],
        )
    return w.text()
