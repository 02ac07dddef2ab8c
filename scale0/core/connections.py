"""A negotiated client or worker connection, as the broker's rooms share it (R1).

Owned by scale0/core/sessions.py; dispatch reads a worker's session (when it was last heard,
its generation) and says when it hears one (:func:`touch`), the family reads it to build the
heartbeat table.
"""

from __future__ import annotations

from dataclasses import dataclass

from scale0.core.effects import Channel
from scale0.core.trust import Allowed

__all__ = ["Session", "touch"]


@dataclass(slots=True, eq=False)
class Session:
    """A negotiated client or worker connection (R1)."""

    routing_id: bytes
    channel: Channel
    client_id: str
    config_version: int
    last_seen: float
    timeout_s: float  # silent this long = gone (liveness x interval)
    gen: int  # tells a live timer entry from one left by an earlier session
    key: str = ""  # its CURVE public key (Z85), "" without CURVE (scale0/core/trust.py)
    allowed: Allowed = "all"  # what the key may call (clients) or serve (workers), T1-T4
    checked: float = float("-inf")  # its last CHECKCONFIG (R21)
    #: The interval its last message promised (HEARTBEAT's ``interval_ms``, idle beating,
    #: docs/protocol.md §3.4) when longer than the negotiated one; 0: the negotiated one.
    promise_ms: int = 0
    #: The sessions of its channel and timeout, in order of last_seen (scale0/core/sessions.py,
    #: the liveness sweep); None: never expired (a worker with ``heartbeat: false``).
    order: dict[bytes, Session] | None = None


def touch(session: Session, now: float) -> None:
    """``session`` was heard ``now``: its last_seen, and its place at the end of its order (the
    core's ``now`` never goes back, so the order is by last_seen)."""
    session.last_seen = now
    order = session.order
    if order is not None:
        routing_id = session.routing_id
        del order[routing_id]
        order[routing_id] = session
