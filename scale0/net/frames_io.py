"""Multipart send and receive for the broker's hot path: whole batches per call.

The broker reads a port's waiting messages with :func:`recv_batch` (a CURVE port's with
:func:`recv_batch_keyed`, which also gives each message's sender's key) and sends a round's
messages with :func:`send_batch` (docs/performance.md). All come in two implementations with
the same behaviour, chosen once at import:

- ``scale0.net._zmqio`` (C, built by ``pip install``): one call per batch, libzmq's own
  ``zmq_msg_recv``/``zmq_send`` with ZMQ_DONTWAIT on pyzmq's socket handle (the C source's header
  says how it finds pyzmq's libzmq). Python pays per batch, not per frame.
- pyzmq (the fallback, when the extension is not built or will not load; ``SCALE0_PURE=1``
  forces it): per-frame calls on pyzmq's Cython ``zmq.backend.Socket`` with plain int flags,
  which skip the Python wrappers' enum handling; ZMQ_EVENTS is asked before each receive, which
  processes the socket's pending commands and costs less than ending in ``zmq.Again``.

Either way a batch ends when the socket has nothing waiting, after libzmq has processed the
socket's pending commands, so an edge-triggered ZMQ_FD is safe to sleep on afterwards. Either
way a send batch is checked whole before its first frame goes out, and a bad frame refuses the
batch (TypeError naming message and frame): a socket is never left mid-message by a bad frame.

A socket is named to the batch functions by its :func:`io_key` (the libzmq handle for the C
path, the pyzmq socket for the fallback). Never pass the key of a closed socket.
"""

from __future__ import annotations

import contextlib
import errno
import os
import weakref
from collections.abc import Sequence
from typing import Any, TypeAlias

import zmq
import zmq.backend

from scale0.wire import hot
from scale0.wire.hot import BeatItem, HotItem

__all__ = [
    "IMPLEMENTATION",
    "IoKey",
    "batch_fds",
    "events",
    "heartbeat_items",
    "hot_items",
    "io_key",
    "recv_batch",
    "recv_batch_keyed",
    "recv_frames",
    "send_batch",
    "send_frames",
    "track_connections",
]

_Socket: Any = zmq.backend.Socket
_send: Any = zmq.backend.Socket.send
_recv: Any = zmq.backend.Socket.recv
_get: Any = zmq.backend.Socket.get
NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | NOBLOCK
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)
_SRCFD = int(zmq.SRCFD)
_USER_ID = "User-Id"
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
    return _recv_message(sock)[0]


def _recv_message(
    sock: zmq.Socket[Any], with_fd: bool = False, keys: list[str] | None = None
) -> tuple[list[bytes], int]:
    """:func:`recv_frames`, and (``with_fd``) the fd of the connection it came over (-1: not
    known, or not asked); with ``keys``, the sender's key (:func:`_frame_key`) is appended
    to it once the whole message is read."""
    try:
        frame = _recv(sock, NOBLOCK, False)
        frames: list[bytes] = [frame.bytes]
        fd = -1
        if with_fd:
            with contextlib.suppress(zmq.ZMQError):
                fd = int(frame.get(_SRCFD))
        key = "" if keys is None else _frame_key(frame)
        while frame.more:
            frame = _recv(sock, NOBLOCK, False)
            frames.append(frame.bytes)
    except BaseException:
        # pyzmq runs Python's signal handlers after each call: one that raised (Ctrl-C) between
        # two frames lost this message's frames so far. Drop the rest too, or the next call
        # would return its tail as a message of its own.
        _discard_rest(sock)
        raise
    if keys is not None:
        keys.append(key)
    return frames, fd


def _frame_key(frame: zmq.Frame) -> str:
    """The ``User-Id`` property of a message's first frame (the sender's CURVE key, Z85, as
    ZAP set it); "" when it has none (no ZAP, not CURVE), or one that is not UTF-8 (pyzmq
    raises for both; the C path says "" too)."""
    try:
        key = frame.get(_USER_ID)
    except (zmq.ZMQError, UnicodeDecodeError):
        return ""
    return key if isinstance(key, str) else ""


