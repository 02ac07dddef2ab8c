"""The client library's sockets: blocking :class:`Client` and asyncio :class:`AsyncClient` (§3).

Everything a client decides (negotiation, heartbeats, resends, deadlines, answers, failover:
rules C1-C7) is :mod:`scale0.session` (:class:`~scale0.session.requests.ClientSession` and
what it drives), pure and tested with numbers. The two classes here only own one DEALER each,
read the clocks, and pass what arrives to the session; both run the same turn
(:meth:`_LinkedClient._turn`: timers, a due move, send what they queued) and the same receive
path, and differ only in how they wait. ``endpoint`` names the broker in use, ``brokers`` the
known ones, ``failovers`` counts the moves (C7).

The blocking :class:`Client` only does I/O while one of its methods runs (it has no thread):
heartbeats and liveness are checked during calls, and silence while idle is not held against
the broker. Use one Client per thread. :class:`AsyncClient` runs a background task on the loop
that first uses it (it polls at least every 50 ms so new deadlines are noticed).

The errors a request raises are importable from here as well as from
:mod:`scale0.net.errors`: ``from scale0.net.client import ServiceUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import TracebackType
from typing import Final, Generic, Self, TypeVar

import zmq
import zmq.asyncio

from scale0.crypto.curve import CurveKeyPair, load_curve_secret_key
from scale0.net.dealer import (
    CLOSE_LINGER_MS,
    connect,
    drain,
    send_disconnect,
    send_outbox,
    sync_socket,
)
from scale0.net.security import TrustedKey, trust_for
from scale0.session.errors import (
    BrokerRefused,
    RequestTimeout,
    Scale0Error,
    ServiceNotFound,
    ServiceUnavailable,
    WorkerFailed,
    WorkerLost,
)
from scale0.session.failover import BACKOFF_INITIAL_S, BACKOFF_MAX_S, Failover, FailoverView
from scale0.session.link import BrokerLink, LinkEvent
from scale0.session.requests import (
    ID_PREFIX_BYTES,
    Body,
    ClientSession,
    PendingRequest,
    closed_error,
    take,
)
from scale0.session.trust import UntrustedConfig
from scale0.session.view import ClientConfig, parse_config_document
from scale0.wire.client import Disconnect
from scale0.wire.frames import SIG_CLIENT, ConfigType

__all__ = [
    "AsyncClient",
    "Body",
    "BrokerLink",
    "BrokerRefused",
    "Client",
    "ClientConfig",
    "CurveKeyPair",
    "LinkEvent",
    "RequestTimeout",
    "Scale0Error",
    "ServiceNotFound",
    "ServiceUnavailable",
    "UntrustedConfig",
    "WorkerFailed",
    "WorkerLost",
    "load_curve_secret_key",
    "parse_config_document",
]

log = logging.getLogger("scale0.client")

#: The AsyncClient's background task wakes at least this often to see new deadlines.
ASYNC_POLL_CAP_S: Final = 0.05

_S = TypeVar("_S", zmq.Socket[bytes], zmq.asyncio.Socket)
_C = TypeVar("_C", zmq.Context[zmq.Socket[bytes]], zmq.asyncio.Context)


class _LinkedClient(FailoverView, Generic[_S, _C]):
    """What Client and AsyncClient share: the session, the DEALER, one turn, one receive path."""

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
        context: _C | None = None,
        curve: CurveKeyPair | None = None,
        server_key: str | None = None,
        trusted_key: TrustedKey | None = None,
    ) -> None:
        self.timeout = timeout
        self._curve = curve
        self._context: _C | None = context
        self._link = BrokerLink(
            SIG_CLIENT,
            config_type=ConfigType(config_type),
            client_id=client_id,
            heartbeat_interval_s=heartbeat_interval,
            jitter=random.random,
            trust=trust_for(trusted_key),
        )
        self._failover = Failover(
            endpoint,
            "frontend",
            initial=backoff_initial,
            cap=backoff_max,
            jitter=random.random,
            seed_key=server_key,
        )
        self._session = ClientSession(
            self._link, retries, self._failover, id_prefix=os.urandom(ID_PREFIX_BYTES)
        )
        self._socket: _S | None = None
        self._io: zmq.Socket[bytes] | None = None  # the socket's synchronous face
        self._closed = False
        self._init_io()

    def _init_io(self) -> None:
        """What the kind of client sets up last (the blocking one connects at once)."""

    @property
    def config(self) -> ClientConfig | None:
        """What the broker told us at the last negotiation (version, family, brokers...)."""
        return self._link.config

    @property
    def client_id(self) -> str | None:
        """The session's client_id (ours, or the one the broker assigned)."""
        return self._link.client_id

    def _new_socket(self) -> _S:
        raise NotImplementedError  # each client makes the DEALER of its own kind

    def _open(self) -> None:
        """A fresh DEALER to the broker in use (C7); the link starts over (C1)."""
        self._drop_socket()
        socket = self._new_socket()
        current = self._failover.current
        connect(
            socket,
            current,
            seed=self._failover.failovers == 0,
            curve=self._curve,
            server_key=self._failover.server_key(current),
        )
        self._socket = socket
        self._io = sync_socket(socket)
        self._session.arrived(time.monotonic())
        self._flush()

    def _drop_socket(self, linger: int = 0) -> None:
        if self._socket is not None:
            self._socket.close(linger=linger)  # unsent requests go nowhere: C2 resends them
        self._socket = None
        self._io = None

    def _turn(self) -> None:
        """Timers (heartbeats, resends, deadlines), a due move, then send what they queued.

        The one resend path of both clients: whatever waits between calls to it, C4's resends
        and C7's moves happen here and nowhere else.
        """
        now = time.monotonic()
        self._session.tick(now, time.time())
        move = self._session.move
        if move is not None:
            self._drop_socket()  # leave at once (C7)
            if now >= move.at:
                self._open()
        self._flush()

    def _flush(self) -> None:
        if self._io is not None:
            send_outbox(self._io, self._link.outbox)

    def _receive_waiting(self) -> None:
        """Hand what the socket holds to the session, then send what that queued."""
        io = self._io
        if io is None:
            return
        now = time.monotonic()
        drain(io, lambda frames: self._session.receive(frames, now))
        self._flush()

    def _wait_s(self, limit: float = math.inf) -> float:
        """Seconds until the session's next timer (or ``limit``), never negative."""
        return max(0.0, min(self._session.next_wakeup(), limit) - time.monotonic())

    def _submit(self, service: str, body: Body, timeout: float | None) -> PendingRequest:
        if self._closed:
            raise Scale0Error("client closed", service=service)
        seconds = self.timeout if timeout is None else timeout
        request = self._session.submit(service, body, seconds, time.monotonic())
        self._flush()
        return request

    def _negotiation_failed(self) -> Scale0Error:
        """Why ``connect`` gives up: the broker's refusal, else a timeout."""
        refusal = self._link.refusal
        if refusal is not None:
            return BrokerRefused(refusal.message, status=refusal.code)
        if self._link.untrusted is not None:  # S3: no broker handed us a config we trust
            return self._link.untrusted
        if self._curve is None:
            hint = " (if the family serves CURVE, pass curve= and server_key=)"
        else:
            hint = (
                " (CURVE: is server_key the broker's key, and does the network config grant "
                "ours? The broker logs curve_refused)"
            )
        return RequestTimeout("the broker did not answer CHECKCONFIG" + hint)

    def _shut(self) -> None:
        """Fail what waits, say DISCONNECT and close the socket (the end of ``close``)."""
        self._session.fail_all(closed_error)
        if self._io is not None:  # None between two brokers (C7)
            send_disconnect(self._io, Disconnect(protocol=SIG_CLIENT).to_frames())
        self._drop_socket(CLOSE_LINGER_MS)


