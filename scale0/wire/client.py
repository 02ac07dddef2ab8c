"""Client channel messages (S0C1, protocol.md §3) and the control commands all families share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final, Self

from scale0.wire.errors import ProtocolError
from scale0.wire.frames import (
    ED25519_HEX,
    EMPTY,
    SHA256_HEX,
    SIG_CLIENT,
    ConfigType,
    Message,
    control_frames,
    control_options,
    decode_json,
    encode_json,
    encode_status,
    name_frame,
    need_frames,
    opaque_id,
    opt_bool,
    opt_enum,
    opt_float,
    opt_int,
    opt_match,
    opt_match_or_none,
    opt_name,
    opt_str,
    quick_init,
    status_frame,
)

#: Heartbeat intervals are milliseconds in 1..2**31-1 (about 24.8 days).
MAX_INTERVAL_MS: Final = 2**31 - 1

# ============================================================================================
# Control commands shared by several families (docs/protocol.md §3.2, §3.5-§3.7, §4, §5).
# One class each; ``protocol`` (frame 1) is a field, so the same class serves S0C1/S0W1/S0B1.
# ============================================================================================


@dataclass(frozen=True, slots=True)
class CheckConfig(Message):
    """CHECKCONFIG: ask for the config; CONFIGACK if ``config_version`` is current, else CONFIG."""

    COMMAND: ClassVar[bytes] = b"CHECKCONFIG"

    config_type: ConfigType
    config_version: int | None = None
    client_id: str | None = None
    #: §2.5: the sender checks the config's signature itself and asks for the client view's
    #: signature (``view_signature``, ``config_sha256``) with the view; absent or false: the
    #: view alone.
    signed: bool = False
    protocol: bytes = field(kw_only=True)

    def to_frames(self) -> list[bytes]:
        return control_frames(
            self.protocol,
            self.COMMAND,
            {
                "config_type": self.config_type.value,
                "config_version": self.config_version,
                "client_id": self.client_id,
                "signed": True if self.signed else None,
            },
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        return cls(
            opt_enum(opts, "config_type", ConfigType),
            opt_int(opts, "config_version", None, minimum=0),
            opt_name(opts, "client_id", None),
            opt_bool(opts, "signed", False),
            protocol=frames[1],
        )


@dataclass(frozen=True, slots=True)
class ConfigAck(Message):
    """CONFIGACK (broker →): the sender's config is current; ``client_id`` is the one to use."""

    COMMAND: ClassVar[bytes] = b"CONFIGACK"

    config_version: int
    client_id: str
    protocol: bytes = field(kw_only=True)

    def to_frames(self) -> list[bytes]:
        return control_frames(
            self.protocol,
            self.COMMAND,
            {"config_version": self.config_version, "client_id": self.client_id},
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        return cls(
            opt_int(opts, "config_version", minimum=1),
            opt_name(opts, "client_id"),
            protocol=frames[1],
        )


@dataclass(frozen=True, slots=True)
class Config(Message):
    """CONFIG (broker →): the receiver's view of the network config in ``config_type``."""

    COMMAND: ClassVar[bytes] = b"CONFIG"

    config_type: ConfigType
    config_version: int
    sha256: str
    client_id: str
    document: bytes
    signature: str | None = None  # Ed25519 hex, over family|config_version|sha256 (§6.2)
    #: Ed25519 hex over the client view (§6.2): with a peer's whole config, relayed; with a
    #: client view (a ``signed`` CHECKCONFIG), what the client verifies.
    view_signature: str | None = None
    #: The whole config's sha256, sent with a client view and its view_signature (§3.2).
    config_sha256: str | None = None
    protocol: bytes = field(kw_only=True)

    def to_frames(self) -> list[bytes]:
        return control_frames(
            self.protocol,
            self.COMMAND,
            {
                "config_type": self.config_type.value,
                "config_version": self.config_version,
                "sha256": self.sha256,
                "signature": self.signature,
                "view_signature": self.view_signature,
                "config_sha256": self.config_sha256,
                "client_id": self.client_id,
            },
            self.document,
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames, ("document",))
        hex128, hex64 = "128 lowercase hex digits", "64 lowercase hex digits"
        return cls(
            opt_enum(opts, "config_type", ConfigType),
            opt_int(opts, "config_version", minimum=1),
            opt_match(opts, "sha256", SHA256_HEX, hex64),
            opt_name(opts, "client_id"),
            frames[4],
            opt_match_or_none(opts, "signature", ED25519_HEX, hex128),
            opt_match_or_none(opts, "view_signature", ED25519_HEX, hex128),
            opt_match_or_none(opts, "config_sha256", SHA256_HEX, hex64),
            protocol=frames[1],
        )


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """HEARTBEAT between a client or worker and its broker (both directions, §3.4).

    ``hbeatinterval_ms`` is only sent by the broker, to announce the interval it enforces (§4.2).
    ``interval_ms`` is the sender's promise that its next message comes within that many ms
    (idle beating, §3.4); None: the negotiated interval.
    """

    COMMAND: ClassVar[bytes] = b"HEARTBEAT"

    time: float
    config_version: int
    hbeatinterval_ms: int | None = None
    interval_ms: int | None = None
    protocol: bytes = field(kw_only=True)

    def to_frames(self) -> list[bytes]:
        sent, version, interval = self.time, self.config_version, self.hbeatinterval_ms
        promise = self.interval_ms
        if (
            type(sent) is float
            and math.isfinite(sent)
            and type(version) is int
            and (interval is None or type(interval) is int)
            and (promise is None or type(promise) is int)
        ):
            # The bytes control_frames would give (JSON writes a float as its repr, an int as
            # its digits), without the encoder: a broker sends one to every connection.
            options = b'{"time":%s,"config_version":%d' % (repr(sent).encode(), version)
            if interval is not None:
                options += b',"hbeatinterval_ms":%d' % interval
            if promise is not None:
                options += b',"interval_ms":%d' % promise
            return [EMPTY, self.protocol, self.COMMAND, options + b"}"]
        return control_frames(
            self.protocol,
            self.COMMAND,
            {
                "time": sent,
                "config_version": version,
                "hbeatinterval_ms": interval,
                "interval_ms": promise,
            },
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        return cls(
            opt_float(opts, "time", minimum=0.0),
            opt_int(opts, "config_version", minimum=0),
            opt_int(opts, "hbeatinterval_ms", None, minimum=1, maximum=MAX_INTERVAL_MS),
            opt_int(opts, "interval_ms", None, minimum=1, maximum=MAX_INTERVAL_MS),
            protocol=frames[1],
        )


@dataclass(frozen=True, slots=True)
class Disconnect(Message):
    """DISCONNECT: the sender leaves; the receiver forgets it at once (§3.6)."""

    COMMAND: ClassVar[bytes] = b"DISCONNECT"

    protocol: bytes = field(kw_only=True)

    def to_frames(self) -> list[bytes]:
        return [EMPTY, self.protocol, self.COMMAND, EMPTY]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        control_options(frames)  # validated (and ignored) like any options frame
        return cls(protocol=frames[1])


@dataclass(frozen=True, slots=True)
class ForceNegotiate(Message):
    """FORCENEGOTIATE (broker →): send CHECKCONFIG before anything else (§3.7)."""

    COMMAND: ClassVar[bytes] = b"FORCENEGOTIATE"

    reason: str
    protocol: bytes = field(kw_only=True)

    def to_frames(self) -> list[bytes]:
        return control_frames(self.protocol, self.COMMAND, {"reason": self.reason})

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        return cls(opt_str(opts, "reason"), protocol=frames[1])


@dataclass(frozen=True, slots=True)
class DisconnectError(Message):
    """DISCONNECTERROR (broker →): an error code from §9; 301 carries the ``endpoint`` to use."""

    COMMAND: ClassVar[bytes] = b"DISCONNECTERROR"

    code: int
    message: str
    endpoint: str | None = None
    protocol: bytes = field(kw_only=True)

    def to_frames(self) -> list[bytes]:
        return control_frames(
            self.protocol,
            self.COMMAND,
            {"code": self.code, "message": self.message, "endpoint": self.endpoint},
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        code = opt_int(opts, "code", minimum=100, maximum=599)
        endpoint = opt_name(opts, "endpoint", None)
        if code == 301 and endpoint is None:
            raise ProtocolError.malformed(3, "option 'endpoint' is missing (required with 301)")
        return cls(code, opt_str(opts, "message"), endpoint, protocol=frames[1])


# ============================================================================================
# Client hot path (§3.3): positional frames, no JSON.
# ============================================================================================


def _service_request_body(frames: Sequence[bytes]) -> tuple[str, bytes, tuple[bytes, ...]]:
    """``service, request_id, body...`` from frame 3 on (client REQUEST and PARTIAL, §3.3)."""
    if len(frames) < 5:
        need_frames(frames, ("service", "request_id"))
    return (
        name_frame(frames[3], 3, "service"),
        opaque_id(frames[4], 4, "request_id"),
        tuple(frames[5:]),
    )


@dataclass(frozen=True, slots=True)
class ClientRequest(Message):
    """REQUEST client → broker: ``service, request_id, body...``."""

    COMMAND: ClassVar[bytes] = b"REQUEST"
    PROTOCOL: ClassVar[bytes] = SIG_CLIENT

    service: str
    request_id: bytes
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [
            EMPTY,
            SIG_CLIENT,
            b"REQUEST",
            self.service.encode("utf-8"),
            self.request_id,
            *self.body,
        ]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        return cls(*_service_request_body(frames))


@dataclass(frozen=True, slots=True)
class ClientPartial(Message):
    """PARTIAL broker → client: one streamed part of the answer to ``request_id``."""

    COMMAND: ClassVar[bytes] = b"PARTIAL"
    PROTOCOL: ClassVar[bytes] = SIG_CLIENT

    service: str
    request_id: bytes
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [
            EMPTY,
            SIG_CLIENT,
            b"PARTIAL",
            self.service.encode("utf-8"),
            self.request_id,
            *self.body,
        ]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        return cls(*_service_request_body(frames))


@quick_init  # built once per request: docs/performance.md
@dataclass(frozen=True, slots=True)
class ClientReply(Message):
    """REPLY broker → client: the final answer, ``status`` 200 = ok (§3.3 lists error statuses)."""

    COMMAND: ClassVar[bytes] = b"REPLY"
    PROTOCOL: ClassVar[bytes] = SIG_CLIENT

    service: str
    request_id: bytes
    status: int
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [
            EMPTY,
            SIG_CLIENT,
            b"REPLY",
            self.service.encode("utf-8"),
            self.request_id,
            encode_status(self.status),
            *self.body,
        ]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        if len(frames) < 6:
            need_frames(frames, ("service", "request_id", "status"))
        return cls(
            name_frame(frames[3], 3, "service"),
            opaque_id(frames[4], 4, "request_id"),
            status_frame(frames[5], 5),
            tuple(frames[6:]),
        )

    @classmethod
    def failure(cls, service: str, request_id: bytes, status: int, message: str) -> Self:
        """An error REPLY made by the broker: body is one JSON frame ``{code, message}`` (§3.3)."""
        return cls(
            service, request_id, status, (encode_json({"code": status, "message": message}),)
        )

    def error_detail(self) -> tuple[int, str]:
        """``(code, message)`` of an error REPLY's JSON body; ProtocolError if it is not one."""
        if len(self.body) != 1:
            raise ProtocolError.malformed(6, "error REPLY body is not exactly one JSON frame")
        value = decode_json(self.body[0], 6, "error body")
        if not isinstance(value, dict):
            raise ProtocolError.malformed(6, "error body is not a JSON object")
        code = opt_int(value, "code", frame=6, minimum=100, maximum=599)
        return code, opt_str(value, "message", frame=6)


__all__ = [
    "MAX_INTERVAL_MS",
    "CheckConfig",
    "ClientPartial",
    "ClientReply",
    "ClientRequest",
    "Config",
    "ConfigAck",
    "Disconnect",
    "DisconnectError",
    "ForceNegotiate",
    "Heartbeat",
]
