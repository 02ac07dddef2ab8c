"""The worker library: serve Python callables as services behind a broker (protocol.md §4).

:class:`Worker` runs on asyncio with ``zmq.asyncio`` (one DEALER, one event loop): ``run()``
calls ``asyncio.run(run_async())``; ``start_in_thread()`` does that in a background thread.
Tornado is not needed here: a worker has one socket and no HTTP, and Tornado 6 runs on the same
asyncio loop anyway. What the worker decides (negotiation, READY, heartbeats, liveness, where to
go next) is :class:`scale0.session.worker.WorkerSession`, pure; this module owns the socket, the
clocks and the handlers.

Handlers take the request body (``list[bytes]``), and a ``context`` (:class:`RequestContext`:
service, client id, request id) if they have a parameter of that name, and are called
according to what they are:

- ``def f(body)``: runs in a thread pool of ``capacity`` threads, so a slow handler never
  blocks heartbeats;
- ``async def f(body)``: awaited on the worker's event loop (it must not block);
- a generator (``def`` with ``yield``, stepped in the thread pool) or an async generator
  **streams**: every yielded value except the last is sent as a PARTIAL, and the last one is the
  final REPLY (status 200). A value is only known to be the last when the generator finishes, so
  each PARTIAL leaves when the *next* value is yielded. A generator that yields nothing sends an
  empty REPLY.

A value (returned or yielded) is ``bytes`` (one frame), a ``list``/``tuple`` of bytes (frames),
``str`` (UTF-8, one frame) or ``None`` (no frames). An exception in a handler, or a value of
another type, is answered REPLY 500 with body ``{"code": 500, "message": str(exc)}`` (after any
PARTIALs already sent); the worker keeps serving.

Rules:

W1  On each new socket: CHECKCONFIG, then on CONFIG/CONFIGACK send READY (services, heartbeat
    true, hbeatinterval_ms, time, config_version, capacity). FORCENEGOTIATE and every
    DISCONNECTERROR are handled by the link (scale0.session.requests C3); each renegotiation
    sends READY again.
W2  HEARTBEAT every interval: the larger of ours, the config's default and any
    ``hbeatinterval_ms`` the broker announces (§4.2); READY carries the interval in force.
    Idle beating (§3.4): a worker that has held no request for ``liveness`` intervals beats
    at the config's ``idle_heartbeat_interval_ms`` instead, saying so (``interval_ms``), and
    holds the broker to the interval the broker's HEARTBEAT says; a REQUEST makes it beat at
    its interval again.
W3  A broker silent for ``liveness`` intervals (or that does not answer CHECKCONFIG in that
    time), a broker DISCONNECT, DISCONNECTERROR 503 or 301 makes the worker leave it: the
    socket is closed (linger 0) at once and, at the move's time, a new DEALER connects to the
    next broker and starts at W1, so READY is sent there (W6). A broker restart or death is
    survived without restarting the worker.
W4  Replies belong to the socket their REQUEST came on: a reply whose socket was replaced is
    dropped (the new broker session does not know its ticket; the broker retried it elsewhere).
W5  ``stop()`` (thread-safe, idempotent) sends DISCONNECT, cancels async handlers and returns
    from ``run()`` within about 0.1 s; sync handlers already running finish in their thread and
    their replies are dropped. A DISCONNECTERROR 401 also stops the worker.
W6  Failover (protocol.md §3.9; :mod:`scale0.session.failover` V1-V6 decides): the worker is
    given one seed endpoint and learns the family's backends from each CONFIG. W3's next broker is a
    301's endpoint, else the next known backend after the one it left; the first move after a
    lasting session is immediate, further ones back off (0.1 s doubling to 5 s, jittered).
    ``endpoint`` names the broker in use and ``failovers`` counts the moves.
W7  Duplicates (protocol.md §4.3): READY asks for ``request_ids``, so the broker sends
    IDREQUEST, a REQUEST naming the client id and request id it answers (a broker that does not
    know the option sends plain REQUEST: no ids). A handler with a ``context`` parameter gets them
    (:class:`RequestContext`); ``handler(body)`` handlers are called as before. The worker
    remembers the requests it ran lately (:class:`scale0.session.recent.RecentRequests`,
    ``recent_requests`` entries, 10 minutes): the same ids again, as when a client whose
    broker died resends to the broker this worker moved to, get the stored reply (or join
    the run still going on) and the handler does not run twice. Requests forwarded from
    another broker of the family carry no ids (``context.client_id`` None) and always run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import zmq
import zmq.asyncio

from scale0.crypto.curve import CurveKeyPair
from scale0.net.dealer import (
    CLOSE_LINGER_MS,
    connect,
    drain,
    send_disconnect,
    send_outbox,
    sync_socket,
)
from scale0.net.security import TrustedKey, trust_for
from scale0.session.failover import BACKOFF_INITIAL_S, BACKOFF_MAX_S, Failover, FailoverView
from scale0.session.link import BrokerLink
from scale0.session.recent import RECENT_ENTRIES, Decision, RecentKey, RecentRequests
from scale0.session.view import ClientConfig
from scale0.session.worker import WorkerSession
from scale0.wire.client import Disconnect
from scale0.wire.frames import SIG_WORKER, ConfigType, encode_json
from scale0.wire.worker import (
    MAX_CAPACITY,
    WorkerIdRequest,
    WorkerPartial,
    WorkerReply,
    WorkerRequest,
)

__all__ = [
    "Handler",
    "RequestContext",
    "Worker",
    "WorkerThread",
    "echo_handler",
    "reply_frames",
]

log = logging.getLogger("scale0.worker")

#: A request handler: sync or async function, or (async) generator, of the body frames.
Handler = Callable[[list[bytes]], Any]

#: How often the loop looks at the stop flag (and timers) at the latest.
POLL_CAP_S: Final = 0.1

_END: Final = object()


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a handler with a ``context`` parameter learns of its request (W7).

    ``client_id`` and ``request_id`` are the client's own: the same when the client resends the
    request (to this broker or another after a failover), so an idempotent handler can key its
    effects on them. None when the broker did not say (a request forwarded from a peer)."""

    service: str
    client_id: str | None
    request_id: bytes | None
    ticket: bytes