def _discard_rest(sock: zmq.Socket[Any]) -> None:
    """Read and drop what is left of a message whose first frames were read.

    RCVMORE is the ``more`` flag of the last frame libzmq handed over, received or lost; libzmq
    delivers a message whole, so the loop ends at its last frame.
    """
    while _get(sock, _RCVMORE):
        _recv(sock, NOBLOCK, False)


def send_frames(sock: zmq.Socket[Any], first: bytes, rest: Sequence[bytes]) -> None:
    """Send ``[first, *rest]`` as one message without blocking (rest may be empty).

    Every frame is checked before the first is sent (see :func:`send_batch`): a frame that is
    not bytes-like raises TypeError naming it, and nothing is sent.
    """
    _send_message(sock, _message_frames(0, first, rest))


def _send_message(sock: Any, frames: list[Any]) -> None:
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _send(sock, frame, NOBLOCK if i == last else _SNDMORE_NOBLOCK)


def _not_bytes(message: int, index: int, frame: object) -> TypeError:
    return TypeError(
        f"send_batch: message {message}, frame {index}: {type(frame).__name__} is not a "
        "contiguous bytes-like object; nothing in this batch was sent"
    )


def _message_frames(message: int, first: Any, rest: Any) -> list[Any]:
    """Our own list of one message's frames, each bytes or a held view; raises TypeError.

    The list holds a reference to every frame, and a memoryview holds each buffer that is not
    bytes, until the message is sent, whatever Python code runs meanwhile.
    """
    try:
        frames = [first, *rest]
    except TypeError as exc:
        raise TypeError(
            f"send_batch: message {message}: its other frames are not a sequence; "
            "nothing in this batch was sent"
        ) from exc
    for index, frame in enumerate(frames):
        if type(frame) is bytes:
            continue
        try:
            view = memoryview(frame)
        except TypeError as exc:
            raise _not_bytes(message, index, frame) from exc
        if not view.c_contiguous:  # as the C path's PyBUF_SIMPLE view requires
            view.release()
            raise _not_bytes(message, index, frame)
        frames[index] = view
    return frames


def events(sock: zmq.Socket[Any]) -> int:
    """The socket's ZMQ_EVENTS as a plain int (POLLIN/POLLOUT bits)."""
    return int(_get(sock, _EVENTS))


# ---- the pyzmq implementation of the batch calls ------------------------------------------------


def _py_io_key(sock: zmq.Socket[Any]) -> IoKey:
    return sock


_py_fds: list[int] = []  # batch_fds() of the fallback
# Sockets whose messages the fallback asks for their fd (track_connections): asking costs a
# call per message, and raises (a ZMQError, and pending signal handlers run) on inproc.
_py_tracked: weakref.WeakSet[Any] = weakref.WeakSet()


def _py_read(key: Any, limit: int, keys: list[str] | None) -> list[list[bytes]]:
    """Up to ``limit`` whole messages, their connections' fds kept for :func:`_py_batch_fds`
    and (``keys``) each one's User-Id appended: both receives of the pyzmq implementation."""
    messages: list[list[bytes]] = []
    fds: list[int] = []
    _py_fds.clear()
    with_fd = key in _py_tracked
    try:
        while len(messages) < limit and events(key) & POLLIN:
            frames, fd = _recv_message(key, with_fd, keys)
            messages.append(frames)
            fds.append(fd)
    except zmq.Again:
        pass
    except zmq.ZMQError:
        if not messages:
            raise  # else it comes back on the next call, as in the C implementation
    _py_fds.extend(fds)
    return messages


def _py_recv_batch(key: Any, limit: int) -> list[list[bytes]]:
    return _py_read(key, limit, None)