# ---- the blocking client -----------------------------------------------------------------------


class Client(_LinkedClient[zmq.Socket[bytes], zmq.Context[zmq.Socket[bytes]]]):
    """A blocking S0C1 client over a plain pyzmq DEALER. Not thread-safe: one thread owns it.

    ``request`` returns the REPLY body frames, ``request_stream`` yields each PARTIAL body and
    then the REPLY body, ``request_many`` pipelines. Errors are :mod:`scale0.net.errors` types
    (also importable from this module). Options: ``client_id``, ``config_type`` (json, xml,
    zfl), ``timeout`` and ``retries`` per request, ``heartbeat_interval``, the failover
    back-off ``backoff_initial`` / ``backoff_max`` (seconds), a pyzmq ``context``, and for a
    family that serves CURVE our key pair ``curve`` (``load_curve_secret_key``) and the seed
    broker's public key ``server_key`` (the others' come with the config, V7), and
    ``trusted_key``, the family's config-signing public key (a key file's path, its
    ``ed25519 <base64>`` text, or the key): every config is then checked against it before
    any endpoint or key in it is used (rules S1-S4, :mod:`scale0.session.trust`), and a
    config that fails is refused with :class:`UntrustedConfig`.
    """

    def _init_io(self) -> None:
        self._idle_since: float | None = None
        self._open()

    def _new_socket(self) -> zmq.Socket[bytes]:
        context = self._context if self._context is not None else zmq.Context.instance()
        return context.socket(zmq.DEALER)

    # -- public --

    def connect(self, timeout: float | None = None) -> ClientConfig:
        """Wait until the broker answered CHECKCONFIG; RequestTimeout if it does not in time."""
        limit = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._pump(lambda: self._link.negotiated, limit)
        if not self._link.negotiated or self._link.config is None:
            raise self._negotiation_failed()
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
                final, frames = take(request)
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
        in_flight: deque[PendingRequest] = deque()
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
                        final, frames = take(request)
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
        self._shut()

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

    def _pump(self, done: Callable[[], bool], limit: float = math.inf) -> None:
        """Do I/O and timers until ``done()`` or ``limit``; every request has a deadline."""
        now = time.monotonic()
        if self._idle_since is not None and now - self._idle_since > self._link.interval_s:
            self._link.resume(now)
        self._idle_since = None
        try:
            while not done():
                if time.monotonic() >= limit:
                    return
                self._turn()
                if done():
                    return
                if self._closed:
                    raise Scale0Error("client closed")
                wait = self._wait_s(limit)
                socket = self._socket
                if socket is None:  # between two brokers: the move's back-off (C7)
                    time.sleep(wait)
                elif socket.poll(math.ceil(wait * 1000), zmq.POLLIN):
                    self._receive_waiting()
        finally:
            self._idle_since = time.monotonic()


