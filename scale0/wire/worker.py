"""Worker channel messages (S0W1, docs/protocol.md §4): READY and the worker hot path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, Self

from scale0.wire.client import MAX_INTERVAL_MS
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import (
    EMPTY,
    SIG_WORKER,
    JsonValue,
    Message,
    control_frames,
    control_options,
    encode_status,
    is_reserved_service,
    name_frame,
    need_frames,
    opaque_id,
    opt_bool,
    opt_float,
    opt_int,
    opt_str_list,
    quick_init,
    ticket_body,
    ticket_status_body,
)

#: Upper bound of READY ``capacity`` (concurrent requests one worker accepts).
MAX_CAPACITY: Final = 65535
#: Upper bound of the number of services in one READY.
MAX_SERVICES: Final = 1024


@dataclass(frozen=True, slots=True)
class Ready(Message):
    """READY worker → broker: serve ``services``; sent again to change them live (§4.1)."""

    COMMAND: ClassVar[bytes] = b"READY"
    PROTOCOL: ClassVar[bytes] = SIG_WORKER

    services: tuple[str, ...]
    heartbeat: bool
    hbeatinterval_ms: int
    time: float
    config_version: int
    capacity: int = 1
    #: Ask for the client id and request id of each request: IDREQUEST, not REQUEST (§4.3).
    request_ids: bool = False

    def to_frames(self) -> list[bytes]:
        options: dict[str, JsonValue] = {
            "services": list(self.services),
            "heartbeat": self.heartbeat,
            "hbeatinterval_ms": self.hbeatinterval_ms,
            "time": self.time,
            "config_version": self.config_version,
            "capacity": self.capacity,
        }
        if self.request_ids:
            options["request_ids"] = True
        return control_frames(SIG_WORKER, self.COMMAND, options)

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        services = opt_str_list(opts, "services", names=True, max_items=MAX_SERVICES)
        for position, service in enumerate(services):
            # A worker cannot take over names the broker answers itself (§7.3).
            if is_reserved_service(service):
                raise ProtocolError.malformed(
                    3, f"option 'services[{position}]' {service[:64]!r} is a reserved name"
                )
        return cls(
            services,
            opt_bool(opts, "heartbeat"),
            opt_int(opts, "hbeatinterval_ms", minimum=1, maximum=MAX_INTERVAL_MS),
            opt_float(opts, "time", minimum=0.0),
            opt_int(opts, "config_version", minimum=0),
            opt_int(opts, "capacity", 1, minimum=1, maximum=MAX_CAPACITY),
            opt_bool(opts, "request_ids", False),
        )


@quick_init  # built once per request: docs/performance.md
@dataclass(frozen=True, slots=True)
class WorkerRequest(Message):
    """REQUEST broker → worker: ``ticket, service, body...``; the ticket names this dispatch."""

    COMMAND: ClassVar[bytes] = b"REQUEST"
    PROTOCOL: ClassVar[bytes] = SIG_WORKER

    ticket: bytes
    service: str
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [
            EMPTY,
            SIG_WORKER,
            b"REQUEST",
            self.ticket,
            self.service.encode("utf-8"),
            *self.body,
        ]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        if len(frames) < 5:
            need_frames(frames, ("ticket", "service"))
        return cls(
            opaque_id(frames[3], 3, "ticket"),
            name_frame(frames[4], 4, "service"),
            tuple(frames[5:]),
        )


@dataclass(frozen=True, slots=True)
class WorkerIdRequest(Message):
    """IDREQUEST broker → worker: ``ticket, service, client_id, request_id, body...`` (§4.3).

    REQUEST with the client's own ids, to a worker whose READY asked for ``request_ids``. A
    command of its own, so a worker can never mistake the body of a REQUEST from a broker that
    does not know the option for ids. Both ids are empty when the broker cannot say (a request
    forwarded by a peer)."""

    COMMAND: ClassVar[bytes] = b"IDREQUEST"
    PROTOCOL: ClassVar[bytes] = SIG_WORKER

    ticket: bytes
    service: str
    client_id: str
    request_id: bytes
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [
            EMPTY,
            SIG_WORKER,
            b"IDREQUEST",
            self.ticket,
            self.service.encode("utf-8"),
            self.client_id.encode("utf-8"),
            self.request_id,
            *self.body,
        ]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        if len(frames) < 7:
            need_frames(frames, ("ticket", "service", "client_id", "request_id"))
        try:
            client_id = frames[5].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError.malformed(5, "client_id is not UTF-8") from None
        return cls(
            opaque_id(frames[3], 3, "ticket"),
            name_frame(frames[4], 4, "service"),
            client_id,
            bytes(frames[6]),
            tuple(frames[7:]),
        )

    def plain(self) -> WorkerRequest:
        """The same request without its ids."""
        return WorkerRequest(self.ticket, self.service, self.body)


@dataclass(frozen=True, slots=True)
class WorkerPartial(Message):
    """PARTIAL worker → broker: ``ticket, body...``, one streamed part of the reply."""

    COMMAND: ClassVar[bytes] = b"PARTIAL"
    PROTOCOL: ClassVar[bytes] = SIG_WORKER

    ticket: bytes
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [EMPTY, SIG_WORKER, b"PARTIAL", self.ticket, *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        return cls(*ticket_body(frames))


@dataclass(frozen=True, slots=True)
class WorkerReply(Message):
    """REPLY worker → broker: ``ticket, status, body...``; the worker is ready again."""

    COMMAND: ClassVar[bytes] = b"REPLY"
    PROTOCOL: ClassVar[bytes] = SIG_WORKER

    ticket: bytes
    status: int
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [EMPTY, SIG_WORKER, b"REPLY", self.ticket, encode_status(self.status), *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        return cls(*ticket_status_body(frames))
