"""A client's requests on its broker link: submit, resend, answers, deadlines and failover.

Pure: ``now`` (monotonic) and ``wall`` (UNIX time) are passed in, request ids come from a
:class:`RequestIds` built on a prefix passed in, and failover's jitter from the
:class:`~scale0.session.failover.Failover` the owner gives. ``scale0.net.client`` only opens and
closes the DEALER, sends :attr:`BrokerLink.outbox` and feeds what it receives to
:meth:`ClientSession.receive`.

Rules (tests/net/test_client.py, tests/net/test_failover.py and tests/session/ exercise each):

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
    :class:`BrokerRefused` if the broker refused the session meanwhile, or with
    :class:`~scale0.session.trust.UntrustedConfig` if the last broker it reached handed it a
    config it could not trust (a client with a trusted signing key, S1-S3).
C5  A negotiated link sends HEARTBEAT every interval (the larger of ours, the config's
    ``default_heartbeat_interval_ms`` and any ``hbeatinterval_ms`` the broker announces). A
    broker silent for ``liveness`` (config, default 3) intervals is dead, and so is one that
    does not answer CHECKCONFIG in that time: the client leaves it (C7). Idle beating (§3.4):
    a client with no request outstanding for ``liveness`` intervals beats at the config's
    ``idle_heartbeat_interval_ms`` instead, saying so (``interval_ms``), and the broker is
    then dead after ``liveness`` of the interval its answer says; a request makes it beat at
    its interval again.
C6  REPLY 200 gives the body; any other status raises (errors.error_for_reply), except a 409
    to a request we resent (§3.3: the first one is unaffected, its REPLY follows). REPLY/PARTIAL
    for a request_id nobody waits for (late duplicates) are dropped; undecodable frames are
    logged and dropped (§2.4), never answered.
C7  Failover (§3.9; which broker and when is :mod:`scale0.session.failover`, rules V1-V6): the
    client is given one seed endpoint and learns the family's frontends from each CONFIG. On
    leaving a broker (silence, DISCONNECT, 503, 301) the DEALER is closed with linger 0 at
    once; at the move's time a new DEALER connects to the next broker and C1/C2 run there, so
    every unanswered request is resent with its ``request_id``. Requests keep their deadlines
    (C4) across moves. Control messages still queued from the broker being left are ignored
    (one move per departure); its REPLY/PARTIAL still answer their requests.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scale0.session.errors import BrokerRefused, RequestTimeout, Scale0Error, error_for_reply
from scale0.session.failover import Failover, Move
from scale0.session.link import BrokerLink, LinkEvent
from scale0.session.trust import UntrustedConfig
from scale0.wire.client import ClientPartial, ClientReply, ClientRequest, DisconnectError
from scale0.wire.errors import ProtocolError

__all__ = [
    "Body",
    "ClientSession",
    "Outcome",
    "PendingRequest",
    "RequestIds",
    "body_frames",
    "closed_error",
    "take",
]

#: What a caller may pass as a request body: one frame or a sequence of frames.
Body = bytes | Sequence[bytes]

#: One thing a caller waiting on a request learns: (final, body) or the error it ends with.
Outcome = tuple[bool, list[bytes]] | Scale0Error

#: Bytes of the per-client prefix of a request id (the rest is an 8-byte counter).
ID_PREFIX_BYTES = 8


def body_frames(body: Body) -> tuple[bytes, ...]:
    """A request body as a tuple of frames (bytes is one frame)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return (bytes(body),)
    return tuple(bytes(frame) for frame in body)


class RequestIds:
    """Request ids of one client: its prefix (random, chosen by the owner) and a counter."""

    def __init__(self, prefix: bytes) -> None:
        if len(prefix) != ID_PREFIX_BYTES:
            raise ValueError(f"a request id prefix is {ID_PREFIX_BYTES} bytes")
        self.prefix = prefix
        self._counter = itertools.count(1)

    def next(self) -> bytes:
        """16 bytes, unique for the client's life (and across clients, given random prefixes)."""
        return self.prefix + next(self._counter).to_bytes(8, "big")


