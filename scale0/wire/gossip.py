"""Gossip membership messages (S0B1, docs/protocol.md §5.6): PING, PINGREQ, ACK and member rows.

A family whose network config says ``family_topology: gossip`` stops the full mesh of peer
HEARTBEATs and heartbeat tables: each broker probes one peer per interval (SWIM) and every probe
and answer carries a few *member rows* (who is alive, suspect or dead, at which incarnation,
with its state, config version and the services it offers). Frames: the usual control command,
then one JSON array of rows (frame 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Final, Self

from scale0.wire.errors import ProtocolError
from scale0.wire.frames import (
    INT64_MAX,
    SIG_BROKER,
    JsonValue,
    Message,
    control_frames,
    control_options,
    decode_json,
    encode_json,
    name_problem,
    opt_enum,
    opt_float,
    opt_int,
    opt_name,
)
from scale0.wire.peer import BrokerState

__all__ = [
    "MAX_MEMBER_ROWS",
    "MAX_ROW_SERVICES",
    "Ack",
    "MemberRow",
    "MemberStatus",
    "Ping",
    "PingReq",
]

#: Rows one message may carry (a sender sends far fewer: scale0/core/gossip.py PIGGYBACK).
MAX_MEMBER_ROWS: Final = 256
#: Services one row may list.
MAX_ROW_SERVICES: Final = 10_000


class MemberStatus(StrEnum):
    """What a broker holds of another member (docs/protocol.md §5.6; scale0/core/states.py)."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class MemberRow:
    """One member as the sender holds it: ``services`` maps each service it offers to the
    capacity of its workers for it (the sum, not the free slots)."""

    broker_id: str
    status: MemberStatus
    incarnation: int
    state: BrokerState
    config_version: int
    services: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, JsonValue]:
        services: dict[str, JsonValue] = dict(self.services)
        return {
            "broker_id": self.broker_id,
            "status": self.status.value,
            "incarnation": self.incarnation,
            "state": self.state.value,
            "config_version": self.config_version,
            "services": services,
        }

    @classmethod
    def from_json(cls, value: JsonValue, where: str) -> Self:
        if not isinstance(value, dict):
            raise ProtocolError.malformed(4, f"{where} is not an object")
        try:
            raw = value.get("services", {})
            if not isinstance(raw, dict):
                raise ProtocolError.malformed(4, "'services' must be an object")
            if len(raw) > MAX_ROW_SERVICES:
                raise ProtocolError.malformed(4, f"'services' has over {MAX_ROW_SERVICES} keys")
            services: list[tuple[str, int]] = []
            for service in raw:
                problem = name_problem(service)
                if problem is not None:
                    raise ProtocolError.malformed(4, f"service {service[:64]!r} {problem}")
                services.append((service, opt_int(raw, service, frame=4, minimum=0)))
            return cls(
                opt_name(value, "broker_id", frame=4),
                opt_enum(value, "status", MemberStatus, frame=4),
                opt_int(value, "incarnation", frame=4, minimum=0),
                opt_enum(value, "state", BrokerState, frame=4),
                opt_int(value, "config_version", frame=4, minimum=0),
                tuple(services),
            )
        except ProtocolError as exc:  # say which row, keep the field's own complaint
            raise ProtocolError.malformed(4, f"{where} {exc.reason}") from None


def _encode_rows(rows: tuple[MemberRow, ...]) -> bytes:
    return encode_json([row.to_json() for row in rows])


def _decode_rows(frame: bytes) -> tuple[MemberRow, ...]:
    document = decode_json(frame, 4, "members", empty=[])
    if not isinstance(document, list):
        raise ProtocolError.malformed(4, "members is not a JSON array")
    if len(document) > MAX_MEMBER_ROWS:
        raise ProtocolError.malformed(4, f"members lists over {MAX_MEMBER_ROWS} rows")
    return tuple(MemberRow.from_json(row, f"members[{i}]") for i, row in enumerate(document))


@dataclass(frozen=True, slots=True)
class _Probe(Message):
    """The one shape of the three: who sends, the probe's number, whom it is about, the
    sender's clock (for the skew check, F4), and the rows it carries."""

    COMMAND: ClassVar[bytes] = b""
    PROTOCOL: ClassVar[bytes] = SIG_BROKER

    broker_id: str
    seq: int
    target: str
    time: float
    members: tuple[MemberRow, ...] = ()

    def to_frames(self) -> list[bytes]:
        return control_frames(
            SIG_BROKER,
            self.COMMAND,
            {
                "broker_id": self.broker_id,
                "seq": self.seq,
                "target": self.target,
                "time": self.time,
            },
            _encode_rows(self.members),
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames, ("members",))
        return cls(
            opt_name(opts, "broker_id"),
            opt_int(opts, "seq", minimum=0, maximum=INT64_MAX),
            opt_name(opts, "target"),
            opt_float(opts, "time", minimum=0.0),
            _decode_rows(frames[4]),
        )


@dataclass(frozen=True, slots=True)
class Ping(_Probe):
    """PING: are you alive? ``target`` is the receiver; answered by ACK with the same seq."""

    COMMAND: ClassVar[bytes] = b"PING"


@dataclass(frozen=True, slots=True)
class PingReq(_Probe):
    """PINGREQ: please PING ``target`` for me; the receiver ACKs the sender if target answers."""

    COMMAND: ClassVar[bytes] = b"PINGREQ"


@dataclass(frozen=True, slots=True)
class Ack(_Probe):
    """ACK: ``target`` answered the probe ``seq`` (directly: target is the sender; or relayed
    by the sender for a PINGREQ)."""

    COMMAND: ClassVar[bytes] = b"ACK"