def _py_recv_batch_keyed(key: Any, limit: int) -> tuple[list[list[bytes]], list[str]]:
    keys: list[str] = []
    return _py_read(key, limit, keys), keys


def _py_batch_fds() -> list[int]:
    return list(_py_fds)


def _py_send_batch(items: Sequence[SendItem]) -> tuple[int, list[int]]:
    # Checked whole first, as in the C implementation (send_batch says why).
    try:
        entries = tuple(items)
    except TypeError as exc:
        raise TypeError(
            "send_batch takes a sequence of (socket key, first frame, [other frames]); "
            "nothing was sent"
        ) from exc
    batch: list[tuple[Any, list[Any]]] = []
    for message, entry in enumerate(entries):
        if not isinstance(entry, tuple) or len(entry) != 3:
            raise TypeError(
                f"send_batch: message {message} is not a (socket key, first frame, "
                "[other frames]) tuple; nothing in this batch was sent"
            )
        key, first, rest = entry
        if not isinstance(key, _Socket):
            raise TypeError(
                f"send_batch: message {message}: the socket key is not a pyzmq socket; "
                "nothing in this batch was sent"
            )
        batch.append((key, _message_frames(message, first, rest)))
    sent = 0
    failed: list[int] = []
    for key, frames in batch:
        try:
            _send_message(key, frames)
        except zmq.ZMQError as exc:
            failed.append(exc.errno if exc.errno is not None else errno.EIO)
        else:
            sent += 1
    return sent, failed


def _c_io_key(sock: zmq.Socket[Any]) -> IoKey:
    return int(sock.underlying)


def _load() -> tuple[str, Any, Any, Any, Any, Any]:
    if os.environ.get("SCALE0_PURE") != "1":
        try:
            from scale0.net import _zmqio  # noqa: PLC0415 - optional, built by pip install
        except ImportError:
            pass
        else:
            # (an extension built before recv_batch_keyed: the fallback, which has it)
            if hasattr(_zmqio, "recv_batch_keyed"):
                _zmqio.setup(zmq.ZMQError)
                return (
                    "c",
                    _c_io_key,
                    _zmqio.recv_batch,
                    _zmqio.recv_batch_keyed,
                    _zmqio.send_batch,
                    _zmqio.batch_fds,
                )
    return (
        "pyzmq",
        _py_io_key,
        _py_recv_batch,
        _py_recv_batch_keyed,
        _py_send_batch,
        _py_batch_fds,
    )


IMPLEMENTATION: str
"""Which implementation the batch calls use: ``"c"`` or ``"pyzmq"``."""
IMPLEMENTATION, _io_key, _recv_batch, _recv_batch_keyed, _send_batch, _batch_fds = _load()


def _reader(name: str) -> Any:
    """The C reader ``name`` of ``_zmqio`` with the C batch calls, else scale0.wire.hot's."""
    if IMPLEMENTATION == "c":
        from scale0.net import _zmqio  # noqa: PLC0415 - loaded above

        if hasattr(_zmqio, name):  # (an extension built before it: Python's)
            return getattr(_zmqio, name)
    return getattr(hot, name)


_heartbeat_items: Any = _reader("heartbeat_items")
_hot_items: Any = _reader("hot_items")


def heartbeat_items(
    batch: list[list[bytes]], signature: bytes, max_frame_bytes: int
) -> list[BeatItem]:
    """:func:`scale0.wire.hot.heartbeat_items`: ``batch`` with each plain HEARTBEAT read into
    ``(routing_id, time, config_version, interval_ms)``; in C with the C batch calls (one pass
    over the batch, no regular expression), else the Python reader itself. Both give the same
    items."""
    items: list[BeatItem] = _heartbeat_items(batch, signature, max_frame_bytes)
    return items


