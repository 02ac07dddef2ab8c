"""The client library: blocking :class:`Client` and asyncio :class:`AsyncClient` (protocol.md §3).

Both speak S0C1 over one DEALER socket and share one sans-I/O core, so the rules below hold for
both; the classes only differ in who waits. :class:`BrokerLink` (negotiation, heartbeats,
liveness of one DEALER link) is shared with :mod:`scale0.net.worker` as well.

Rules (the tests in tests/net/test_client.py exercise each):

C1  A new socket sends CHECKCONFIG first (§3.1) with the ``client_id`` it holds (the one it was
    given, or the broker-assigned one from an earlier session, so the broker's reply cache still
    knows it) and waits for CONFIG / CONFIGACK; requests submitted meanwhile are queued.
C2  Once negotiated, every outstanding request is (re)sent with its original ``request_id``.
    The broker joins a request still in flight or answers from its reply cache, so a request
    is never run twice because of a resend.
C3  FORCENEGOTIATE and DISCONNECTERROR 426 start C1 again at once on the same socket; 401 fails
    every outstanding request with :class:`BrokerRefused`; 301, 503 and a broker DISCONNECT
    leave this broker (C7); every other code (400, 403, 409, 412, 429, 501) starts C1 again
    after a back-off (0.1 s doubling to 5 s, times 0.5..1 jitter; reset once a session has
    lasted ``liveness`` intervals). A 409 on ``client_id`` also drops the id, so the broker
    assigns another (§3.8).
C4  Each request has ``timeout`` seconds. It is resent (same ``request_id``) every
    ``timeout / (retries + 1)`` seconds without news of it, at most ``retries`` times; a PARTIAL
    counts as news. At the deadline it fails with :class:`RequestTimeout`, or with
    :class:`BrokerRefused` if the broker refused the session meanwhile.
C5  A negotiated link sends HEARTBEAT every interval (the larger of ours, the config's
    ``default_heartbeat_interval_ms`` and any ``hbeatinterval_ms`` the broker announces). A
    broker silent for ``liveness`` (config, default 3) intervals is dead, and so is one that
    does not answer CHECKCONFIG in that time: the client leaves it (C7).
C6  REPLY 200 gives the body; any other status raises (errors.error_for_reply), except a 409
    to a request we resent (§3.3: the first one is unaffected, its REPLY follows). REPLY/PARTIAL
    for a request_id nobody waits for (late duplicates) are dropped; undecodable frames are
    logged and dropped (§2.4), never answered.
C7  Failover (§3.9; which broker and when is :mod:`scale0.net.failover`, rules V1-V6): the
    client is given one seed endpoint and learns the family's frontends from each CONFIG. On
    leaving a broker (silence, DISCONNECT, 503, 301) the DEALER is closed with linger 0 at
    once; at the move's time a new DEALER connects to the next broker and C1/C2 run there, so
    every unanswered request is resent with its ``request_id``. Requests keep their deadlines
    (C4) across moves. Control messages still queued from the broker being left are ignored
    (one move per departure); its REPLY/PARTIAL still answer their requests. ``endpoint``
    names the broker in use, ``brokers`` the known ones, ``failovers`` counts the moves.

The blocking :class:`Client` only does I/O while one of its methods runs (it has no thread):
heartbeats and liveness are checked during calls, and silence while idle is not held against
the broker. Use one Client per thread. :class:`AsyncClient` runs a background task on the loop
that first uses it (it polls at least every 50 ms so new deadlines are noticed).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any, Final, Generic, Self, TypeVar

import zmq
import zmq.asyncio

from scale0.config.errors import ConfigError
from scale0.config.formats import Format, parse
from scale0.net.errors import (
    BrokerRefused,
    RequestTimeout,
    Scale0Error,
    error_for_reply,
)
from scale0.net.failover import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    Failover,
    FailoverView,
    Move,
    backoff_delay,
)
from scale0.wire.client import (
    CheckConfig,
    ClientPartial,
    ClientReply,
    ClientRequest,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import SIG_CLIENT, ConfigType, Message
from scale0.wire.registry import decode_from_broker

__all__ = [
    "AsyncClient",
    "Body",
    "BrokerLink",
    "Client",
    "ClientConfig",
    "LinkEvent",
]

log = logging.getLogger("scale0.client")

#: What a caller may pass as a request body: one frame or a sequence of frames.
Body = bytes | Sequence[bytes]

#: Frames we accept from our own broker (its own max_frame_bytes bounds what it relays anyway).
MAX_FRAME_BYTES: Final = 1 << 30
DEFAULT_LIVENESS: Final = 3
#: Linger of a socket closed on purpose (close()): long enough for DISCONNECT to leave.
CLOSE_LINGER_MS: Final = 200
#: The AsyncClient's background task wakes at least this often to see new deadlines.
ASYNC_POLL_CAP_S: Final = 0.05
#: Messages drained per poll before timers get a turn.
DRAIN_BATCH: Final = 1000


def body_frames(body: Body) -> tuple[bytes, ...]:
    """A request body as a tuple of frames (bytes is one frame)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return (bytes(body),)
    return tuple(bytes(frame) for frame in body)