def echo_handler(body: list[bytes]) -> list[bytes]:
    """The ``echo`` service: the request body, as is."""
    return body


def reply_frames(value: object) -> tuple[bytes, ...]:
    """Frames of a handler's value (see the module docstring); TypeError for anything else."""
    if value is None:
        return ()
    if isinstance(value, bytes):
        return (value,)
    if isinstance(value, bytearray | memoryview):
        return (bytes(value),)
    if isinstance(value, str):
        return (value.encode("utf-8"),)
    if isinstance(value, list | tuple):
        frames: list[bytes] = []
        for item in value:
            if not isinstance(item, bytes | bytearray | memoryview):
                raise TypeError(f"handler returned a frame of type {type(item).__name__}")
            frames.append(bytes(item))
        return tuple(frames)
    raise TypeError(f"handler returned {type(value).__name__}, expected bytes or list[bytes]")


def _takes_context(handler: Handler) -> bool:
    """Whether ``handler`` has a parameter named ``context`` (W7)."""
    target = handler.func if isinstance(handler, functools.partial) else handler
    try:
        return "context" in inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False


def _error_body(status: int, message: str) -> tuple[bytes, ...]:
    return (encode_json({"code": status, "message": message}),)


class Worker(FailoverView):
    """Serves ``handlers`` (service name -> callable) behind the broker at ``endpoint``."""

    def __init__(
        self,
        endpoint: str,
        handlers: Mapping[str, Handler],
        *,
        capacity: int = 1,
        heartbeat_interval: float = 1.0,
        worker_id: str | None = None,
        config_type: str = "json",
        backoff_initial: float = BACKOFF_INITIAL_S,
        backoff_max: float = BACKOFF_MAX_S,
        context: zmq.asyncio.Context | None = None,
        curve: CurveKeyPair | None = None,
        server_key: str | None = None,
        trusted_key: TrustedKey | None = None,
        recent_requests: int = RECENT_ENTRIES,
    ) -> None:
        """``curve``/``server_key``: our CURVE key pair and the seed broker's public key, for
        a family that serves CURVE (the other brokers' keys come with the config).
        ``trusted_key``: the family's config-signing public key (a key file's path, its
        ``ed25519 <base64>`` text, or the key); every config is checked against it before any
        backend or key in it is used, and one that fails is refused and logged (S1-S4,
        :mod:`scale0.session.trust`).
        ``recent_requests``: how many answered requests W7 remembers (0: none)."""
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be 1..{MAX_CAPACITY}")
        if not handlers:
            raise ValueError("a worker needs at least one handler")
        self.capacity = capacity
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._handlers = dict(handlers)
        self._wants_context = {name: _takes_context(h) for name, h in self._handlers.items()}
        self._recent = RecentRequests(max_entries=recent_requests) if recent_requests else None
        self._ticket_generation: dict[bytes, int] = {}  # W7: tickets joined to a running one
        #: Requests answered from the W7 memory instead of running the handler again.
        self.replayed = 0
        self._context = context
        self._link = BrokerLink(
            SIG_WORKER,
            config_type=ConfigType(config_type),
            client_id=worker_id,
            heartbeat_interval_s=heartbeat_interval,
            jitter=random.random,
            trust=trust_for(trusted_key),
        )
        self._curve = curve
        self._failover = Failover(
            endpoint,
            "backend",
            initial=backoff_initial,
            cap=backoff_max,
            jitter=random.random,
            seed_key=server_key,
        )
        self._session = WorkerSession(self._link, self._failover, tuple(self._handlers), capacity)
        #: Set while READY has been sent on the current connection (for tests and health).
        self.registered = threading.Event()
        self._stop = threading.Event()
        self._io: zmq.Socket[bytes] | None = None  # the socket's synchronous face
        self._generation = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False

    @property
    def services(self) -> tuple[str, ...]:
        """The services this worker announces."""
        return tuple(self._handlers)

    @property
    def config(self) -> ClientConfig | None:
        """What the broker told us at the last negotiation."""
        return self._link.config

    @property
    def worker_id(self) -> str | None:
        """The id of the session (ours, or the one the broker assigned)."""
        return self._link.client_id

    # -- running --

    def run(self) -> None:
        """Serve until :meth:`stop` (blocking; runs its own asyncio loop)."""
        asyncio.run(self.run_async())

    def stop(self) -> None:
        """Ask the worker to stop (W5). Thread-safe, idempotent, usable from signal handlers."""
        self._stop.set()

    def start_in_thread(self, name: str | None = None) -> WorkerThread:
        """Run in a daemon thread; the handle stops and joins it."""
        return WorkerThread(self, name=name)

    async def run_async(self) -> None:
        """Serve on the running loop until :meth:`stop` (W1-W5)."""
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        context = self._context if self._context is not None else zmq.asyncio.Context.instance()
        executor = ThreadPoolExecutor(self.capacity, thread_name_prefix="scale0-worker")
        try:
            while not self._stop.is_set() and not self._session.stopped:
                await self._connection(context, executor)
                move = self._session.move
                if move is not None:  # W3: the socket is closed; the next one at the move's time
                    await self._sleep(move.at - time.monotonic())
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            executor.shutdown(wait=False, cancel_futures=True)
            self._running = False

    async def _sleep(self, seconds: float) -> None:
        limit = time.monotonic() + seconds
        while not self._stop.is_set():
            left = limit - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, POLL_CAP_S))

    async def _connection(self, context: zmq.asyncio.Context, executor: ThreadPoolExecutor) -> None:
        """One socket's life: W1 until stop (W5, 401) or until the session leaves (W3)."""
        session = self._session
        socket = context.socket(zmq.DEALER)
        current = self._failover.current
        connect(
            socket,
            current,
            seed=self._failover.failovers == 0,
            curve=self._curve,
            server_key=self._failover.server_key(current),
        )
        io = sync_socket(socket)
        self._generation += 1
        generation = self._generation
        self._io = io
        session.arrived(time.monotonic())
        linger = 0

        def receive(frames: list[bytes]) -> None:
            request = session.receive(frames, time.monotonic(), time.time())
            if request is not None:
                self._dispatch(request, generation, executor)

        try:
            while not session.ended():
                if self._stop.is_set():
                    session.stop()
                    send_disconnect(io, Disconnect(protocol=SIG_WORKER).to_frames())
                    linger = CLOSE_LINGER_MS
                    return
                session.tick(time.monotonic(), time.time(), bool(self._tasks))
                send_outbox(io, session.outbox)
                self._sync_registered()
                if session.ended():
                    return
                wait = min(session.next_wakeup() - time.monotonic(), POLL_CAP_S)
                if await socket.poll(max(0, int(wait * 1000)) + 1):
                    drain(io, receive)
                    send_outbox(io, session.outbox)
                    self._sync_registered()
        finally:
            self.registered.clear()
            self._io = None
            socket.close(linger=linger)

    def _sync_registered(self) -> None:
        if self._session.registered:
            self.registered.set()
        else:
            self.registered.clear()

    async def _send(self, generation: int, frames: list[bytes]) -> None:
        self._session.link.note_work(time.monotonic())  # a reply: not idle yet (W2, §3.4)
        io = self._io
        if io is None or generation != self._generation:
            log.debug("reply dropped: its connection is gone (W4)")
            return
        send_outbox(io, [frames])

    # -- serving requests --

    def _dispatch(
        self,
        request: WorkerRequest | WorkerIdRequest,
        generation: int,
        executor: ThreadPoolExecutor,
    ) -> None:
        client_id: str | None = None
        request_id: bytes | None = None
        if isinstance(request, WorkerIdRequest):  # W7 (a broker that knows request_ids)
            client_id, request_id = request.client_id or None, request.request_id or None
            request = request.plain()
        context = RequestContext(request.service, client_id, request_id, request.ticket)
        key: RecentKey | None = None
        recent = self._recent
        if recent is not None and client_id is not None and request_id is not None:
            key = (request.service, client_id, request_id)
            decision = recent.begin(key, request.ticket, time.monotonic())
            if decision is Decision.JOIN:
                self._ticket_generation[request.ticket] = generation
                return
            if decision is Decision.REPLAY:
                self.replayed += 1
                status, body = recent.reply_of(key)
                self._sync_send(generation, WorkerReply(request.ticket, status, body).to_frames())
                return
        coroutine = self._serve(request, context, key, generation, executor)
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _sync_send(self, generation: int, frames: list[bytes]) -> None:
        io = self._io
        if io is not None and generation == self._generation:
            send_outbox(io, [frames])

    async def _serve(
        self,
        request: WorkerRequest,
        context: RequestContext,
        key: RecentKey | None,
        generation: int,
        executor: ThreadPoolExecutor,
    ) -> None:
        try:
            reply = await self._run(request, context, generation, executor)
        except BaseException:
            if key is not None and self._recent is not None:
                self._recent.abandoned(key)
            raise
        if key is None or self._recent is None:
            await self._send(generation, reply.to_frames())
            return
        # W7: remember it; answer every ticket it was asked under (the newest is the one the
        # broker in use knows; a ticket of a connection since replaced is dropped, W4).
        tickets = self._recent.finished(key, reply.status, reply.body, time.monotonic())
        for ticket in tickets or [request.ticket]:
            ticket_generation = self._ticket_generation.pop(ticket, generation)
            answer = WorkerReply(ticket, reply.status, reply.body)
            await self._send(ticket_generation, answer.to_frames())

    async def _run(
        self,
        request: WorkerRequest,
        context: RequestContext,
        generation: int,
        executor: ThreadPoolExecutor,
    ) -> WorkerReply:
        ticket = request.ticket
        handler = self._handlers.get(request.service)
        if handler is None:
            message = f"this worker does not serve {request.service!r}"
            return WorkerReply(ticket, 404, _error_body(404, message))
        if self._wants_context.get(request.service):
            with_context: Callable[..., Any] = handler
            handler = functools.partial(with_context, context=context)
        try:
            held: object = _END
            async for value in self._values(handler, list(request.body), executor):
                if held is not _END:
                    partial = WorkerPartial(ticket, reply_frames(held))
                    await self._send(generation, partial.to_frames())
                held = value
            body = () if held is _END else reply_frames(held)
            reply = WorkerReply(ticket, 200, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("handler for %r failed: %r", request.service, exc, exc_info=True)
            reply = WorkerReply(ticket, 500, _error_body(500, str(exc) or type(exc).__name__))
        return reply

    async def _values(
        self, handler: Handler, body: list[bytes], executor: ThreadPoolExecutor
    ) -> AsyncIterator[object]:
        """The values a handler produces: one for a function, each yield for a generator."""
        loop = asyncio.get_running_loop()
        target = handler.func if isinstance(handler, functools.partial) else handler
        if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target):
            result: Any = handler(body)
        else:
            result = await loop.run_in_executor(executor, handler, body)
        if inspect.isawaitable(result):  # e.g. a sync callable returning a coroutine
            result = await result
        if inspect.isasyncgen(result):
            try:
                async for value in result:
                    yield value
            finally:
                await result.aclose()
        elif isinstance(result, Generator):
            try:
                while True:
                    value = await loop.run_in_executor(executor, next, result, _END)
                    if value is _END:
                        return
                    yield value
            finally:
                # ValueError: still running in its thread (we were cancelled); it ends there.
                with contextlib.suppress(ValueError):
                    result.close()
        else:
            yield result


class WorkerThread:
    """A :class:`Worker` running in a daemon thread (tests, embedding)."""

    def __init__(self, worker: Worker, *, name: str | None = None) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, name=name or f"scale0-worker-{os.getpid()}", daemon=True
        )
        self._thread.start()

    def _main(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.error = exc
            log.exception("worker thread failed")

    def wait_registered(self, timeout: float) -> bool:
        """True once READY was sent on the current connection, False after ``timeout``."""
        return self.worker.registered.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the worker and wait up to ``timeout`` seconds for its thread."""
        self.worker.stop()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread; raise if the worker failed."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
