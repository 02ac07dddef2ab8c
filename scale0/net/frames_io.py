"""Multipart send and receive for the broker's hot path: whole batches per call.

The broker reads a port's waiting messages with :func:`recv_batch` and sends a round's messages
with :func:`send_batch` (docs/performance.md). Both come in two implementations with the same
behaviour, chosen once at import:

- ``scale0.net._zmqio`` (C, built by ``pip install``): one call per batch, libzmq's own
  ``zmq_msg_recv``/``zmq_send`` with ZMQ_DONTWAIT on pyzmq's socket handle (the C source's header
  says how it finds pyzmq's libzmq). Python pays per batch, not per frame.
- pyzmq (the fallback, when the extension is not built or will not load; ``SCALE0_PURE=1``
  forces it): per-frame calls on pyzmq's Cython ``zmq.backend.Socket`` with plain int flags,
  which skip the Python wrappers' enum handling; ZMQ_EVENTS is asked before each receive, which
  processes the socket's pending commands and costs less than ending in ``zmq.Again``.

Either way a batch ends when the socket has nothing waiting, after libzmq has processed the
socket's pending commands, so an edge-triggered ZMQ_FD is safe to sleep on afterwards.

A socket is named to the batch functions by its :func:`io_key` (the libzmq handle for the C
path, the pyzmq socket for the fallback). Never pass the key of a closed socket.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any, TypeAlias

import zmq
import zmq.backend

__all__ = [
    "IMPLEMENTATION",
    "IoKey",
    "events",
    "io_key",
    "recv_batch",
    "recv_frames",
    "send_batch",
    "send_frames",
]

_send: Any = zmq.backend.Socket.send
_recv: Any = zmq.backend.Socket.recv
_get: Any = zmq.backend.Socket.get
NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | NOBLOCK
_EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)

IoKey: TypeAlias = "int | zmq.Socket[Any]"
"""What names a socket to :func:`recv_batch` / :func:`send_batch` (see :func:`io_key`)."""

SendItem: TypeAlias = "tuple[IoKey, bytes, Sequence[bytes]]"
"""One message for :func:`send_batch`: (socket key, first frame, the other frames)."""


def recv_frames(sock: zmq.Socket[Any]) -> list[bytes]:
    """One whole message, without blocking; raises zmq.Again when nothing is waiting.

    Asks each frame for its ``more`` flag on the :class:`zmq.Frame` that ``recv(copy=False)``
    returns (read in C by pyzmq), not with ``getsockopt(RCVMORE)``, whose wrapper maps the
    option to an enum on every call.
    """
    frame = _recv(sock, NOBLOCK, False)
    frames: list[bytes] = [frame.bytes]
    while frame.more:
        frame = _recv(sock, NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def send_frames(sock: zmq.Socket[Any], first: bytes, rest: Sequence[bytes]) -> None:
    """Send ``[first, *rest]`` as one message without blocking (rest may be empty)."""
    if not rest:
        _send(sock, first, NOBLOCK)
        return
    _send(sock, first, _SNDMORE_NOBLOCK)
    last = len(rest) - 1
    for i, frame in enumerate(rest):
        _send(sock, frame, NOBLOCK if i == last else _SNDMORE_NOBLOCK)


def events(sock: zmq.Socket[Any]) -> int:
    """The socket's ZMQ_EVENTS as a plain int (POLLIN/POLLOUT bits)."""
    return int(_get(sock, _EVENTS))


# ---- the pyzmq implementation of the batch calls ------------------------------------------------


def _py_io_key(sock: zmq.Socket[Any]) -> IoKey:
    return sock


def _py_recv_batch(key: Any, limit: int) -> list[list[bytes]]:
    messages: list[list[bytes]] = []
    try:
        while len(messages) < limit and events(key) & POLLIN:
            messages.append(recv_frames(key))
    except zmq.Again:
        pass
    except zmq.ZMQError:
        if not messages:
            raise  # else it comes back on the next call, as in the C implementation
    return messages


def _py_send_batch(items: Sequence[SendItem]) -> tuple[int, list[int]]:
    sent = 0
    failed: list[int] = []
    for key, first, rest in items:
        try:
            send_frames(key, first, rest)  # type: ignore[arg-type]  # the fallback's key
        except zmq.ZMQError as exc:
            failed.append(exc.errno if exc.errno is not None else errno.EIO)
        else:
            sent += 1
    return sent, failed


def _c_io_key(sock: zmq.Socket[Any]) -> IoKey:
    return int(sock.underlying)


def _load() -> tuple[str, Any, Any, Any]:
    if os.environ.get("SCALE0_PURE") != "1":
        try:
            from scale0.net import _zmqio  # noqa: PLC0415 - optional, built by pip install
        except ImportError:
            pass
        else:
            _zmqio.setup(zmq.ZMQError)
            return "c", _c_io_key, _zmqio.recv_batch, _zmqio.send_batch
    return "pyzmq", _py_io_key, _py_recv_batch, _py_send_batch


IMPLEMENTATION: str
"""Which implementation the batch calls use: ``"c"`` or ``"pyzmq"``."""
IMPLEMENTATION, _io_key, _recv_batch, _send_batch = _load()


def io_key(sock: zmq.Socket[Any]) -> IoKey:
    """What names ``sock`` to the batch calls; valid until the socket is closed."""
    key: IoKey = _io_key(sock)
    return key


def recv_batch(key: IoKey, limit: int) -> list[list[bytes]]:
    """Up to ``limit`` whole messages waiting on the socket, without blocking; [] if none.

    Raises zmq.ZMQError on a socket failure, unless messages were already read in this call
    (then they are returned and the failure comes back on the next call).
    """
    messages: list[list[bytes]] = _recv_batch(key, limit)
    return messages


def send_batch(items: Sequence[SendItem]) -> tuple[int, list[int]]:
    """Send each item as one message, in order, without blocking.

    Returns how many were sent and the errno of each one that was not (EAGAIN: high-water
    mark reached; EHOSTUNREACH: a ROUTER peer that is gone; ...). A frame that is not
    bytes-like raises TypeError (a caller's bug); the items before it were sent.
    """
    result: tuple[int, list[int]] = _send_batch(items)
    return result
