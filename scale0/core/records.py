"""What the core reports for the event log: one ``RequestDone`` per request answered here.

Which broker records a request (docs/trend.md "In the broker"): the one that sends its final
answer to the client, or to the peer that forwarded it, so that a request is recorded once in
the family however often it was forwarded:

- a request this broker forwarded to a peer and answered from the peer's FORWARDREPLY (or
  failed while the peer held it) is the peer's to record: nothing here;
- a request forwarded here and answered 404 or 503 goes back to its origin, which routes it
  again (F8) and records it if it fails there: nothing here either.
"""

from __future__ import annotations

from scale0.core.effects import Effect, Log, RequestDone
from scale0.core.requests import Pending

__all__ = ["heartbeat_gap", "refused", "request_done"]

#: A worker silent for more than this many heartbeat intervals, then heard again, had a gap.
GAP_INTERVALS = 2


def request_done(
    out: list[Effect],
    pending: Pending,
    status: int,
    body: tuple[bytes, ...],
    now: float,
) -> None:
    """Append ``pending``'s RequestDone, answered at ``now`` with ``status`` and reply ``body``,
    unless another broker records it (above)."""
    if pending.peer is not None:
        return
    client: bytes | None = pending.client
    forwarded_from = None
    if pending.origin is not None:
        if status in (404, 503):
            return
        forwarded_from = pending.via
        client = None
    out.append(
        RequestDone(
            pending.service,
            pending.worker,
            client,
            forwarded_from,
            pending.started,
            now,
            sum(map(len, pending.body)),
            sum(map(len, body)),
            status,
            pending.attempt,
        )
    )


def refused(
    out: list[Effect], service: str, rid: bytes, body: tuple[bytes, ...], now: float, status: int
) -> None:
    """A client's request answered at once with ``status`` (404: no such service), before it
    became a request the broker holds: reported too, without a worker and with no attempt."""
    out.append(RequestDone(service, None, rid, None, now, now, sum(map(len, body)), 0, status, 0))


def heartbeat_gap(out: list[Effect], rid: bytes, silent_s: float, interval_s: float) -> None:
    """Log ``heartbeat_gap`` when a worker was silent more than GAP_INTERVALS heartbeat
    intervals before this message (and less than its liveness, or it would be gone)."""
    if silent_s > GAP_INTERVALS * interval_s:
        gap_ms = round(silent_s * 1000)
        out.append(Log("info", "heartbeat_gap", {"worker": rid.hex(), "gap_ms": gap_ms}))
