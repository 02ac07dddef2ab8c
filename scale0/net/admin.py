"""Management I/O: credential checks in a thread pool, family fan-out, and the admin client.

:class:`ManagementBridge` performs the core's management effects for a :class:`BrokerNode`:
``Authenticate`` runs the scrypt check (``scale0.core.admin.check_credentials``) in a small
thread pool, never on the IOLoop thread, and feeds back ``ManagementCall``; ``FanOut`` sends
the same MANAGEMENTREQ to every other broker's frontend over its own DEALER, waits at most the
effect's timeout, and feeds back ``FanOutDone`` with each answer (or None: did not answer).

:func:`call` is the blocking client side (scale0ctl, scripts): one MANAGEMENTREQ, one answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import zmq
import zmq.asyncio
from tornado.ioloop import IOLoop

from scale0.config.model import Admin
from scale0.core.commands import check_credentials
from scale0.core.effects import (
    Authenticate,
    Event,
    FamilyAnswer,
    FanOut,
    FanOutDone,
    ManagementCall,
)
from scale0.crypto.curve import CurveKeyPair
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.client import DisconnectError
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import SIG_CLIENT, JsonValue
from scale0.wire.registry import decode_from_broker, encode

__all__ = ["AUTH_THREADS", "ManagementBridge", "NoAnswer", "Refused", "call", "new_request_id"]

#: Threads that run scrypt checks; two keeps a burst of logins from taking every core.
AUTH_THREADS: Final = 2
#: Largest frame the admin side accepts in an answer (family results can be large).
MAX_ANSWER_FRAME_BYTES: Final = 64 << 20

_ids = itertools.count(1)


def new_request_id() -> str:
    """A management request_id unique in this process (pid, counter)."""
    return f"{os.getpid()}-{next(_ids)}"


class NoAnswer(Exception):
    """The broker did not answer within the timeout (it may be stopped or unreachable)."""

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        super().__init__(f"no answer from {endpoint} within {timeout_s:g} s")
        self.endpoint = endpoint
        self.timeout_s = timeout_s


class Refused(Exception):
    """The broker answered DISCONNECTERROR instead (429 banned, 400 malformed, ...)."""

    def __init__(self, endpoint: str, code: int, message: str) -> None:
        super().__init__(f"{endpoint} refused the request: {code} {message}")
        self.endpoint = endpoint
        self.code = code
        self.message = message


def _answer_of(frames: list[bytes], request_id: str) -> ManagementReply | DisconnectError | None:
    """The answer to ``request_id`` in ``frames``, or None for anything else (skipped)."""
    try:
        message = decode_from_broker(
            frames, signature=SIG_CLIENT, max_frame_bytes=MAX_ANSWER_FRAME_BYTES
        )
    except ProtocolError:
        return None
    if isinstance(message, ManagementReply) and message.request_id == request_id:
        return message
    if isinstance(message, DisconnectError):
        return message
    return None


def call(
    endpoint: str,
    auth_id: str,
    password: str,
    command: str,
    args: dict[str, JsonValue] | None = None,
    *,
    timeout_s: float = 5.0,
    context: zmq.Context[Any] | None = None,
    curve: CurveKeyPair | None = None,
    server_key: str | None = None,
) -> ManagementReply:
    """Send one MANAGEMENTREQ to ``endpoint`` and return its MANAGEMENTREP (any code).

    Raises :class:`NoAnswer` after ``timeout_s`` and :class:`Refused` on DISCONNECTERROR.
    ``curve`` and ``server_key``: our CURVE key pair and the broker's key, when it serves CURVE.
    """
    request = ManagementRequest(
        auth_id=auth_id,
        auth_password=password,
        command=command,
        request_id=new_request_id(),
        args=dict(args or {}),
    )
    ctx = context if context is not None else zmq.Context.instance()
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * MAX_ANSWER_FRAME_BYTES)
        if curve is not None and server_key is not None:
            sock.curve_serverkey = server_key.encode("ascii")
            sock.curve_publickey = curve.public.encode("ascii")
            sock.curve_secretkey = curve.secret.encode("ascii")
        sock.connect(endpoint)
        deadline = time.monotonic() + timeout_s
        sock.send_multipart(encode(request))
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
                break
            answer = _answer_of(sock.recv_multipart(), request.request_id)
            if isinstance(answer, DisconnectError):
                raise Refused(endpoint, answer.code, answer.message)
            if answer is not None:
                return answer
        raise NoAnswer(endpoint, timeout_s)
    finally:
        sock.close(linger=0)


class ManagementBridge:
    """Performs ``Authenticate`` and ``FanOut`` for one node; feeds the results back in."""

    def __init__(
        self,
        feed: Callable[[Event], None],
        admins: Callable[[], tuple[Admin, ...]],
        logger: logging.Logger,
    ) -> None:
        self._feed = feed
        self._admins = admins
        self._logger = logger
        self._executor: ThreadPoolExecutor | None = None
        self._context: zmq.asyncio.Context | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: For a fan-out to a broker that serves CURVE: (our key pair, its key), else None.
        self.curve_for: Callable[[str], tuple[CurveKeyPair, str] | None] = lambda _e: None

    def perform(self, effect: Authenticate | FanOut) -> None:
        if self._closed:
            return
        if isinstance(effect, Authenticate):
            self._authenticate(effect)
        else:
            task = asyncio.ensure_future(self._fan_out(effect))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def check_credentials_async(self, auth_id: str, password: str) -> Future[Admin | None]:
        """The blocking check in the pool (for the HTTP login); resolve it on the loop."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(AUTH_THREADS, thread_name_prefix="scale0-auth")
        return self._executor.submit(check_credentials, self._admins(), auth_id, password)

    def close(self) -> None:
        """Cancel fan-outs, drop pending checks, close the DEALERs; idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    # ---- Authenticate -------------------------------------------------------------------------

    def _authenticate(self, effect: Authenticate) -> None:
        request = effect.request
        future = self.check_credentials_async(request.auth_id, request.auth_password)
        loop = IOLoop.current()
        # The pool thread finishes the future; add_callback brings the result to the loop thread.
        future.add_done_callback(lambda done: loop.add_callback(self._checked, effect, done))

    def _checked(self, effect: Authenticate, done: Future[Admin | None]) -> None:
        if self._closed:
            return
        try:
            ok = done.result() is not None
        except Exception:  # a bug in the check must not leave the request hanging
            self._logger.exception("credential check failed")
            ok = False
        self._feed(
            ManagementCall(effect.channel, effect.routing_id, effect.sender, effect.request, ok)
        )

    # ---- FanOut -------------------------------------------------------------------------------

    async def _fan_out(self, effect: FanOut) -> None:
        if self._context is None:
            self._context = zmq.asyncio.Context()
        answers = await asyncio.gather(
            *(
                self._ask(endpoint, effect.request, effect.timeout_s)
                for _, endpoint in effect.targets
            )
        )
        if self._closed:
            return
        self._feed(
            FanOutDone(
                effect.token,
                tuple(
                    FamilyAnswer(identity, answer)
                    for (identity, _), answer in zip(effect.targets, answers, strict=True)
                ),
            )
        )

    async def _ask(
        self, endpoint: str, request: ManagementRequest, timeout_s: float
    ) -> ManagementReply | None:
        assert self._context is not None  # set by _fan_out
        sock = self._context.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, 2 * MAX_ANSWER_FRAME_BYTES)
            curve = self.curve_for(endpoint)
            if curve is not None:
                pair, server_key = curve
                sock.curve_serverkey = server_key.encode("ascii")
                sock.curve_publickey = pair.public.encode("ascii")
                sock.curve_secretkey = pair.secret.encode("ascii")
            sock.connect(endpoint)
            deadline = time.monotonic() + timeout_s
            await sock.send_multipart(encode(request))
            while (left := deadline - time.monotonic()) > 0:
                if not await sock.poll(timeout=max(1, int(left * 1000))):
                    break
                answer = _answer_of(await sock.recv_multipart(), request.request_id)
                if isinstance(answer, DisconnectError):
                    # Refused outright (banned, malformed): an answer, not silence.
                    return ManagementReply(request.request_id, answer.code, None, answer.message)
                if answer is not None:
                    return answer
            return None
        except zmq.ZMQError as exc:
            self._logger.warning("fan-out to %s failed: %s", endpoint, exc)
            return None
        finally:
            sock.close(linger=0)
