"""Majordomo compatibility codecs: 7/MDP (MDPC01, MDPW01) and 18/MDP (MDPC02, MDPW02), §10."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final, Self

from scale0.wire.errors import ProtocolError
from scale0.wire.frames import EMPTY, Message, name_frame, opaque_id

MDPC01: Final = b"MDPC01"
MDPW01: Final = b"MDPW01"
MDPC02: Final = b"MDPC02"
MDPW02: Final = b"MDPW02"
MDP_SIGNATURES: Final = frozenset({MDPC01, MDPW01, MDPC02, MDPW02})

# Command bytes (frame 2). MDPC01 has no command frame: a client sends only REQUEST and the
# broker only REPLY, so the registry keys MDPC01 messages under the implicit command b"".
C02_REQUEST: Final = b"\x01"
C02_PARTIAL: Final = b"\x02"
C02_FINAL: Final = b"\x03"

W_READY: Final = b"\x01"
W_REQUEST: Final = b"\x02"
W01_REPLY: Final = b"\x03"
W01_HEARTBEAT: Final = b"\x04"
W01_DISCONNECT: Final = b"\x05"
W02_PARTIAL: Final = b"\x03"
W02_FINAL: Final = b"\x04"
W02_HEARTBEAT: Final = b"\x05"
W02_DISCONNECT: Final = b"\x06"


# Two other readings of MDP/0.2 meet a broker (docs/protocol.md §10): 18/MDP's own text has no
# empty frame 0 (``delimited=False`` on a message: the registry reads such frames as if they
# had one, and this module writes them back without it); majortomo (PyPI) keeps frame 0 but
# numbers the client commands like the worker's and answers without the service frame
# (``majortomo=True``). A broker answers each peer in the reading it spoke.
MAJORTOMO_REQUEST: Final = b"\x02"


def reading_code(reading: tuple[bytes, bool, bool]) -> int:
    """A peer's reading (signature, delimited, majortomo) as the one int the C lane is told
    (scale0/net/_lane.c, ``note``): bit 0 version 1 (MDP*01), bit 1 version 2 (MDP*02), bit 2
    frame 0 is the empty delimiter, bit 3 majortomo's client command numbers. Never 0 (0
    means "speaks S0P")."""
    protocol, delimited, majortomo = reading
    code = 1 if protocol.endswith(b"01") else 2
    if delimited:
        code |= 4
    if majortomo:
        code |= 8
    return code


MAJORTOMO_PARTIAL: Final = b"\x03"
MAJORTOMO_FINAL: Final = b"\x04"


def _head(delimited: bool, *frames: bytes) -> list[bytes]:
    return [EMPTY, *frames] if delimited else list(frames)


# The head frames of the two messages of every request, encoded once per reading (the hot
# path, docs/performance.md): worker REQUEST by (signature, delimited); client final reply by
# (signature, delimited, majortomo).
_W_REQUEST_HEADS: Final[dict[tuple[bytes, bool], tuple[bytes, ...]]] = {
    (signature, delimited): ((EMPTY,) if delimited else ()) + (signature, W_REQUEST)
    for signature in (MDPW01, MDPW02)
    for delimited in (True, False)
}
_C_FINAL_HEADS: Final[dict[tuple[bytes, bool, bool], tuple[bytes, ...]]] = {
    (signature, delimited, majortomo): ((EMPTY,) if delimited else ())
    + ((MDPC01,) if signature == MDPC01 else (MDPC02, MAJORTOMO_FINAL if majortomo else C02_FINAL))
    for signature in (MDPC01, MDPC02)
    for delimited in (True, False)
    for majortomo in (True, False)
}


def _client_head(protocol: bytes, command: bytes, delimited: bool = True) -> list[bytes]:
    # MDPC01 carries no command frame (7/MDP); MDPC02 does (18/MDP).
    return _head(delimited, MDPC01) if protocol == MDPC01 else _head(delimited, protocol, command)


def _client_service_index(frames: Sequence[bytes]) -> int:
    return 2 if frames[1] == MDPC01 else 3


def _client_parse(frames: Sequence[bytes]) -> tuple[str, tuple[bytes, ...]]:
    index = _client_service_index(frames)
    if len(frames) <= index:
        raise ProtocolError.malformed(len(frames), f"service missing ({len(frames)} frames)")
    return name_frame(frames[index], index, "service"), tuple(frames[index + 1 :])


@dataclass(frozen=True, slots=True)
class MdpClientRequest(Message):
    """Majordomo client REQUEST: ``service, body...`` (MDPC01 or MDPC02 0x01)."""

    COMMAND: ClassVar[bytes] = b"REQUEST"

    service: str
    body: tuple[bytes, ...] = ()
    protocol: bytes = field(default=MDPC02, kw_only=True)
    delimited: bool = field(default=True, kw_only=True)
    majortomo: bool = field(default=False, kw_only=True)

    def to_frames(self) -> list[bytes]:
        command = MAJORTOMO_REQUEST if self.majortomo else C02_REQUEST
        head = _client_head(self.protocol, command, self.delimited)
        return [*head, self.service.encode("utf-8"), *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        service, body = _client_parse(frames)
        majortomo = frames[1] == MDPC02 and frames[2] == MAJORTOMO_REQUEST
        return cls(service, body, protocol=frames[1], majortomo=majortomo)


@dataclass(frozen=True, slots=True)
class MdpClientReply(Message):
    """Majordomo final reply: MDPC01 reply, or MDPC02 FINAL (0x03): ``service, body...``."""

    COMMAND: ClassVar[bytes] = b"FINAL"

    service: str
    body: tuple[bytes, ...] = ()
    protocol: bytes = field(default=MDPC02, kw_only=True)
    delimited: bool = field(default=True, kw_only=True)
    majortomo: bool = field(default=False, kw_only=True)

    def to_frames(self) -> list[bytes]:
        head = _C_FINAL_HEADS.get((self.protocol, self.delimited, self.majortomo))
        if head is None:  # not a Majordomo signature: the decoder never makes one
            command = MAJORTOMO_FINAL if self.majortomo else C02_FINAL
            head = tuple(_client_head(self.protocol, command, self.delimited))
        if self.majortomo:  # no service frame in majortomo's reading
            return [*head, *self.body]
        return [*head, self.service.encode("utf-8"), *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        service, body = _client_parse(frames)
        return cls(service, body, protocol=frames[1])


@dataclass(frozen=True, slots=True)
class MdpClientPartial(Message):
    """MDPC02 PARTIAL (0x02): ``service, body...`` (7/MDP has no partial replies)."""

    COMMAND: ClassVar[bytes] = b"PARTIAL"
    PROTOCOL: ClassVar[bytes] = MDPC02

    service: str
    body: tuple[bytes, ...] = ()
    delimited: bool = field(default=True, kw_only=True)
    majortomo: bool = field(default=False, kw_only=True)

    def to_frames(self) -> list[bytes]:
        if self.majortomo:
            return [*_head(self.delimited, MDPC02, MAJORTOMO_PARTIAL), *self.body]
        head = _head(self.delimited, MDPC02, C02_PARTIAL)
        return [*head, self.service.encode("utf-8"), *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        service, body = _client_parse(frames)
        return cls(service, body)


def _worker_envelope(frames: Sequence[bytes]) -> tuple[bytes, tuple[bytes, ...]]:
    """``client address, empty, body...`` of MDP worker REQUEST/PARTIAL/REPLY/FINAL.

    Scale0 puts its ticket where MDP has the client address, so one frame, 1..255 bytes.
    """
    if len(frames) < 5:
        missing = "client address" if len(frames) == 3 else "empty delimiter"
        raise ProtocolError.malformed(len(frames), f"{missing} missing ({len(frames)} frames)")
    if frames[4]:
        raise ProtocolError.malformed(4, f"expected empty delimiter, got {len(frames[4])} bytes")
    return opaque_id(frames[3], 3, "client address"), tuple(frames[5:])


def _no_more(frames: Sequence[bytes], count: int) -> None:
    if len(frames) < count:
        raise ProtocolError.malformed(len(frames), f"service missing ({len(frames)} frames)")
    if len(frames) > count:
        raise ProtocolError.malformed(count, f"unexpected frame ({len(frames)} frames)")


@dataclass(frozen=True, slots=True)
class MdpWorkerReady(Message):
    """Majordomo worker READY (0x01): one ``service`` per worker connection."""

    COMMAND: ClassVar[bytes] = b"READY"

    service: str
    protocol: bytes = field(default=MDPW02, kw_only=True)
    delimited: bool = field(default=True, kw_only=True)

    def to_frames(self) -> list[bytes]:
        return [*_head(self.delimited, self.protocol, W_READY), self.service.encode("utf-8")]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        _no_more(frames, 4)
        return cls(name_frame(frames[3], 3, "service"), protocol=frames[1])


@dataclass(frozen=True, slots=True)
class MdpWorkerRequest(Message):
    """Majordomo worker REQUEST (0x02) broker → worker: ``ticket`` in the client-address slot."""

    COMMAND: ClassVar[bytes] = b"REQUEST"

    ticket: bytes
    body: tuple[bytes, ...] = ()
    protocol: bytes = field(default=MDPW02, kw_only=True)
    delimited: bool = field(default=True, kw_only=True)

    def to_frames(self) -> list[bytes]:
        head = _W_REQUEST_HEADS.get((self.protocol, self.delimited))
        if head is None:  # not a Majordomo signature: the decoder never makes one
            head = tuple(_head(self.delimited, self.protocol, W_REQUEST))
        return [*head, self.ticket, EMPTY, *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        ticket, body = _worker_envelope(frames)
        return cls(ticket, body, protocol=frames[1])


@dataclass(frozen=True, slots=True)
class MdpWorkerPartial(Message):
    """MDPW02 PARTIAL (0x03) worker → broker: ``ticket, empty, body...``."""

    COMMAND: ClassVar[bytes] = b"PARTIAL"
    PROTOCOL: ClassVar[bytes] = MDPW02

    ticket: bytes
    body: tuple[bytes, ...] = ()
    delimited: bool = field(default=True, kw_only=True)

    def to_frames(self) -> list[bytes]:
        return [*_head(self.delimited, MDPW02, W02_PARTIAL), self.ticket, EMPTY, *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        ticket, body = _worker_envelope(frames)
        return cls(ticket, body)


@dataclass(frozen=True, slots=True)
class MdpWorkerReply(Message):
    """Majordomo final reply worker → broker: MDPW01 REPLY (0x03) or MDPW02 FINAL (0x04)."""

    COMMAND: ClassVar[bytes] = b"FINAL"

    ticket: bytes
    body: tuple[bytes, ...] = ()
    protocol: bytes = field(default=MDPW02, kw_only=True)
    delimited: bool = field(default=True, kw_only=True)

    def to_frames(self) -> list[bytes]:
        command = W01_REPLY if self.protocol == MDPW01 else W02_FINAL
        return [*_head(self.delimited, self.protocol, command), self.ticket, EMPTY, *self.body]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        ticket, body = _worker_envelope(frames)
        return cls(ticket, body, protocol=frames[1])


@dataclass(frozen=True, slots=True)
class MdpWorkerHeartbeat(Message):
    """Majordomo HEARTBEAT (MDPW01 0x04, MDPW02 0x05), both directions."""

    COMMAND: ClassVar[bytes] = b"HEARTBEAT"

    protocol: bytes = field(default=MDPW02, kw_only=True)
    delimited: bool = field(default=True, kw_only=True)

    def to_frames(self) -> list[bytes]:
        command = W01_HEARTBEAT if self.protocol == MDPW01 else W02_HEARTBEAT
        return _head(self.delimited, self.protocol, command)

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        if len(frames) != 3:
            raise ProtocolError.malformed(3, f"unexpected frame ({len(frames)} frames, 3 max)")
        return cls(protocol=frames[1])


@dataclass(frozen=True, slots=True)
class MdpWorkerDisconnect(Message):
    """Majordomo DISCONNECT (MDPW01 0x05, MDPW02 0x06), both directions."""

    COMMAND: ClassVar[bytes] = b"DISCONNECT"

    protocol: bytes = field(default=MDPW02, kw_only=True)
    delimited: bool = field(default=True, kw_only=True)

    def to_frames(self) -> list[bytes]:
        command = W01_DISCONNECT if self.protocol == MDPW01 else W02_DISCONNECT
        return _head(self.delimited, self.protocol, command)

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        if len(frames) != 3:
            raise ProtocolError.malformed(3, f"unexpected frame ({len(frames)} frames, 3 max)")
        return cls(protocol=frames[1])