# ---- the config a client was given ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The broker's answer to CHECKCONFIG: the client view of the network config (§3.2)."""

    version: int
    client_id: str
    config_type: ConfigType
    sha256: str | None = None
    document: Mapping[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str | None:
        """The family name, if the view carries it."""
        value = self.document.get("family")
        return value if isinstance(value, str) else None

    @property
    def brokers(self) -> list[Any]:
        """The family's brokers as the view lists them (empty if it does not)."""
        value = self.document.get("brokers")
        if isinstance(value, Mapping):  # XML/ZPL trees keep a list as {"broker": [...]}
            value = value.get("broker", [])
        if isinstance(value, Mapping):
            return [value]
        return list(value) if isinstance(value, list) else []

    def number(self, key: str) -> float | None:
        """A numeric key of the view (text formats carry numbers as strings)."""
        value = self.document.get(key)
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
                return number if math.isfinite(number) else None
        return None


_FORMATS: Final[dict[ConfigType, Format]] = {
    ConfigType.JSON: "json",
    ConfigType.XML: "xml",
    ConfigType.ZFL: "zfl",
}


def parse_config_document(config_type: ConfigType, document: bytes) -> dict[str, Any]:
    """The CONFIG document as a plain tree; ``{}`` (logged) when it does not parse."""
    try:
        if config_type is ConfigType.JSON:
            tree: Any = json.loads(document)
        else:
            tree = parse(document, _FORMATS[config_type]).tree
    except (ValueError, ConfigError) as exc:
        log.warning("config document (%s) does not parse: %s", config_type.value, exc)
        return {}
    if isinstance(tree, Mapping) and len(tree) == 1 and config_type is ConfigType.XML:
        (only,) = tree.values()  # XML has a root element around the view
        if isinstance(only, Mapping):
            tree = only
    return dict(tree) if isinstance(tree, Mapping) else {}


# ---- one DEALER link: negotiation, heartbeats, liveness (shared with the worker) -------------


class LinkEvent(Enum):
    """What a control message means for the owner of a :class:`BrokerLink`."""

    NEGOTIATED = "negotiated"  # CONFIG/CONFIGACK: (re)send what waits (client) / READY (worker)
    RECONNECT = "reconnect"  # DISCONNECT, 301, 503: leave this broker (``link.leave_reason``)
    REFUSED = "refused"  # DISCONNECTERROR: ``link.refusal`` says which
    STOP = "stop"  # 401: give up


class BrokerLink:
    """Sans-I/O state of one DEALER link to a broker: C1, C3 and C5 of the module docstring.

    The owner calls :meth:`reset` for each new socket, :meth:`heard` for every message
    received, :meth:`handle` for control messages and :meth:`tick` on timers, and sends
    whatever :attr:`outbox` collects. ``now`` is always ``time.monotonic()``.
    """

    def __init__(
        self,
        protocol: bytes,
        *,
        config_type: ConfigType = ConfigType.JSON,
        client_id: str | None = None,
        heartbeat_interval_s: float = 1.0,
    ) -> None:
        if heartbeat_interval_s <= 0:
            raise ValueError("heartbeat interval must be positive")
        self.protocol = protocol
        self.config_type = config_type
        self.client_id = client_id
        self.requested_interval_s = heartbeat_interval_s
        self.interval_s = heartbeat_interval_s
        self.liveness = DEFAULT_LIVENESS
        self.config: ClientConfig | None = None
        self.negotiated = False
        self.outbox: list[list[bytes]] = []
        self.last_heard = 0.0
        self.next_heartbeat = math.inf
        self.retry_at: float | None = None  # renegotiate at this time (back-off after refusal)
        self.refusal: DisconnectError | None = None  # last DISCONNECTERROR since NEGOTIATED
        self.move_to: str | None = None  # 301's endpoint, unchecked (failover.py V3 checks it)
        self.leave_reason = ""  # why the last RECONNECT leaves the broker (for the log, V6)
        self.negotiated_at = 0.0
        self.checkconfig_sent_at = -math.inf
        self._refusals = 0

    @property
    def config_version(self) -> int:
        return self.config.version if self.config is not None else 0

    def reset(self, now: float) -> None:
        """A new socket: start negotiating, and give the broker a full liveness period."""
        self.outbox.clear()
        self.last_heard = now
        self.negotiate(now)

    def resume(self, now: float) -> None:
        """The owner did no I/O for a while (idle blocking client): do not count it as silence."""
        self.last_heard = max(self.last_heard, now)
        if self.negotiated:
            self.next_heartbeat = now

    def negotiate(self, now: float) -> None:
        """Queue CHECKCONFIG (C1); nothing but CHECKCONFIG goes out until it is answered."""
        self.checkconfig_sent_at = now
        self.negotiated = False
        self.retry_at = None
        self.next_heartbeat = math.inf
        self.outbox.append(
            CheckConfig(
                self.config_type,
                self.config_version or None,
                self.client_id,
                protocol=self.protocol,
            ).to_frames()
        )

    def heard(self, now: float) -> None:
        """Any message from the broker counts as a heartbeat (§3.4)."""
        self.last_heard = now

    def handle(self, message: Message, now: float) -> LinkEvent | None:
        """Act on a control message; returns what the owner must do, if anything."""
        if isinstance(message, Config):
            self.config = ClientConfig(
                message.config_version,
                message.client_id,
                message.config_type,
                message.sha256,
                parse_config_document(message.config_type, message.document),
            )
            return self._negotiated(message.client_id, now)
        if isinstance(message, ConfigAck):
            if self.config is None or self.config.version != message.config_version:
                self.config = ClientConfig(
                    message.config_version, message.client_id, self.config_type
                )
            return self._negotiated(message.client_id, now)
        if isinstance(message, Heartbeat):
            if message.hbeatinterval_ms is not None:
                self._raise_interval(message.hbeatinterval_ms / 1000)
            return None
        if isinstance(message, ForceNegotiate):
            # Several messages sent before our CHECKCONFIG (a HEARTBEAT and a REQUEST after an
            # idle spell) each earn one; a CHECKCONFIG younger than an interval answers them all.
            if self.negotiated or now - self.checkconfig_sent_at >= self.interval_s:
                log.info("broker asks to renegotiate: %s", message.reason)
                self.negotiate(now)
            return None
        if isinstance(message, Disconnect):
            self.negotiated = False
            self.next_heartbeat = math.inf
            self.leave_reason = "broker said DISCONNECT"
            return LinkEvent.RECONNECT
        if isinstance(message, DisconnectError):
            return self._refused(message, now)
        return None

    def _negotiated(self, client_id: str, now: float) -> LinkEvent:
        self.client_id = client_id
        self.negotiated = True
        self.retry_at = None
        self.refusal = None
        self.negotiated_at = now
        if self.config is not None:
            default_ms = self.config.number("default_heartbeat_interval_ms")
            if default_ms is not None and default_ms > 0:
                self._raise_interval(default_ms / 1000)
            liveness = self.config.number("liveness")
            if liveness is not None and liveness >= 1:
                self.liveness = int(liveness)
        self.next_heartbeat = now + self.interval_s
        return LinkEvent.NEGOTIATED

    def _raise_interval(self, interval_s: float) -> None:
        self.interval_s = max(self.requested_interval_s, interval_s)

    def _refused(self, error: DisconnectError, now: float) -> LinkEvent:
        # Every DISCONNECTERROR ends the session at the broker (§3.8).
        log.warning("broker refused: %d %s", error.code, error.message)
        self.negotiated = False
        self.next_heartbeat = math.inf
        self.refusal = error
        if error.code in (301, 503):
            # §3.8/§6.4: go where we are told, or to another broker of the family (V3).
            self.move_to = error.endpoint if error.code == 301 else None
            self.leave_reason = f"DISCONNECTERROR {error.code} {error.message}"
            return LinkEvent.RECONNECT
        if error.code == 401:
            return LinkEvent.STOP
        if error.code == 426:
            self.negotiate(now)
            return LinkEvent.REFUSED
        if error.code == 409:
            self.client_id = None  # "picks another id": let the broker assign one
        # 400, 403, 409, 412, 429, 501 and anything unknown: back off, then CHECKCONFIG.
        # Backing off even where §3.8 allows an immediate retry keeps a worker whose READY
        # the broker refuses (400) from looping at full speed.
        self.retry_at = now + backoff_delay(self._refusals)
        self._refusals += 1
        return LinkEvent.REFUSED

    def tick(self, now: float) -> bool:
        """Fire due timers (renegotiation, heartbeat); True when the broker counts as dead."""
        if self.retry_at is not None and now >= self.retry_at:
            self.negotiate(now)
        if self.negotiated and now - self.negotiated_at > self.liveness * self.interval_s:
            self._refusals = 0  # a session that lasted: the next refusal starts back-off afresh
        if self.negotiated and now >= self.next_heartbeat:
            self.outbox.append(
                Heartbeat(time.time(), self.config_version, protocol=self.protocol).to_frames()
            )
            self.next_heartbeat = now + self.interval_s
        return now - self.last_heard > self.liveness * self.interval_s

    def silence_reason(self) -> str:
        """Why :meth:`tick` said the broker is dead, for the failover log line (V6)."""
        state = "answered nothing" if self.negotiated else "did not answer CHECKCONFIG"
        return f"{state} for {self.liveness * self.interval_s:.3g} s"

    @property
    def settle_s(self) -> float:
        """How long a session must have lasted for the next move to be immediate (V5)."""
        return self.liveness * self.interval_s

    def next_wakeup(self) -> float:
        """The monotonic time of the next timer :meth:`tick` must see."""
        wake = self.last_heard + self.liveness * self.interval_s
        if self.negotiated:
            wake = min(wake, self.next_heartbeat)
        if self.retry_at is not None:
            wake = min(wake, self.retry_at)
        return wake

    def decode(self, frames: Sequence[bytes]) -> Message | None:
        """Decode a message from the broker; None (logged, §2.4) when it is garbage."""
        try:
            return decode_from_broker(
                frames, signature=self.protocol, max_frame_bytes=MAX_FRAME_BYTES
            )
        except ProtocolError as exc:
            log.warning("undecodable message from broker dropped: %s", exc)
            return None


# ---- the client core (sans-I/O) ---------------------------------------------------------------

#: One thing a caller waiting on a request learns: (final, body) or the error it ends with.
Outcome = tuple[bool, list[bytes]] | Scale0Error


@dataclass(slots=True, eq=False)
class _Request:
    service: str
    request_id: bytes
    body: tuple[bytes, ...]
    submitted: float
    deadline: float
    attempt_s: float
    resends_left: int
    next_resend: float = math.inf
    sends: int = 0
    outcomes: deque[Outcome] = field(default_factory=deque)
    done: bool = False
    refused: DisconnectError | None = None
    wake: Callable[[], None] | None = None

    def finished(self) -> bool:
        return self.done

    def push(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if isinstance(outcome, Scale0Error) or outcome[0]:
            self.done = True
        if self.wake is not None:
            self.wake()


class _Session:
    """Requests outstanding on one client's link (C2, C4, C6, C7), independent of how it waits.

    ``move`` is set when the client must leave its broker: the owner closes the DEALER at once
    and opens one to ``move.endpoint`` at ``move.at`` (C7; failover.py decides both).
    """

    def __init__(self, link: BrokerLink, retries: int, failover: Failover) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.link = link
        self.retries = retries
        self.failover = failover
        self.pending: dict[bytes, _Request] = {}
        self.move: Move | None = None
        self._prefix = os.urandom(8)
        self._counter = itertools.count(1)

    def new_request_id(self) -> bytes:
        """16 bytes: a random per-client prefix and a counter, unique for the client's life."""
        return self._prefix + next(self._counter).to_bytes(8, "big")

    def submit(self, service: str, body: Body, timeout_s: float, now: float) -> _Request:
        if timeout_s <= 0:
            raise ValueError("timeout must be positive")
        request = _Request(
            service,
            self.new_request_id(),
            body_frames(body),
            now,
            now + timeout_s,
            timeout_s / (self.retries + 1),
            self.retries,
        )
        self.pending[request.request_id] = request
        if self.link.negotiated:
            self._send(request, now)
        return request

    def cancel(self, request: _Request) -> None:
        """The caller stopped waiting: forget it (a late answer is dropped, C6)."""
        self.pending.pop(request.request_id, None)

    def _send(self, request: _Request, now: float) -> None:
        self.link.outbox.append(
            ClientRequest(request.service, request.request_id, request.body).to_frames()
        )
        request.next_resend = now + request.attempt_s
        request.sends += 1

    def receive(self, frames: Sequence[bytes], now: float) -> None:
        self.link.heard(now)
        message = self.link.decode(frames)
        if message is None:
            return
        if isinstance(message, ClientReply):
            request = self.pending.get(message.request_id)
            if request is None:
                return
            if message.status == 409 and request.sends > 1:
                # protocol.md §3.3: a resent request_id still in flight is answered 409 and
                # "the first request is unaffected": its own REPLY is still to come.
                return
            del self.pending[message.request_id]
            if message.status == 200:
                request.push((True, list(message.body)))
            else:
                request.push(_reply_error(message))
        elif isinstance(message, ClientPartial):
            request = self.pending.get(message.request_id)
            if request is not None:
                request.next_resend = now + request.attempt_s  # news of it: no resend yet
                request.push((False, list(message.body)))
        elif self.move is None:
            self._control(self.link.handle(message, now), now)
        # else: control messages that were queued behind a 301/503/DISCONNECT come from the
        # broker we are leaving; a second refusal must not move us twice (C7).

    def _control(self, event: LinkEvent | None, now: float) -> None:
        if event is LinkEvent.NEGOTIATED:
            self.failover.negotiated(now)
            if self.link.config is not None:
                self.failover.learn(self.link.config.document)
            for request in self.pending.values():
                request.refused = None
                self._send(request, now)
        elif event is LinkEvent.RECONNECT:
            refusal = self.link.refusal
            if refusal is not None and refusal.code == 503:
                for request in self.pending.values():
                    request.refused = refusal  # if every broker refuses, say so at the deadline
            self.leave(self.link.leave_reason, now, redirect=self.link.move_to)
        elif event is LinkEvent.REFUSED:
            for request in self.pending.values():
                request.refused = self.link.refusal
        elif event is LinkEvent.STOP:
            error = self.link.refusal
            for request in list(self.pending.values()):
                self.pending.pop(request.request_id)
                request.push(_refused(request, error))

    def leave(self, reason: str, now: float, redirect: str | None = None) -> None:
        """C7: stop using this broker; ``move`` says where to go and when (failover.py)."""
        link = self.link
        link.move_to = None
        link.negotiated = False
        link.next_heartbeat = math.inf
        link.retry_at = None
        link.outbox.clear()  # nothing more goes to the broker we leave
        self.move = self.failover.leave(reason, now, settle_s=link.settle_s, redirect=redirect)

    def tick(self, now: float) -> None:
        if self.move is None and self.link.tick(now):
            self.leave(self.link.silence_reason(), now)
        for request in list(self.pending.values()):
            if now >= request.deadline:
                del self.pending[request.request_id]
                if request.refused is not None:
                    request.push(_refused(request, request.refused))
                else:
                    request.push(
                        RequestTimeout(
                            f"no answer within {request.deadline - request.submitted:.3g} s",
                            service=request.service,
                            request_id=request.request_id,
                        )
                    )
            elif self.link.negotiated and now >= request.next_resend:
                if request.resends_left > 0:
                    request.resends_left -= 1
                    self._send(request, now)
                else:
                    request.next_resend = request.deadline

    def next_wakeup(self) -> float:
        wake = self.link.next_wakeup() if self.move is None else self.move.at
        for request in self.pending.values():
            wake = min(wake, request.deadline, request.next_resend)
        return wake

    def fail_all(self, error: Callable[[_Request], Scale0Error]) -> None:
        for request in list(self.pending.values()):
            request.push(error(request))
        self.pending.clear()


def _reply_error(reply: ClientReply) -> Scale0Error:
    try:
        _code, message = reply.error_detail()
    except ProtocolError:
        # Not the JSON convention (a worker's own error body): show what there is.
        message = b" ".join(reply.body)[:200].decode("utf-8", "replace") or "no message"
    return error_for_reply(reply.service, reply.request_id, reply.status, message)


def _refused(request: _Request, error: DisconnectError | None) -> Scale0Error:
    code = error.code if error is not None else None
    message = error.message if error is not None else "refused by the broker"
    return BrokerRefused(
        message, service=request.service, request_id=request.request_id, status=code
    )


def _closed(request: _Request) -> Scale0Error:
    return Scale0Error("client closed", service=request.service, request_id=request.request_id)


def _take(request: _Request) -> tuple[bool, list[bytes]]:
    outcome = request.outcomes.popleft()
    if isinstance(outcome, Scale0Error):
        raise outcome
    return outcome


# ---- the blocking client -----------------------------------------------------------------------


_S = TypeVar("_S", zmq.Socket[bytes], zmq.asyncio.Socket)


class _LinkedClient(FailoverView, Generic[_S]):
    """What Client and AsyncClient share: the BrokerLink, the session, and opening the DEALER."""

    def __init__(
        self,
        endpoint: str,
        new_socket: Callable[[], _S],
        *,
        client_id: str | None,
        config_type: str,
        timeout: float,
        retries: int,
        heartbeat_interval: float,
        backoff_initial: float,
        backoff_max: float,
    ) -> None:
        self.timeout = timeout
        self._new_socket: Callable[[], _S] = new_socket
        self._link = BrokerLink(
            SIG_CLIENT,
            config_type=ConfigType(config_type),
            client_id=client_id,
            heartbeat_interval_s=heartbeat_interval,
        )
        self._failover = Failover(endpoint, "frontend", initial=backoff_initial, cap=backoff_max)
        self._session = _Session(self._link, retries, self._failover)
        self._socket: _S | None = None
        self._closed = False

    @property
    def config(self) -> ClientConfig | None:
        """What the broker told us at the last negotiation (version, family, brokers...)."""
        return self._link.config

    @property
    def client_id(self) -> str | None:
        """The session's client_id (ours, or the one the broker assigned)."""
        return self._link.client_id

    def _open(self) -> None:
        """A fresh DEALER to the broker in use (C7); the link starts over (C1)."""
        if self._socket is not None:
            self._socket.close(linger=0)
        socket = self._new_socket()
        socket.linger = 0
        try:
            socket.connect(self._failover.current)
        except zmq.ZMQError as exc:
            if self._failover.failovers == 0:
                socket.close(linger=0)
                raise  # the seed the caller gave: a mistake to report, not a broker to skip
            # Never raise out of a move: an endpoint libzmq refuses stays silent, so C5 moves on.
            log.warning("cannot connect to %s: %s", self._failover.current, exc)
        self._socket = socket
        self._session.move = None
        self._link.reset(time.monotonic())

    def _perform_move(self, now: float) -> bool:
        """Carry out C7's move if one is due: close at once, open at its time; True if opened."""
        move = self._session.move
        if move is None:
            return False
        if self._socket is not None:
            self._socket.close(linger=0)  # unsent requests go nowhere: C2 resends them
            self._socket = None
        if now < move.at:
            return False
        self._open()
        return True


class Client(_LinkedClient[zmq.Socket[bytes]]):
    """A blocking S0C1 client over a plain pyzmq DEALER. Not thread-safe: one thread owns it.

    ``request`` returns the REPLY body frames, ``request_stream`` yields each PARTIAL body and
    then the REPLY body, ``request_many`` pipelines. Errors are :mod:`scale0.net.errors` types.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        client_id: str | None = None,
        config_type: str = "json",
        timeout: float = 10.0,
        retries: int = 2,
        heartbeat_interval: float = 1.0,
        backoff_initial: float = BACKOFF_INITIAL_S,
        backoff_max: float = BACKOFF_MAX_S,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        ctx = context if context is not None else zmq.Context.instance()
        super().__init__(
            endpoint,
            lambda: ctx.socket(zmq.DEALER),
            client_id=client_id,
            config_type=config_type,
            timeout=timeout,
            retries=retries,
            heartbeat_interval=heartbeat_interval,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        self._idle_since: float | None = None
        self._open()

    # -- public --

    def connect(self, timeout: float | None = None) -> ClientConfig:
        """Wait until the broker answered CHECKCONFIG; RequestTimeout if it does not in time."""
        limit = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._pump(lambda: self._link.negotiated, limit)
        if not self._link.negotiated or self._link.config is None:
            if self._link.refusal is not None:
                raise BrokerRefused(self._link.refusal.message, status=self._link.refusal.code)
            raise RequestTimeout("the broker did not answer CHECKCONFIG")
        return self._link.config

    def request(self, service: str, body: Body, timeout: float | None = None) -> list[bytes]:
        """Send one request and return the final REPLY's body frames (PARTIALs are skipped)."""
        reply: list[bytes] = []
        for reply in self.request_stream(service, body, timeout):  # noqa: B007
            pass
        return reply

    def request_stream(
        self, service: str, body: Body, timeout: float | None = None
    ) -> Iterator[list[bytes]]:
        """Yield each PARTIAL's body in order, then the final REPLY's body (the last item)."""
        request = self._submit(service, body, timeout)
        try:
            while True:
                self._pump(lambda: bool(request.outcomes))
                final, frames = _take(request)
                yield frames
                if final:
                    return
        finally:
            if not request.done:
                self._session.cancel(request)

    def request_many(
        self,
        service: str,
        bodies: Iterable[Body],
        window: int = 100,
        timeout: float | None = None,
    ) -> list[list[bytes]]:
        """Send every body with at most ``window`` in flight; the replies in the bodies' order.

        The first failure cancels the rest and is raised. ``timeout`` applies to each request,
        counted from when it is sent.
        """
        if window < 1:
            raise ValueError("window must be >= 1")
        results: list[list[bytes]] = []
        in_flight: deque[_Request] = deque()
        source = iter(bodies)
        exhausted = False
        try:
            while True:
                while not exhausted and len(in_flight) < window:
                    body = next(source, None)
                    if body is None:
                        exhausted = True
                    else:
                        in_flight.append(self._submit(service, body, timeout))
                if not in_flight:
                    return results
                self._pump(in_flight[0].finished)
                while in_flight and in_flight[0].done:
                    request = in_flight.popleft()
                    reply: list[bytes] = []
                    while request.outcomes:
                        final, frames = _take(request)
                        if final:
                            reply = frames
                    results.append(reply)
        finally:
            for request in in_flight:
                self._session.cancel(request)

    def close(self) -> None:
        """Send DISCONNECT and close the socket; outstanding requests fail. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._session.fail_all(_closed)
        if self._socket is not None:  # None between two brokers (C7)
            with contextlib.suppress(zmq.ZMQError):
                self._socket.send_multipart(
                    Disconnect(protocol=SIG_CLIENT).to_frames(), zmq.NOBLOCK
                )
            self._socket.close(linger=CLOSE_LINGER_MS)
            self._socket = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals --

    def _submit(self, service: str, body: Body, timeout: float | None) -> _Request:
        if self._closed:
            raise Scale0Error("client closed", service=service)
        seconds = self.timeout if timeout is None else timeout
        request = self._session.submit(service, body, seconds, time.monotonic())
        self._flush()
        return request

    def _open(self) -> None:
        super()._open()
        self._flush()

    def _flush(self) -> None:
        socket = self._socket
        outbox = self._link.outbox
        if socket is None or not outbox:
            return
        for frames in outbox:
            # zmq.Again: high-water mark (broker away); resends and renegotiation cover it.
            with contextlib.suppress(zmq.Again):
                socket.send_multipart(frames, zmq.NOBLOCK)
        outbox.clear()

    def _pump(self, done: Callable[[], bool], limit: float = math.inf) -> None:
        """Do I/O and timers until ``done()`` or ``limit``; every request has a deadline."""
        now = time.monotonic()
        if self._idle_since is not None and now - self._idle_since > self._link.interval_s:
            self._link.resume(now)
        self._idle_since = None
        try:
            while not done():
                now = time.monotonic()
                if now >= limit:
                    return
                self._session.tick(now)
                self._perform_move(now)
                self._flush()
                if done():
                    return
                if self._closed:
                    raise Scale0Error("client closed")
                wait = min(self._session.next_wakeup(), limit) - time.monotonic()
                socket = self._socket
                if socket is None:  # between two brokers: the move's back-off (C7)
                    time.sleep(max(0.0, wait))
                    continue
                if socket.poll(max(0, math.ceil(wait * 1000)), zmq.POLLIN):
                    self._drain(socket)
                    self._flush()
        finally:
            self._idle_since = time.monotonic()

    def _drain(self, socket: zmq.Socket[bytes]) -> None:
        now = time.monotonic()
        for _ in range(DRAIN_BATCH):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._session.receive(frames, now)


# ---- the asyncio client -----------------------------------------------------------------------


class AsyncClient(_LinkedClient[zmq.asyncio.Socket]):
    """An asyncio S0C1 client (``zmq.asyncio``): many requests may be in flight at once.

    Bound to the event loop that first uses it. ``await client.request(...)`` from any number of
    tasks pipelines them on one socket; replies are matched by ``request_id``.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        client_id: str | None = None,
        config_type: str = "json",
        timeout: float = 10.0,
        retries: int = 2,
        heartbeat_interval: float = 1.0,
        backoff_initial: float = BACKOFF_INITIAL_S,
        backoff_max: float = BACKOFF_MAX_S,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        ctx = context if context is not None else zmq.asyncio.Context.instance()
        super().__init__(
            endpoint,
            lambda: ctx.socket(zmq.DEALER),
            client_id=client_id,
            config_type=config_type,
            timeout=timeout,
            retries=retries,
            heartbeat_interval=heartbeat_interval,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        self._task: asyncio.Task[None] | None = None
        self._negotiated: asyncio.Event | None = None

    async def connect(self, timeout: float | None = None) -> ClientConfig:
        """Wait until the broker answered CHECKCONFIG; RequestTimeout if it does not in time."""
        negotiated = self._start()
        seconds = self.timeout if timeout is None else timeout
        try:
            await asyncio.wait_for(negotiated.wait(), seconds)
        except TimeoutError:
            if self._link.refusal is not None:
                raise BrokerRefused(
                    self._link.refusal.message, status=self._link.refusal.code
                ) from None
            raise RequestTimeout("the broker did not answer CHECKCONFIG") from None
        if self._link.config is None:  # set together with negotiated; kept for the type
            raise RequestTimeout("the broker did not answer CHECKCONFIG")
        return self._link.config

    async def request(self, service: str, body: Body, timeout: float | None = None) -> list[bytes]:
        """Send one request and return the final REPLY's body frames (PARTIALs are skipped)."""
        reply: list[bytes] = []
        async for reply in self.request_stream(service, body, timeout):  # noqa: B007
            pass
        return reply

    async def request_stream(
        self, service: str, body: Body, timeout: float | None = None
    ) -> AsyncIterator[list[bytes]]:
        """Yield each PARTIAL's body in order, then the final REPLY's body (the last item)."""
        if self._closed:
            raise Scale0Error("client closed", service=service)
        self._start()
        seconds = self.timeout if timeout is None else timeout
        woken = asyncio.Event()
        request = self._session.submit(service, body, seconds, time.monotonic())
        request.wake = woken.set
        try:
            await self._flush()
            while True:
                while not request.outcomes:
                    woken.clear()
                    # The background task enforces the deadline; the margin only guards
                    # against that task having died.
                    margin = request.deadline - time.monotonic() + 1.0
                    try:
                        await asyncio.wait_for(woken.wait(), max(margin, 0.0))
                    except TimeoutError:
                        if not request.outcomes:
                            raise RequestTimeout(
                                "no answer (client task stopped)",
                                service=service,
                                request_id=request.request_id,
                            ) from None
                final, frames = _take(request)
                yield frames
                if final:
                    return
        finally:
            if not request.done:
                self._session.cancel(request)

    async def close(self) -> None:
        """Send DISCONNECT, stop the background task and close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._session.fail_all(_closed)
        if self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                await self._socket.send_multipart(
                    Disconnect(protocol=SIG_CLIENT).to_frames(), zmq.NOBLOCK
                )
            self._socket.close(linger=CLOSE_LINGER_MS)
            self._socket = None

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- internals --

    def _start(self) -> asyncio.Event:
        if self._negotiated is None:
            self._negotiated = asyncio.Event()
        if self._task is None and not self._closed:
            self._open()
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self._negotiated

    async def _flush(self) -> None:
        socket = self._socket
        if socket is None or not self._link.outbox:
            return
        outbox = list(self._link.outbox)
        self._link.outbox.clear()
        for frames in outbox:
            # zmq.Again: high-water mark (broker away); resends and renegotiation cover it.
            with contextlib.suppress(zmq.Again):
                await socket.send_multipart(frames, zmq.NOBLOCK)

    def _sync_negotiated(self) -> None:
        event = self._negotiated
        if event is None:
            return
        if self._link.negotiated:
            event.set()
        else:
            event.clear()

    async def _run(self) -> None:
        try:
            while True:
                now = time.monotonic()
                self._session.tick(now)
                self._perform_move(now)
                self._sync_negotiated()
                await self._flush()
                if self._closed:
                    return
                wait = min(self._session.next_wakeup() - time.monotonic(), ASYNC_POLL_CAP_S)
                socket = self._socket
                if socket is None:  # between two brokers: the move's back-off (C7)
                    await asyncio.sleep(max(0.0, wait))
                    continue
                events = await socket.poll(max(0, math.ceil(wait * 1000)))
                if events:
                    now = time.monotonic()
                    for _ in range(DRAIN_BATCH):
                        try:
                            frames = await socket.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._session.receive(frames, now)
                    self._sync_negotiated()
                    await self._flush()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("client task failed")
            self._session.fail_all(
                lambda request: Scale0Error(
                    "client task failed", service=request.service, request_id=request.request_id
                )
            )
            raise