@dataclass(slots=True, eq=False)
class PendingRequest:
    """One request a caller waits on, and what it has learnt so far."""

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
    untrusted: UntrustedConfig | None = None  # S3: why the last broker's config was refused
    wake: Callable[[], None] | None = None

    def finished(self) -> bool:
        return self.done

    def push(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if isinstance(outcome, Scale0Error) or outcome[0]:
            self.done = True
        if self.wake is not None:
            self.wake()


def take(request: PendingRequest) -> tuple[bool, list[bytes]]:
    """The next outcome of ``request``: (final, body), or raise the error it ended with."""
    outcome = request.outcomes.popleft()
    if isinstance(outcome, Scale0Error):
        raise outcome
    return outcome


def closed_error(request: PendingRequest) -> Scale0Error:
    """What a request still waiting learns when its client is closed."""
    return Scale0Error("client closed", service=request.service, request_id=request.request_id)


class ClientSession:
    """Requests outstanding on one client's link (C2, C4, C6, C7), independent of how it waits.

    ``move`` is set when the client must leave its broker: the owner closes the DEALER at once
    and opens one to ``move.endpoint`` at ``move.at`` (C7; failover.py decides both), then
    calls :meth:`arrived`.
    """

    def __init__(
        self, link: BrokerLink, retries: int, failover: Failover, *, id_prefix: bytes
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.link = link
        self.retries = retries
        self.failover = failover
        self.pending: dict[bytes, PendingRequest] = {}
        self.move: Move | None = None
        self._ids = RequestIds(id_prefix)

    def new_request_id(self) -> bytes:
        return self._ids.next()

    def arrived(self, now: float) -> None:
        """A new DEALER is connected to ``failover.current``: the link starts over (C1)."""
        self.move = None
        self.link.endpoint = self.failover.current
        self.link.reset(now)

    def submit(self, service: str, body: Body, timeout_s: float, now: float) -> PendingRequest:
        if timeout_s <= 0:
            raise ValueError("timeout must be positive")
        request = PendingRequest(
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
        else:
            request.untrusted = self.link.untrusted  # S3: still no config we trust, so far
        return request

    def cancel(self, request: PendingRequest) -> None:
        """The caller stopped waiting: forget it (a late answer is dropped, C6)."""
        self.pending.pop(request.request_id, None)

    def _send(self, request: PendingRequest, now: float) -> None:
        self.link.outbox.append(
            ClientRequest(request.service, request.request_id, request.body).to_frames()
        )
        request.next_resend = now + request.attempt_s
        request.sends += 1
        self.link.note_work(now)  # C5: a client with a request out beats at its interval

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
            self.link.note_work(now)
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
                request.untrusted = None
                self._send(request, now)
        elif event is LinkEvent.RECONNECT:
            if self.link.untrusted is not None:
                for request in self.pending.values():
                    request.untrusted = self.link.untrusted  # S3: say so at the deadline
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
        self.link.leave()  # nothing more goes to the broker we leave
        self.move = self.failover.leave(reason, now, settle_s=self.link.settle_s, redirect=redirect)

    def tick(self, now: float, wall: float) -> None:
        """Timers: liveness and heartbeats (C5), resends (C4), deadlines (C4)."""
        self.link.busy = bool(self.pending)  # none outstanding: it may go idle (§3.4)
        if self.move is None and self.link.tick(now, wall):
            self.leave(self.link.silence_reason(), now)
        for request in list(self.pending.values()):
            if now >= request.deadline:
                del self.pending[request.request_id]
                if request.untrusted is not None:
                    request.push(request.untrusted.for_request(request.service, request.request_id))
                elif request.refused is not None:
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
        """The monotonic time :meth:`tick` must next run (or a move is due)."""
        wake = self.link.next_wakeup() if self.move is None else self.move.at
        for request in self.pending.values():
            wake = min(wake, request.deadline, request.next_resend)
        return wake

    def fail_all(self, error: Callable[[PendingRequest], Scale0Error]) -> None:
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


def _refused(request: PendingRequest, error: DisconnectError | None) -> Scale0Error:
    code = error.code if error is not None else None
    message = error.message if error is not None else "refused by the broker"
    return BrokerRefused(
        message, service=request.service, request_id=request.request_id, status=code
    )
