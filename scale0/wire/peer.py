"""Broker-to-broker messages (S0B1, docs/protocol.md §5): HELLO, heartbeats, tables, forwarding."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Final, Self, cast

from scale0.wire.errors import ProtocolError
from scale0.wire.frames import (
    EMPTY,
    MAX_ID_BYTES,
    SIG_BROKER,
    JsonValue,
    Message,
    control_frames,
    control_options,
    decode_json,
    decode_options,
    encode_json,
    encode_options,
    encode_status,
    name_frame,
    name_problem,
    need_frames,
    opaque_id,
    opt_bool,
    opt_enum,
    opt_family,
    opt_float,
    opt_int,
    opt_name,
    show,
    ticket_body,
    ticket_status_body,
)

#: Bounds that keep one TABLE from describing more than a broker could plausibly run.
MAX_ENDPOINTS: Final = 16
MAX_TABLE_WORKERS: Final = 100_000
#: TABLE's ``slots``: a count per service within ±this (more than any table's capacity).
MAX_SLOTS: Final = 1 << 31
#: HELLO's ``understands``: at most this many command names, each 1..32 upper-case letters.
MAX_UNDERSTANDS: Final = 32
_COMMAND_NAME: Final = re.compile(r"[A-Z]{1,32}")


class BrokerState(StrEnum):
    """Broker states as sent in HELLO and HEARTBEAT (docs/protocol.md §6.4)."""

    JOINING = "joining"
    ACTIVE = "active"
    DISABLED = "disabled"


class TableMode(StrEnum):
    """How a broker wants peers' heartbeat tables: pushed on change, or pulled with TABLEREQ."""

    PUSH = "push"
    PULL = "pull"


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """HELLO: first message on a peer link; anything a peer sends before it is ignored (§5.1)."""

    COMMAND: ClassVar[bytes] = b"HELLO"
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    broker_id: str
    family: str
    state: BrokerState
    config_version: int
    endpoints: dict[str, str]
    table_mode: TableMode
    #: Peer commands beyond the brief's that the sender decodes (§5.1 ``understands``), e.g.
    #: FORWARDWITH: a peer sends them only to a broker that listed them.
    understands: frozenset[str] = frozenset()

    def to_frames(self) -> list[bytes]:
        endpoints: dict[str, JsonValue] = dict(self.endpoints)
        understands: list[JsonValue] | None = [*sorted(self.understands)] or None
        return control_frames(
            SIG_BROKER,
            self.COMMAND,
            {
                "broker_id": self.broker_id,
                "family": self.family,
                "state": self.state.value,
                "config_version": self.config_version,
                "endpoints": endpoints,
                "table_mode": self.table_mode.value,
                "understands": understands,
            },
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        raw = opts.get("endpoints")
        if not isinstance(raw, dict):
            raise ProtocolError.malformed(3, "option 'endpoints' must be an object")
        if len(raw) > MAX_ENDPOINTS:
            raise ProtocolError.malformed(3, f"option 'endpoints' has over {MAX_ENDPOINTS} keys")
        endpoints: dict[str, str] = {}
        for channel, endpoint in raw.items():
            # Keys reach logs and management output, so they follow the name rules too.
            problem = name_problem(channel)
            if problem is None and isinstance(endpoint, str):
                problem = name_problem(endpoint)
            elif problem is None:
                problem = "is not a string"
            if problem is not None:
                raise ProtocolError.malformed(3, f"option 'endpoints.{channel[:32]}' {problem}")
            endpoints[channel] = str(endpoint)
        return cls(
            opt_name(opts, "broker_id"),
            opt_family(opts, "family"),
            opt_enum(opts, "state", BrokerState),
            opt_int(opts, "config_version", minimum=0),
            endpoints,
            opt_enum(opts, "table_mode", TableMode),
            _understands(opts.get("understands")),
        )


def _understands(raw: JsonValue) -> frozenset[str]:
    """HELLO's ``understands``: absent (an older broker), or an array of command names."""
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or len(raw) > MAX_UNDERSTANDS:
        raise ProtocolError.malformed(
            3, f"option 'understands' must be an array of at most {MAX_UNDERSTANDS} commands"
        )
    for position, command in enumerate(raw):
        if not isinstance(command, str) or _COMMAND_NAME.fullmatch(command) is None:
            raise ProtocolError.malformed(
                3,
                f"option 'understands[{position}]' is not a command name (A-Z, 1..32): "
                f"{str(command)[:40]!r}",
            )
    return frozenset(cast(list[str], raw))


@dataclass(frozen=True, slots=True)
class PeerHeartbeat(Message):
    """HEARTBEAT between brokers: liveness, state, and the sender's config and table versions."""

    COMMAND: ClassVar[bytes] = b"HEARTBEAT"
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    broker_id: str
    time: float
    state: BrokerState
    config_version: int
    table_seq: int

    def to_frames(self) -> list[bytes]:
        return control_frames(
            SIG_BROKER,
            self.COMMAND,
            {
                "broker_id": self.broker_id,
                "time": self.time,
                "state": self.state.value,
                "config_version": self.config_version,
                "table_seq": self.table_seq,
            },
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        return cls(
            opt_name(opts, "broker_id"),
            opt_float(opts, "time", minimum=0.0),
            opt_enum(opts, "state", BrokerState),
            opt_int(opts, "config_version", minimum=0),
            opt_int(opts, "table_seq", minimum=0),
        )


@dataclass(frozen=True, slots=True)
class TableWorker:
    """One worker in a heartbeat table row: free ``capacity`` and its ``last_heartbeat`` time."""

    worker_id: str
    capacity: int
    last_heartbeat: float


@dataclass(frozen=True, slots=True)
class TableService:
    """One service of a heartbeat table and the sender's workers for it (may be empty)."""

    service: str
    workers: tuple[TableWorker, ...] = ()


def _encode_table(services: tuple[TableService, ...]) -> bytes:
    document: dict[str, JsonValue] = {
        row.service: [
            {
                "worker_id": worker.worker_id,
                "capacity": worker.capacity,
                "last_heartbeat": worker.last_heartbeat,
            }
            for worker in row.workers
        ]
        for row in services
    }
    return encode_json(document)


def _decode_table(frame: bytes) -> tuple[TableService, ...]:
    document = decode_json(frame, 4, "table", empty={})
    if not isinstance(document, dict):
        raise ProtocolError.malformed(4, "table is not a JSON object")
    rows: list[TableService] = []
    total = 0
    for service, workers in document.items():
        where = f"table[{service[:64]!r}]"
        problem = name_problem(service)
        if problem is not None:
            raise ProtocolError.malformed(4, f"{where}: service {problem}")
        if not isinstance(workers, list):
            raise ProtocolError.malformed(4, f"{where} is not an array")
        total += len(workers)
        if total > MAX_TABLE_WORKERS:
            raise ProtocolError.malformed(4, f"table lists over {MAX_TABLE_WORKERS} workers")
        parsed: list[TableWorker] = []
        for position, entry in enumerate(workers):
            if not isinstance(entry, dict):
                raise ProtocolError.malformed(4, f"{where}[{position}] is not an object")
            try:
                parsed.append(
                    TableWorker(
                        opt_name(entry, "worker_id", frame=4),
                        opt_int(entry, "capacity", frame=4, minimum=0),
                        opt_float(entry, "last_heartbeat", frame=4, minimum=0.0),
                    )
                )
            except ProtocolError as exc:  # say which row, keep the option's own complaint
                raise ProtocolError.malformed(4, f"{where}[{position}] {exc.reason}") from None
        rows.append(TableService(service, tuple(parsed)))
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class Table(Message):
    """TABLE: a heartbeat table; ``full`` replaces all, else each listed service (§5.3)."""

    COMMAND: ClassVar[bytes] = b"TABLE"
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    broker_id: str
    table_seq: int
    full: bool
    services: tuple[TableService, ...] = ()
    #: Per service, how many of the *receiver's* forwards the sender would hold at once when
    #: it sends this (its free slots, less its queue, plus the receiver's requests it holds):
    #: the receiver's own credit count (F16). None: a sender of an older version.
    slots: tuple[tuple[str, int], ...] | None = None

    def to_frames(self) -> list[bytes]:
        opts: dict[str, JsonValue] = {
            "broker_id": self.broker_id,
            "table_seq": self.table_seq,
            "full": self.full,
        }
        if self.slots is not None:
            opts["slots"] = dict(self.slots)
        return control_frames(SIG_BROKER, self.COMMAND, opts, _encode_table(self.services))

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames, ("table",))
        return cls(
            opt_name(opts, "broker_id"),
            opt_int(opts, "table_seq", minimum=0),
            opt_bool(opts, "full"),
            _decode_table(frames[4]),
            _decode_slots(opts),
        )


def _decode_slots(opts: dict[str, JsonValue]) -> tuple[tuple[str, int], ...] | None:
    """TABLE's optional ``slots``: an object of service name -> int (§5.3); null = absent."""
    document = opts.get("slots")
    if document is None:
        return None
    if not isinstance(document, dict):
        raise ProtocolError.malformed(3, "option 'slots' is not a JSON object")
    if len(document) > MAX_TABLE_WORKERS:
        raise ProtocolError.malformed(3, f"option 'slots' lists over {MAX_TABLE_WORKERS} services")
    slots: list[tuple[str, int]] = []
    for service, value in document.items():
        where = f"option 'slots'[{service[:64]!r}]"
        problem = name_problem(service)
        if problem is not None:
            raise ProtocolError.malformed(3, f"{where}: service {problem}")
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_SLOTS:
            raise ProtocolError.malformed(3, f"{where} is not an integer within ±{MAX_SLOTS}")
        slots.append((service, value))
    return tuple(slots)


@dataclass(frozen=True, slots=True)
class TableReq(Message):
    """TABLEREQ: ask a peer for its table; changes after ``since_seq``, or all of it (§5.3)."""

    COMMAND: ClassVar[bytes] = b"TABLEREQ"
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    broker_id: str
    since_seq: int | None = None

    def to_frames(self) -> list[bytes]:
        return control_frames(
            SIG_BROKER,
            self.COMMAND,
            {"broker_id": self.broker_id, "since_seq": self.since_seq},
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        return cls(opt_name(opts, "broker_id"), opt_int(opts, "since_seq", None, minimum=0))


#: The command of a FORWARD that carries its caller's CURVE key (§5.4).
FORWARD_AS: Final = b"FORWARDAS"
#: The command of a FORWARD that carries an options object: the client's ids, the remaining
#: deadline and the caller's key (§5.4). Sent only to a peer whose HELLO lists it (``understands``).
FORWARD_WITH: Final = b"FORWARDWITH"
#: Its name as a HELLO's ``understands`` lists it (§5.1).
FORWARD_WITH_NAME: Final = FORWARD_WITH.decode("ascii")
#: FORWARDWITH's ``request_id`` option: the client's request id as lower-case hex (§2.3).
_HEX_ID: Final = re.compile(rf"(?:[0-9a-f]{{2}}){{1,{MAX_ID_BYTES}}}")


@dataclass(frozen=True, slots=True)
class Forward(Message):
    """A request for a peer's worker (§5.4), in one of three commands:

    - FORWARD ``ticket, service, origin_broker, body...`` (the brief's layout) when ``caller``
      is empty and ``deadline_ms`` is None, as for a peer that does not understand FORWARDWITH
      in a family without CURVE;
    - FORWARDAS ``ticket, service, origin_broker, caller, body...`` when the calling client
      has a CURVE key (Z85) and ``deadline_ms`` is None, so the serving broker judges it by the
      same grants;
    - FORWARDWITH ``ticket, service, origin_broker, options, body...`` whenever ``deadline_ms``
      is set: the options carry ``deadline_ms`` (what is left of the request's deadline),
      ``client_id`` and ``request_id`` (the client's own, both or neither) and ``caller``. An
      extensible form: a later option is ignored by a broker that does not know it (§2.2).

    New commands rather than new frames in FORWARD: a broker of an older version reads FORWARD
    positionally and would take an extra frame for the first body frame; FORWARDAS and
    FORWARDWITH are to it unknown commands, refused, never a corrupted body."""

    COMMAND: ClassVar[bytes] = b"FORWARD"
    #: The other commands this class is registered under and encodes (wire/registry.py).
    ALSO: ClassVar[tuple[bytes, ...]] = (FORWARD_AS, FORWARD_WITH)
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    ticket: bytes
    service: str
    origin_broker: str
    body: tuple[bytes, ...] = ()
    caller: str = ""
    client_id: str = ""  # FORWARDWITH only: the client's negotiated client_id ("" = not said)
    request_id: bytes = b""  # FORWARDWITH only: the client's request_id (b"" = not said)
    deadline_ms: int | None = None  # set: FORWARDWITH, what is left of the request's deadline

    def to_frames(self) -> list[bytes]:
        head = [self.ticket, self.service.encode("utf-8"), self.origin_broker.encode("utf-8")]
        if self.deadline_ms is not None:
            options: dict[str, JsonValue] = {"deadline_ms": self.deadline_ms}
            if self.client_id:
                options["client_id"] = self.client_id
                options["request_id"] = self.request_id.hex()
            if self.caller:
                options["caller"] = self.caller
            return [EMPTY, SIG_BROKER, FORWARD_WITH, *head, encode_options(options), *self.body]
        if not self.caller:
            return [EMPTY, SIG_BROKER, b"FORWARD", *head, *self.body]
        return [EMPTY, SIG_BROKER, FORWARD_AS, *head, self.caller.encode("ascii"), *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        command = frames[2]
        if command == FORWARD_WITH:
            return cls._with(frames)
        if command != FORWARD_AS:
            if len(frames) < 6:
                need_frames(frames, ("ticket", "service", "origin_broker"))
            return cls(
                opaque_id(frames[3], 3, "ticket"),
                name_frame(frames[4], 4, "service"),
                name_frame(frames[5], 5, "origin_broker"),
                tuple(frames[6:]),
            )
        if len(frames) < 7:
            need_frames(frames, ("ticket", "service", "origin_broker", "caller"))
        return cls(
            opaque_id(frames[3], 3, "ticket"),
            name_frame(frames[4], 4, "service"),
            name_frame(frames[5], 5, "origin_broker"),
            tuple(frames[7:]),
            caller=_caller_frame(frames[6]),
        )

    @classmethod
    def _with(cls, frames: Sequence[bytes]) -> Self:
        """FORWARDWITH: every frame and option checked before anything is built (§5.4)."""
        if len(frames) < 7:
            need_frames(frames, ("ticket", "service", "origin_broker", "options"))
        ticket = opaque_id(frames[3], 3, "ticket")
        service = name_frame(frames[4], 4, "service")
        origin = name_frame(frames[5], 5, "origin_broker")
        opts = decode_options(frames[6], 6)
        deadline_ms = opt_int(opts, "deadline_ms", frame=6, minimum=0)
        client_id = opt_name(opts, "client_id", "", frame=6)
        raw_id = opts.get("request_id")
        if raw_id is None:
            request_id = b""
        elif not isinstance(raw_id, str) or _HEX_ID.fullmatch(raw_id) is None:
            raise ProtocolError.malformed(
                6,
                f"option 'request_id' is not 1..{MAX_ID_BYTES} bytes as lower-case hex: "
                f"{str(raw_id)[:40]!r}",
            )
        else:
            request_id = bytes.fromhex(raw_id)
        if bool(client_id) != bool(request_id):
            missing = "request_id" if client_id else "client_id"
            raise ProtocolError.malformed(
                6, f"option {missing!r} missing: client_id and request_id go together"
            )
        caller = opts.get("caller")
        if caller is not None and not isinstance(caller, str):
            raise ProtocolError.malformed(6, "option 'caller' is not a string")
        return cls(
            ticket,
            service,
            origin,
            tuple(frames[7:]),
            caller="" if caller is None else _caller_key(caller.encode("utf-8"), 6),
            client_id=client_id,
            request_id=request_id,
            deadline_ms=deadline_ms,
        )


def _caller_frame(frame: bytes) -> str:
    """FORWARDAS's frame 6: a CURVE key as 40 Z85 characters (§5.4)."""
    return _caller_key(frame, 6)


def _caller_key(raw: bytes, index: int) -> str:
    """A caller's CURVE key as 40 Z85 characters, or a 400 naming frame ``index``."""
    if len(raw) != CALLER_KEY_LEN or not raw.isascii() or not set(raw) <= _Z85_BYTES:
        raise ProtocolError.malformed(
            index, f"caller is not a CURVE key (40 Z85 characters): {show(raw)}"
        )
    return raw.decode("ascii")


#: FORWARD's ``caller``: a CURVE public key in Z85 (ZeroMQ RFC 32), 40 characters.
CALLER_KEY_LEN: Final = 40
_Z85_BYTES: Final = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


@dataclass(frozen=True, slots=True)
class ForwardPartial(Message):
    """FORWARDPARTIAL: ``ticket, body...``, a streamed part back to the origin (addition, §5.4)."""

    COMMAND: ClassVar[bytes] = b"FORWARDPARTIAL"
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    ticket: bytes
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [EMPTY, SIG_BROKER, b"FORWARDPARTIAL", self.ticket, *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        return cls(*ticket_body(frames))


@dataclass(frozen=True, slots=True)
class ForwardReply(Message):
    """FORWARDREPLY: ``ticket, status, body...``, the final answer back to the origin broker."""

    COMMAND: ClassVar[bytes] = b"FORWARDREPLY"
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    ticket: bytes
    status: int
    body: tuple[bytes, ...] = ()

    def to_frames(self) -> list[bytes]:
        return [
            EMPTY,
            SIG_BROKER,
            b"FORWARDREPLY",
            self.ticket,
            encode_status(self.status),
            *self.body,
        ]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        return cls(*ticket_status_body(frames))
