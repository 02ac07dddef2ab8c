"""The core's vocabulary: the events a broker is fed and the effects it asks the I/O layer to do.

The net layer turns socket traffic and timers into events, calls ``Broker.handle(event, now,
wall)`` and performs the effects in order. Nothing here touches a socket or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from scale0.wire.errors import ProtocolError
from scale0.wire.frames import Message


class Channel(Enum):
    """The broker socket a message came in on or goes out of (docs/protocol.md §1)."""

    FRONTEND = "frontend"
    BACKEND = "backend"
    PEER = "peer"

    # Channels are dict keys several times per request; members are singletons, so identity
    # hashing (in C) is as sound as Enum's default (a Python-level hash of the name) and cheaper.
    __hash__ = object.__hash__


# ---- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """A message decoded from ``channel``, sent by the connection ``routing_id``."""

    channel: Channel
    routing_id: bytes
    message: Message


@dataclass(frozen=True, slots=True)
class Malformed:
    """Frames from ``routing_id`` that did not decode; counts towards its error score (§8)."""

    channel: Channel
    routing_id: bytes
    error: ProtocolError


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: fire whatever timers are due (heartbeats, expiry, deadlines)."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The broker is stopping: tell every client and worker DISCONNECT."""


Event = Received | Malformed | Tick | Shutdown


# ---- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to ``routing_id`` on ``channel`` (the net layer encodes it)."""

    channel: Channel
    routing_id: bytes
    message: Message


@dataclass(frozen=True, slots=True)
class Log:
    """A structured log line: ``event`` is a short snake_case name, ``fields`` its details."""

    level: str
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


Effect = Send | Log