# ---- the asyncio client -----------------------------------------------------------------------


class AsyncClient(_LinkedClient[zmq.asyncio.Socket, zmq.asyncio.Context]):
    """An asyncio S0C1 client (``zmq.asyncio``): many requests may be in flight at once.

    Bound to the event loop that first uses it. ``await client.request(...)`` from any number of
    tasks pipelines them on one socket; replies are matched by ``request_id``. Takes the same
    options as :class:`Client` (``context`` is a ``zmq.asyncio.Context``).
    """

    def _init_io(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._negotiated: asyncio.Event | None = None

    def _new_socket(self) -> zmq.asyncio.Socket:
        context = self._context if self._context is not None else zmq.asyncio.Context.instance()
        return context.socket(zmq.DEALER)

    async def connect(self, timeout: float | None = None) -> ClientConfig:
        """Wait until the broker answered CHECKCONFIG; RequestTimeout if it does not in time."""
        negotiated = self._start()
        seconds = self.timeout if timeout is None else timeout
        try:
            await asyncio.wait_for(negotiated.wait(), seconds)
        except TimeoutError:
            raise self._negotiation_failed() from None
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
        woken = asyncio.Event()
        request = self._submit(service, body, timeout)
        request.wake = woken.set
        try:
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
                final, frames = take(request)
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
        self._shut()

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
                self._turn()
                self._sync_negotiated()
                if self._closed:
                    return
                wait = min(self._wait_s(), ASYNC_POLL_CAP_S)
                socket = self._socket
                if socket is None:  # between two brokers: the move's back-off (C7)
                    await asyncio.sleep(wait)
                elif await socket.poll(math.ceil(wait * 1000)):
                    self._receive_waiting()
                    self._sync_negotiated()
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
