"""The DEALER socket chores the client and the worker share: connect, send an outbox, drain.

Every call here is non-blocking and synchronous. The asyncio owners (``AsyncClient``,
``Worker``) wait on their ``zmq.asyncio`` socket and do their sends and receives through a
synchronous shadow of it (:func:`sync_socket`), so the blocking and the asyncio client share one
send and receive path instead of two copies.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable
from typing import Final

import zmq
import zmq.asyncio

from scale0.net.frames_io import io_key, recv_batch, send_batch

__all__ = [
    "CLOSE_LINGER_MS",
    "DRAIN_BATCH",
    "connect",
    "drain",
    "send_disconnect",
    "send_outbox",
    "sync_socket",
]

log = logging.getLogger("scale0.client")

#: Linger of a socket closed on purpose (close()): long enough for DISCONNECT to leave.
CLOSE_LINGER_MS: Final = 200
#: Messages drained per poll before timers get a turn.
DRAIN_BATCH: Final = 1000


def sync_socket(socket: zmq.Socket[bytes] | zmq.asyncio.Socket) -> zmq.Socket[bytes]:
    """A plain pyzmq view of ``socket``: itself, or a shadow of an asyncio socket (not owned)."""
    if isinstance(socket, zmq.asyncio.Socket):
        return zmq.Socket.shadow(socket.underlying)
    return socket


def connect(socket: zmq.Socket[bytes] | zmq.asyncio.Socket, endpoint: str, *, seed: bool) -> None:
    """Connect with linger 0; a seed libzmq refuses raises, a learnt endpoint only logs.

    The seed is what the caller gave: a mistake to report. An endpoint learnt from a CONFIG
    that libzmq refuses is left unconnected, so the link hears nothing and moves on (C5, W3).
    """
    socket.linger = 0
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as exc:
        if seed:
            socket.close(linger=0)
            raise
        log.warning("cannot connect to %s: %s", endpoint, exc)


def send_outbox(socket: zmq.Socket[bytes], outbox: list[list[bytes]]) -> None:
    """Send and empty ``outbox`` (one :func:`send_batch` call); a message the high-water mark
    refuses is dropped.

    zmq.Again means the broker is away: resends (C4) and renegotiation (C1) cover what is lost.
    Another failure is raised once the rest of the outbox has been tried.
    """
    if not outbox:
        return
    key = io_key(socket)
    items = [(key, frames[0], frames[1:]) for frames in outbox if frames]
    outbox.clear()
    _, failed = send_batch(items)
    for code in failed:
        if code != errno.EAGAIN:
            raise zmq.ZMQError(code)


def drain(socket: zmq.Socket[bytes], receive: Callable[[list[bytes]], None]) -> int:
    """Hand each waiting message to ``receive``, at most DRAIN_BATCH; how many there were
    (read in one :func:`recv_batch` call)."""
    messages = recv_batch(io_key(socket), DRAIN_BATCH)
    for frames in messages:
        receive(frames)
    return len(messages)


def send_disconnect(socket: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """Say DISCONNECT if the socket takes it at once; a closing owner does not wait."""
    with contextlib.suppress(zmq.ZMQError):
        socket.send_multipart(frames, zmq.NOBLOCK)
