"""A Majordomo (MDP) client and worker on plain pyzmq, written from the RFC frame tables alone.

rfc.zeromq.org 7/MDP (MDP/0.1, ``MDPC01``/``MDPW01``) is the reference; 18/MDP (MDP/0.2,
``MDPC02``/``MDPW02``, PARTIAL/FINAL) and majortomo 0.2.0's reading of it are here too, as
``Dialect`` values, because majortomo (PyPI) speaks nothing else:

==============  ==========================  ==========================  =====================
                MDP01 (RFC 7)               MDP02 (RFC 18)              MAJORTOMO
==============  ==========================  ==========================  =====================
empty frame 0   yes (client and worker)     no                          yes
client REQUEST  MDPC01 service body…        MDPC02 0x01 service body…   MDPC02 0x02 service…
client reply    MDPC01 service body…        MDPC02 0x02|0x03 service…   MDPC02 0x03|0x04 body…
worker          READY 01, REQUEST 02,       READY 01, REQUEST 02, PARTIAL 03, FINAL 04,
                REPLY 03, HEARTBEAT 04,     HEARTBEAT 05, DISCONNECT 06 (both)
                DISCONNECT 05
==============  ==========================  ==========================  =====================

Worker REQUEST/REPLY carry exactly one client address frame, then an empty frame, then the
body (RFC 7, "Request and Reply Processing"). A worker heartbeats when it has sent nothing for
an interval, counts any command from the broker as a heartbeat, and starts over on a new socket
(READY again) after a DISCONNECT or ``liveness`` silent intervals (RFC 7, "Heartbeating").

These are the peers tools/bench drives every Majordomo broker with, and the test peers for the
brokers in tests/tools/test_mdp.py. They validate what they receive: a malformed message is
counted in ``dropped`` and otherwise ignored, never raised out of a receive loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one Majordomo version frames its messages (see the module's table)."""

    name: str
    client: bytes  # client signature
    worker: bytes  # worker signature
    delimiter: bool  # an empty frame before the signature, in both sub-protocols
    request: bytes | None  # client REQUEST command; None: no command frame (MDP/0.1)
    partial: bytes | None  # broker-to-client PARTIAL; None: the version has none
    final: bytes | None  # broker-to-client final reply command; None: no command frame
    reply_service: bool  # the reply to a client carries the service frame
    ready: bytes
    w_request: bytes
    w_partial: bytes | None
    w_final: bytes  # REPLY in MDP/0.1
    heartbeat: bytes
    disconnect: bytes


MDP01 = Dialect(
    name="7/MDP (MDP/0.1)",
    client=b"MDPC01",
    worker=b"MDPW01",
    delimiter=True,
    request=None,
    partial=None,
    final=None,
    reply_service=True,
    ready=b"\x01",
    w_request=b"\x02",
    w_partial=None,
    w_final=b"\x03",
    heartbeat=b"\x04",
    disconnect=b"\x05",
)
MDP02 = Dialect(
    name="18/MDP (MDP/0.2)",
    client=b"MDPC02",
    worker=b"MDPW02",
    delimiter=False,
    request=b"\x01",
    partial=b"\x02",
    final=b"\x03",
    reply_service=True,
    ready=b"\x01",
    w_request=b"\x02",
    w_partial=b"\x03",
    w_final=b"\x04",
    heartbeat=b"\x05",
    disconnect=b"\x06",
)
# majortomo 0.2.0: keeps RFC 7's empty frame, numbers client commands like worker ones
# (REQUEST 0x02, PARTIAL 0x03, FINAL 0x04) and replies without the service frame.
MAJORTOMO = Dialect(
    name="majortomo 0.2.0's MDP/0.2",
    client=b"MDPC02",
    worker=b"MDPW02",
    delimiter=True,
    request=b"\x02",
    partial=b"\x03",
    final=b"\x04",
    reply_service=False,
    ready=b"\x01",
    w_request=b"\x02",
    w_partial=b"\x03",
    w_final=b"\x04",
    heartbeat=b"\x05",
    disconnect=b"\x06",
)
DIALECTS = {"0.1": MDP01, "0.2": MDP02, "majortomo": MAJORTOMO}


