"""Test helper: raw pyzmq DEALERs speaking S0P/1 to a broker, built from the wire classes.

``Dealer(ctx, endpoint, SIG_CLIENT)`` connects with linger 0; ``send`` encodes a message,
``recv`` decodes one (bounded wait, HEARTBEATs skipped unless asked for), ``recv_or_none``
returns None on silence. ``client``/``worker`` return negotiated (CHECKCONFIG done) dealers.
``Router(ctx, SIG_CLIENT)`` is the other side: a fake broker socket bound on a free loopback
port, which decodes what clients or workers send and answers whatever a test makes it say.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import zmq

from scale0.wire import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    SIG_CLIENT,
    SIG_WORKER,
    CheckConfig,
    Config,
    ConfigAck,
    ConfigType,
    Heartbeat,
    Message,
    Ready,
    decode_from_broker,
    decode_to_broker,
    encode,
)

__all__ = ["Dealer", "Router", "client", "negotiate", "worker"]

M = TypeVar("M", bound=Message)

RECV_TIMEOUT_S = 5.0


class Dealer:
    """One DEALER connection to a broker socket."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, signature: bytes) -> None:
        self.signature = signature
        self.socket: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 5000)  # a send that blocks this long fails the test
        self.socket.connect(endpoint)

    def send(self, message: Message) -> None:
        self.socket.send_multipart(encode(message))

    def send_frames(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def recv_frames(self, timeout_s: float = RECV_TIMEOUT_S) -> list[bytes] | None:
        if self.socket.poll(int(timeout_s * 1000), zmq.POLLIN):
            return self.socket.recv_multipart()
        return None

    def recv_or_none(
        self, timeout_s: float = RECV_TIMEOUT_S, *, heartbeats: bool = False
    ) -> Message | None:
        deadline = time.monotonic() + timeout_s
        while True:
            frames = self.recv_frames(max(0.0, deadline - time.monotonic()))
            if frames is None:
                return None
            message = decode_from_broker(frames, signature=self.signature, max_frame_bytes=1 << 30)
            if heartbeats or not isinstance(message, Heartbeat):
                return message

    def recv(self, cls: type[M], timeout_s: float = RECV_TIMEOUT_S, **kw: bool) -> M:
        message = self.recv_or_none(timeout_s, **kw)
        if message is None:
            raise TimeoutError(f"no {cls.__name__} within {timeout_s} s")
        if not isinstance(message, cls):
            raise AssertionError(f"expected {cls.__name__}, got {message!r}")
        return message

    def drain(self) -> int:
        """Throw away whatever is queued; returns how many messages that was."""
        count = 0
        while self.socket.poll(0, zmq.POLLIN):
            self.socket.recv_multipart()
            count += 1
        return count

    def expect_command(self, command: bytes, timeout_s: float = RECV_TIMEOUT_S) -> list[bytes]:
        """Frames of the next message whose command (frame 2) is ``command``; others skipped.

        Works on raw frames, so it also sees commands the wire table cannot decode this way.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            frames = self.recv_frames(max(0.0, deadline - time.monotonic()))
            if frames is None:
                raise TimeoutError(f"no {command!r} within {timeout_s} s")
            if len(frames) > 2 and frames[1] == self.signature and frames[2] == command:
                return frames

    def close(self) -> None:
        self.socket.close(linger=0)

    def __enter__(self) -> Dealer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Router:
    """A raw ROUTER standing in for a broker's frontend (SIG_CLIENT) or backend (SIG_WORKER).

    Bound to ``tcp://127.0.0.1:*`` (``endpoint`` has the real port); ``recv`` returns
    ``(routing_id, message)`` decoded as a broker would (HEARTBEATs skipped unless asked for),
    ``send`` answers one routing id with a message built from the wire classes.
    """

    def __init__(self, ctx: zmq.Context[Any], signature: bytes) -> None:
        self.signature = signature
        self.signatures = FRONTEND_SIGNATURES if signature == SIG_CLIENT else BACKEND_SIGNATURES
        self.socket: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 5000)
        self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint: str = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def recv(
        self, cls: type[M], timeout_s: float = RECV_TIMEOUT_S, *, heartbeats: bool = False
    ) -> tuple[bytes, M]:
        """The next message of type ``cls`` (others but HEARTBEAT are a test failure)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.socket.poll(int(left * 1000) + 1, zmq.POLLIN):
                raise TimeoutError(f"no {cls.__name__} within {timeout_s} s")
            routing_id, *frames = self.socket.recv_multipart()
            message = decode_to_broker(frames, max_frame_bytes=1 << 30, signatures=self.signatures)
            if isinstance(message, Heartbeat) and not heartbeats:
                continue
            if not isinstance(message, cls):
                raise AssertionError(f"expected {cls.__name__}, got {message!r}")
            return routing_id, message

    def send(self, routing_id: bytes, message: Message) -> None:
        self.socket.send_multipart([routing_id, *encode(message)])

    def close(self) -> None:
        self.socket.close(linger=0)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def negotiate(dealer: Dealer, config_version: int | None = 1) -> Config | ConfigAck:
    """CHECKCONFIG; naming the broker's config_version gets CONFIGACK, None gets CONFIG."""
    dealer.send(CheckConfig(ConfigType.JSON, config_version, protocol=dealer.signature))
    message = dealer.recv(Message)
    if not isinstance(message, Config | ConfigAck):
        raise AssertionError(f"CHECKCONFIG got {message!r}")
    return message


def client(ctx: zmq.Context[Any], endpoint: str) -> Dealer:
    """A client DEALER that has done CHECKCONFIG."""
    dealer = Dealer(ctx, endpoint, SIG_CLIENT)
    try:
        negotiate(dealer)
    except BaseException:
        dealer.close()
        raise
    return dealer


def worker(ctx: zmq.Context[Any], endpoint: str, services: tuple[str, ...], **ready: Any) -> Dealer:
    """A worker DEALER that has done CHECKCONFIG and READY for ``services``."""
    dealer = Dealer(ctx, endpoint, SIG_WORKER)
    try:
        negotiate(dealer)
        options: dict[str, Any] = {
            "heartbeat": True,
            "hbeatinterval_ms": 1000,
            "time": time.time(),
            "config_version": 1,
        }
        options.update(ready)
        dealer.send(Ready(services, **options))
    except BaseException:
        dealer.close()
        raise
    return dealer
