"""The core's vocabulary: the events a broker is fed and the effects it asks the I/O layer to do.

The net layer turns socket traffic and timers into events, calls ``Broker.handle(event, now,
wall)`` and performs the effects in order. Nothing here touches a socket or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from scale0.core.replica import Offer
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.configsync import PublishedConfig
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import Message, quick_init


class Channel(Enum):
    """The broker socket a message came in on or goes out of (docs/protocol.md §1)."""

    FRONTEND = "frontend"
    BACKEND = "backend"
    PEER = "peer"  # our peer ROUTER: what other brokers' links send us, and our answers
    LINK = "link"  # our DEALER to one peer (routing_id = its link id), §5
    CONFIG = "config"  # the config SUB socket (§6): undecodable publications arrive here
    #: The HTTP management server (not a socket): one routing id per waiting HTTP request.
    HTTP = "http"

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
    #: The connection it came over (the I/O layer's number for it, -1: not known); see
    #: :class:`Connected` and R20 of scale0/core/broker.py.
    conn: int = -1


@dataclass(frozen=True, slots=True)
class Connected:
    """A new connection on a frontend, backend or peer ROUTER: ``conn`` numbers it while it is open,
    ``address`` is where it comes from (the IP address, ZeroMQ's ``Peer-Address``)."""

    channel: Channel
    conn: int
    address: str


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection ``conn`` of :class:`Connected` ended."""

    channel: Channel
    conn: int


@dataclass(frozen=True, slots=True)
class Malformed:
    """Frames from ``routing_id`` that did not decode; counts towards its error score (§8)."""

    channel: Channel
    routing_id: bytes
    error: ProtocolError
    signature: bytes = b""  # frame 1 as received, if any: a Majordomo sender is answered in MDP
    #: The connection it came over, as in :class:`Received` (-1: not known); on the peer port a
    #: sender that has not said HELLO is scored by that connection's address (R22).
    conn: int = -1


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The connection ``routing_id`` on ``channel`` speaks CURVE with public key ``key`` (Z85),
    as ZAP admitted it; said by the node before that connection's first message is handled
    (docs/operations.md "CURVE"; scale0/core/trust.py judges what the key may do)."""

    channel: Channel
    routing_id: bytes
    key: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: fire whatever timers are due (heartbeats, expiry, deadlines)."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The broker is stopping: tell every client and worker DISCONNECT."""


@dataclass(frozen=True, slots=True)
class Drain:
    """SIGTERM/SIGINT: stop taking work, move clients and workers away as their requests end,
    and say ``Drained`` once nothing is in flight (the node bounds the wait, then Shutdown)."""

    grace_ms: int = 0  # how long the node waits at most (shutdown_grace_ms), for the log


@dataclass(frozen=True, slots=True)
class Start:
    """The sockets are bound: connect the peer links, subscribe, publish (docs/protocol.md §5-6)."""


@dataclass(frozen=True, slots=True)
class ConfigOffered:
    """A network config to judge (§6.3): from the config SUB, the disk, the file, or an admin."""

    offer: Offer
    source: str  # "pub", "disk", "file", "admin": for logs and management


@dataclass(frozen=True, slots=True)
class ManagementSubmit:
    """A management request from a route other than a socket (the HTTP server, §7.1).

    ``sender`` is what the error score and ban count against (the HTTP client's address);
    ``routing_id`` names the waiting request the answer goes to. ``session_ok`` means the
    credentials were checked at login and the session is live: the core skips Authenticate.
    """

    channel: Channel
    routing_id: bytes
    sender: bytes
    request: ManagementRequest
    session_ok: bool


@dataclass(frozen=True, slots=True)
class ManagementCall:
    """The answer to an ``Authenticate`` effect: were the request's credentials right?"""

    channel: Channel
    routing_id: bytes
    sender: bytes
    request: ManagementRequest
    authenticated: bool


@dataclass(frozen=True, slots=True)
class FamilyAnswer:
    """What one other broker answered a fanned-out request; ``reply`` None = no answer in time."""

    identity: str
    reply: ManagementReply | None


@dataclass(frozen=True, slots=True)
class FanOutDone:
    """Every broker of a ``FanOut`` answered, or its time ran out."""

    token: int
    answers: tuple[FamilyAnswer, ...]


@dataclass(frozen=True, slots=True)
class ConfigRead:
    """The answer to ``ReadConfig``: the config source's file, read and signed, or why not."""

    channel: Channel
    routing_id: bytes
    request_id: str
    offer: Offer | None
    error: str | None = None


Event = (
    Received
    | Authenticated
    | Connected
    | Disconnected
    | Malformed
    | Tick
    | Shutdown
    | Drain
    | Start
    | ConfigOffered
    | ManagementSubmit
    | ManagementCall
    | FanOutDone
    | ConfigRead
)


# ---- effects ----------------------------------------------------------------------------------


@quick_init  # built once per request: docs/performance.md
@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to ``routing_id`` on ``channel`` (the net layer encodes it)."""

    channel: Channel
    routing_id: bytes
    message: Message


@dataclass(frozen=True, slots=True)
class Hangup:
    """Close the connection ``conn`` of :class:`Connected` (it did not negotiate in time, R20,
    R22)."""

    channel: Channel
    conn: int


@dataclass(frozen=True, slots=True)
class Log:
    """A structured log line: ``event`` is a short snake_case name, ``fields`` its details."""

    level: str
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Connect:
    """Open (or re-open) our link to a peer: a DEALER connected to ``endpoint`` (§5)."""

    link: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class Close:
    """Close our link to a peer that left the family (or a seed, once we have a config)."""

    link: str


@dataclass(frozen=True, slots=True)
class Subscribe:
    """The config sources to subscribe to, all of them (§6.3 rule 3); replaces the last set."""

    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Publish:
    """Send a config on the config PUB socket (config sources only, §6.1)."""

    config: PublishedConfig


@dataclass(frozen=True, slots=True)
class Persist:
    """Write the running config, atomically, so a restart begins from it (last good config)."""

    document: bytes  # canonical JSON
    sha256: str
    signature: str
    origin: str
    view_signature: str | None = None  # the client view's (§6.2), if the config has one


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Check ``request``'s credentials off the loop thread (scrypt is slow), then feed the core
    ``ManagementCall`` with the same channel, routing id, sender and request (§7.1)."""

    channel: Channel
    routing_id: bytes
    sender: bytes
    request: ManagementRequest


@dataclass(frozen=True, slots=True)
class FanOut:
    """Send ``request`` to each ``(identity, frontend endpoint)`` of ``targets``, wait at most
    ``timeout_s`` for their MANAGEMENTREPs, then feed the core ``FanOutDone(token, ...)``."""

    token: int
    request: ManagementRequest
    targets: tuple[tuple[str, str], ...]
    timeout_s: float


@dataclass(frozen=True, slots=True)
class ReadConfig:
    """reload_config on a config source: read its network config file and sign it (I/O), then
    feed the core ``ConfigRead`` with the same channel, routing id and request id (§7.1)."""

    channel: Channel
    routing_id: bytes
    request_id: str


@dataclass(frozen=True, slots=True)
class Drained:
    """After ``Drain``: no request is in flight any more; the node may stop now."""


class RequestDone(NamedTuple):
    """A request got its final answer at this broker: the event log's ``request`` record
    (docs/trend.md "In the broker"), made by scale0/core/records.py while the node writes an
    event log (``Broker.event_log``). Times are the core's monotonic ``now``; the node turns
    them into wall-clock milliseconds. A NamedTuple rather than a frozen dataclass: one is made
    per request on the hot path, and a tuple is the cheapest object to build."""

    service: str
    worker: bytes | None  # routing id of the worker that ran it; None: failed without one
    client: bytes | None  # routing id of the client; None for a request a peer forwarded here
    forwarded_from: str | None  # the peer broker that forwarded it here
    started: float  # when it arrived (monotonic s)
    finished: float  # when the final answer went (monotonic s)
    bytes_in: int  # request body bytes
    bytes_out: int  # reply body bytes (0 for the broker's own error answers)
    status: int
    attempts: int  # dispatches to workers or peers


Effect = (
    Send
    | Log
    | Hangup
    | Connect
    | Close
    | Subscribe
    | Publish
    | Persist
    | Authenticate
    | FanOut
    | ReadConfig
    | Drained
    | RequestDone
)