def request_header(dialect: Dialect, service: bytes) -> list[bytes]:
    """The frames of a client's REQUEST before its body."""
    head = [b""] if dialect.delimiter else []
    head.append(dialect.client)
    if dialect.request is not None:
        head.append(dialect.request)
    head.append(service)
    return head


def reply_header(dialect: Dialect, service: bytes) -> list[bytes]:
    """The frames of a broker's final reply to a client before its body."""
    head = [b""] if dialect.delimiter else []
    head.append(dialect.client)
    if dialect.final is not None:
        head.append(dialect.final)
    if dialect.reply_service:
        head.append(service)
    return head


class MdpError(Exception):
    """A malformed or unexpected Majordomo message (the text names what is wrong)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer to a client: ``final`` False for a PARTIAL (MDP/0.2 only)."""

    service: bytes | None  # None where the dialect's reply has no service frame
    body: list[bytes]
    final: bool


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a worker receives it: ``address`` is the broker's client address frame."""

    address: bytes
    body: list[bytes]


# ---- client -------------------------------------------------------------------------------------


class Client:
    """An asynchronous MDP client: a DEALER (RFC 7 allows it; RFC 18 requires it), any number of
    requests outstanding. Replies come back in the order the broker sends them."""

    def __init__(
        self, endpoint: str, dialect: Dialect = MDP01, *, context: zmq.Context[zmq.Socket[bytes]]
    ) -> None:
        self.dialect = dialect
        self.socket: zmq.Socket[bytes] = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(endpoint)
        self.dropped = 0

    def header(self, service: bytes) -> list[bytes]:
        """The frames of a REQUEST before its body."""
        return request_header(self.dialect, service)

    def send(self, service: bytes, body: Sequence[bytes]) -> None:
        self.socket.send_multipart([*self.header(service), *body])

    def parse(self, frames: list[bytes]) -> Reply:
        """One message from the broker as a ``Reply``; ``MdpError`` if it is not one."""
        d = self.dialect
        at = 0
        if d.delimiter:
            if not frames or frames[0] != b"":
                raise MdpError("reply: frame 0 is not the empty delimiter")
            at = 1
        if len(frames) <= at or frames[at] != d.client:
            got = frames[at][:16] if len(frames) > at else None
            raise MdpError(f"reply: signature {got!r}, expected {d.client!r}")
        at += 1
        final = True
        if d.final is not None:
            command = frames[at] if len(frames) > at else None
            if command == d.final:
                final = True
            elif command == d.partial:
                final = False
            else:
                raise MdpError(f"reply: command {command!r} is neither PARTIAL nor FINAL")
            at += 1
        service = None
        if d.reply_service:
            if len(frames) <= at:
                raise MdpError("reply: no service frame")
            service = frames[at]
            at += 1
        return Reply(service, frames[at:], final)

    def recv(self, timeout_s: float) -> Reply:
        """The next well-formed reply (malformed ones are counted in ``dropped``).

        ``TimeoutError`` if none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self.socket.poll(left_ms):
                raise TimeoutError(f"no MDP reply within {timeout_s} s")
            try:
                return self.parse(self.socket.recv_multipart())
            except MdpError:
                self.dropped += 1

    def request(self, service: bytes, body: Sequence[bytes], timeout_s: float) -> list[bytes]:
        """Send one request and wait for its final reply; the body frames of that reply.

        PARTIAL bodies come first, in order (MDP/0.2)."""
        self.send(service, body)
        deadline = time.monotonic() + timeout_s
        parts: list[bytes] = []
        while True:
            reply = self.recv(max(0.0, deadline - time.monotonic()))
            if reply.service is not None and reply.service != service:
                raise MdpError(f"reply for service {reply.service!r}, asked {service!r}")
            parts.extend(reply.body)
            if reply.final:
                return parts

    def close(self) -> None:
        self.socket.close(0)


# ---- worker -------------------------------------------------------------------------------------


class Worker:
    """An MDP worker serving one service (RFC 7: "One worker handles precisely one service").

    ``recv`` returns the next request and keeps the heartbeat dialog going meanwhile; answer
    each with ``reply`` (``partial`` first, in MDP/0.2) before the next ``recv``. ``held`` is
    how many requests it holds unanswered, ``max_held`` the most it ever held at once: a broker
    that gives a Majordomo worker a second request before the first is answered shows there.
    """

    def __init__(
        self,
        endpoint: str,
        service: bytes,
        dialect: Dialect = MDP01,
        *,
        context: zmq.Context[zmq.Socket[bytes]],
        heartbeat_interval_s: float = 2.5,
        liveness: int = 3,
    ) -> None:
        self.endpoint = endpoint
        self.service = service
        self.dialect = dialect
        self.context = context
        self.heartbeat_interval_s = heartbeat_interval_s
        self.liveness = liveness
        self.held = self.max_held = 0
        self.dropped = self.reconnects = self.disconnects = 0
        self.socket: zmq.Socket[bytes] | None = None
        self._head = [b""] if dialect.delimiter else []
        self._head.append(dialect.worker)
        self._connect()

    def _connect(self) -> None:
        if self.socket is not None:
            self.socket.close(0)
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(self.endpoint)
        self.held = 0
        self._send([self.dialect.ready, self.service])
        self.broker_expires = time.monotonic() + self.heartbeat_interval_s * self.liveness

    def _send(self, frames: list[bytes]) -> None:
        if self.socket is None:
            raise MdpError("worker is closed")
        self.socket.send_multipart([*self._head, *frames])
        self.heartbeat_at = time.monotonic() + self.heartbeat_interval_s

    def _parse(self, frames: list[bytes]) -> Request | None:
        """A REQUEST, or None for a heartbeat; DISCONNECT and garbage raise ``MdpError``."""
        d = self.dialect
        at = len(self._head)
        if frames[:at] != self._head or len(frames) <= at:
            raise MdpError(f"message does not start with {self._head!r}")
        command = frames[at]
        if command == d.heartbeat and len(frames) == at + 1:
            return None
        if command == d.disconnect and len(frames) == at + 1:
            raise _Disconnected
        # REQUEST: command, exactly one client address frame, an empty frame, body...
        if command == d.w_request and len(frames) >= at + 3 and frames[at + 2] == b"":
            return Request(frames[at + 1], frames[at + 3 :])
        raise MdpError(f"unexpected command {command!r} in {len(frames)} frames")

    def recv(self, timeout_s: float) -> Request | None:
        """The next request, or None if none came within ``timeout_s``.

        Sends HEARTBEAT when it has sent nothing for an interval; reconnects (new socket,
        READY again) after a DISCONNECT or when the broker has been silent for ``liveness``
        intervals."""
        if self.socket is None:
            raise MdpError("worker is closed")
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            if now >= self.broker_expires:
                self.reconnects += 1
                self._connect()
                continue
            if now >= self.heartbeat_at:
                self._send([self.dialect.heartbeat])
            # Poll first: a receive that fails raises, which costs more than the poll.
            wait_s = min(deadline, self.heartbeat_at, self.broker_expires) - now
            if not self.socket.poll(max(0, math.ceil(wait_s * 1000))):
                if time.monotonic() >= deadline:
                    return None
                continue
            frames = self.socket.recv_multipart()
            self.broker_expires = time.monotonic() + self.heartbeat_interval_s * self.liveness
            try:
                request = self._parse(frames)
            except _Disconnected:
                self.disconnects += 1
                self._connect()
                continue
            except MdpError:
                self.dropped += 1
                continue
            if request is not None:
                self.held += 1
                self.max_held = max(self.max_held, self.held)
                return request
            if time.monotonic() >= deadline:
                return None

    def partial(self, request: Request, body: Sequence[bytes]) -> None:
        if self.dialect.w_partial is None:
            raise MdpError(f"{self.dialect.name} has no PARTIAL")
        self._send([self.dialect.w_partial, request.address, b"", *body])

    def reply(self, request: Request, body: Sequence[bytes]) -> None:
        """The final answer (REPLY in MDP/0.1, FINAL in MDP/0.2): the worker is ready again."""
        self.held = max(0, self.held - 1)
        self._send([self.dialect.w_final, request.address, b"", *body])

    def close(self, *, disconnect: bool = True) -> None:
        """Say DISCONNECT (RFC 7: the worker MAY at any time) and close the socket."""
        if self.socket is None:
            return
        linger_ms = 0
        if disconnect:
            self._send([self.dialect.disconnect])
            linger_ms = 100  # bounded: long enough for DISCONNECT to leave on a live link
        self.socket.close(linger_ms)
        self.socket = None


class _Disconnected(Exception):
    """The broker sent DISCONNECT."""