def hot_items(
    batch: list[list[bytes]], signature: bytes, max_frame_bytes: int, names: dict[bytes, str]
) -> list[HotItem]:
    """:func:`scale0.wire.hot.hot_items`: ``batch`` with each plain HEARTBEAT, and each plain
    REQUEST (``signature`` S0C1) or REPLY (S0W1), read into a tuple of its fields; in C with the
    C batch calls, else the Python reader itself. Both give the same items."""
    items: list[HotItem] = _hot_items(batch, signature, max_frame_bytes, names)
    return items


def io_key(sock: zmq.Socket[Any]) -> IoKey:
    """What names ``sock`` to the batch calls; valid until the socket is closed."""
    key: IoKey = _io_key(sock)
    return key


def recv_batch(key: IoKey, limit: int) -> list[list[bytes]]:
    """Up to ``limit`` whole messages waiting on the socket, without blocking; [] if none.

    Raises zmq.ZMQError on a socket failure, unless messages were already read in this call
    (then they are returned and the failure comes back on the next call). A receive
    interrupted by a signal (EINTR) is retried, as in :func:`send_batch`. A message is never
    split: if a signal handler raises (Ctrl-C) mid-message on the fallback, or memory runs
    out, the rest of that message is read and dropped before the exception goes on, so the
    next call does not return its tail as a message of its own. (On the C path a handler
    raises once the call has returned, and the batch it returned is lost with it.)
    """
    messages: list[list[bytes]] = _recv_batch(key, limit)
    return messages


def recv_batch_keyed(key: IoKey, limit: int) -> tuple[list[list[bytes]], list[str]]:
    """:func:`recv_batch` on a CURVE server, and for each message, in step, its sender's CURVE
    key: the ``User-Id`` property of its first frame, which ZAP set for the connection when it
    admitted it (pyzmq's authenticator: the client's public key, Z85). A message without one
    (no ZAP handler, a socket that is not a CURVE server), or whose ``User-Id`` is not UTF-8,
    gets ``""`` (no key) and is returned whole like any other. :func:`batch_fds` names each
    message's connection, as after :func:`recv_batch`.
    """
    result: tuple[list[list[bytes]], list[str]] = _recv_batch_keyed(key, limit)
    return result


def track_connections(sock: zmq.Socket[Any]) -> None:
    """Make :func:`batch_fds` name the connection of each message read from ``sock`` (a TCP
    ROUTER). The C path always does, at no cost worth saying; the fallback only for these."""
    if IMPLEMENTATION == "pyzmq":
        _py_tracked.add(sock)


def batch_fds() -> list[int]:
    """For each message the last :func:`recv_batch` returned, in order, the file descriptor of
    the connection it came over (libzmq's ZMQ_SRCFD; -1 when libzmq did not say, or, on the
    fallback, for a socket not given to :func:`track_connections`). The same after
    :func:`recv_batch_keyed`. Valid until the next receive batch, on any socket."""
    fds: list[int] = _batch_fds()
    return fds


def send_batch(items: Sequence[SendItem]) -> tuple[int, list[int]]:
    """Send each item as one message, in order, without blocking.

    Returns how many were sent and the errno of each one that was not (EAGAIN: high-water
    mark reached; EHOSTUNREACH: a ROUTER peer that is gone; ...).

    The whole batch is checked before its first frame is sent. An item that is not a
    (key, first, rest) tuple, or a frame that is not a contiguous bytes-like object (a
    caller's bug), raises TypeError naming the message and the frame (``message 3, frame 2``;
    frame 0 is ``first``), and nothing of the batch is sent: a frame refused after earlier
    frames of its message went out would leave the socket mid-message, and the next message
    sent on it would be spliced onto the broken one. Frames are held (a reference each, and a
    buffer view on each that is not bytes) until sent.

    A send interrupted by a signal (EINTR) is retried, as pyzmq does. The C code runs
    Python's signal handlers when the call returns, never between two frames of a message;
    pyzmq runs them after each frame, so on the fallback a handler that raises (Ctrl-C) can
    still leave a socket mid-message.
    """
    result: tuple[int, list[int]] = _send_batch(items)
    return result
