"""The one command table, (signature, command, direction) -> class, and the decode entry points."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import Final

from scale0.wire import mdp
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.client import (
    CheckConfig,
    ClientPartial,
    ClientReply,
    ClientRequest,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import (
    EMPTY,
    FRAME_COMMAND,
    FRAME_EMPTY,
    FRAME_SIGNATURE,
    SIG_BROKER,
    SIG_CLIENT,
    SIG_WORKER,
    Message,
    check_frame_sizes,
    show,
)
from scale0.wire.gossip import Ack, Ping, PingReq
from scale0.wire.peer import (
    FORWARD_AS,
    FORWARD_WITH,
    Forward,
    ForwardPartial,
    ForwardReply,
    Hello,
    PeerHeartbeat,
    Table,
    TableReq,
)
from scale0.wire.worker import Ready, WorkerIdRequest, WorkerPartial, WorkerReply, WorkerRequest


class Direction(Enum):
    """Which way a message travels relative to the broker that owns the socket."""

    TO_BROKER = "to_broker"
    FROM_BROKER = "from_broker"


TO: Final = Direction.TO_BROKER
FROM: Final = Direction.FROM_BROKER

#: Signatures each broker socket accepts (docs/protocol.md §1, §10).
FRONTEND_SIGNATURES: Final = frozenset({SIG_CLIENT, mdp.MDPC01, mdp.MDPC02})
BACKEND_SIGNATURES: Final = frozenset({SIG_WORKER, mdp.MDPW01, mdp.MDPW02})
PEER_SIGNATURES: Final = frozenset({SIG_BROKER})

_Key = tuple[bytes, bytes, Direction]

# Peer links are symmetric: every S0B1 command may travel either way (docs/protocol.md §5).
_PEER_CLASSES: Final[tuple[type[Message], ...]] = (
    Hello,
    PeerHeartbeat,
    Table,
    TableReq,
    Ping,
    PingReq,
    Ack,
    Forward,
    ForwardPartial,
    ForwardReply,
    CheckConfig,
    ConfigAck,
    Config,
    Disconnect,
    DisconnectError,
)

# The table, written out: a message is decodable iff it is listed here (docs/protocol.md §3-§5,
# §10). Lookup is one dict access on data from the wire; nothing is resolved by name.
_TABLE: Final[dict[_Key, type[Message]]] = {
    # --- S0C1 client channel, §3 ---
    (SIG_CLIENT, b"CHECKCONFIG", TO): CheckConfig,
    (SIG_CLIENT, b"REQUEST", TO): ClientRequest,
    (SIG_CLIENT, b"HEARTBEAT", TO): Heartbeat,
    (SIG_CLIENT, b"MANAGEMENTREQ", TO): ManagementRequest,
    (SIG_CLIENT, b"DISCONNECT", TO): Disconnect,
    (SIG_CLIENT, b"CONFIGACK", FROM): ConfigAck,
    (SIG_CLIENT, b"CONFIG", FROM): Config,
    (SIG_CLIENT, b"PARTIAL", FROM): ClientPartial,
    (SIG_CLIENT, b"REPLY", FROM): ClientReply,
    (SIG_CLIENT, b"HEARTBEAT", FROM): Heartbeat,
    (SIG_CLIENT, b"MANAGEMENTREP", FROM): ManagementReply,
    (SIG_CLIENT, b"FORCENEGOTIATE", FROM): ForceNegotiate,
    (SIG_CLIENT, b"DISCONNECTERROR", FROM): DisconnectError,
    (SIG_CLIENT, b"DISCONNECT", FROM): Disconnect,  # the broker is shutting down (§3.6)
    # --- S0W1 worker channel, §4 ---
    (SIG_WORKER, b"CHECKCONFIG", TO): CheckConfig,
    (SIG_WORKER, b"READY", TO): Ready,
    (SIG_WORKER, b"PARTIAL", TO): WorkerPartial,
    (SIG_WORKER, b"REPLY", TO): WorkerReply,
    (SIG_WORKER, b"HEARTBEAT", TO): Heartbeat,
    (SIG_WORKER, b"DISCONNECT", TO): Disconnect,
    (SIG_WORKER, b"CONFIGACK", FROM): ConfigAck,
    (SIG_WORKER, b"CONFIG", FROM): Config,
    (SIG_WORKER, b"REQUEST", FROM): WorkerRequest,
    (SIG_WORKER, b"IDREQUEST", FROM): WorkerIdRequest,  # to a request_ids worker (§4.3)
    (SIG_WORKER, b"HEARTBEAT", FROM): Heartbeat,
    (SIG_WORKER, b"FORCENEGOTIATE", FROM): ForceNegotiate,
    (SIG_WORKER, b"DISCONNECTERROR", FROM): DisconnectError,
    (SIG_WORKER, b"DISCONNECT", FROM): Disconnect,  # the broker is shutting down (§3.6)
    # --- S0B1 peer channel, §5: same table both ways ---
    **{(SIG_BROKER, cls.COMMAND, way): cls for cls in _PEER_CLASSES for way in (TO, FROM)},
    (SIG_BROKER, FORWARD_AS, TO): Forward,  # FORWARD with its caller's CURVE key (§5.4)
    (SIG_BROKER, FORWARD_AS, FROM): Forward,
    (SIG_BROKER, FORWARD_WITH, TO): Forward,  # FORWARD with an options object (§5.4)
    (SIG_BROKER, FORWARD_WITH, FROM): Forward,
    # --- 7/MDP, §10 (MDPC01 has no command frame: implicit b"") ---
    (mdp.MDPC01, b"", TO): mdp.MdpClientRequest,
    (mdp.MDPC01, b"", FROM): mdp.MdpClientReply,
    (mdp.MDPW01, mdp.W_READY, TO): mdp.MdpWorkerReady,
    (mdp.MDPW01, mdp.W01_REPLY, TO): mdp.MdpWorkerReply,
    (mdp.MDPW01, mdp.W01_HEARTBEAT, TO): mdp.MdpWorkerHeartbeat,
    (mdp.MDPW01, mdp.W01_DISCONNECT, TO): mdp.MdpWorkerDisconnect,
    (mdp.MDPW01, mdp.W_REQUEST, FROM): mdp.MdpWorkerRequest,
    (mdp.MDPW01, mdp.W01_HEARTBEAT, FROM): mdp.MdpWorkerHeartbeat,
    (mdp.MDPW01, mdp.W01_DISCONNECT, FROM): mdp.MdpWorkerDisconnect,
    # --- 18/MDP, §10 ---
    (mdp.MDPC02, mdp.C02_REQUEST, TO): mdp.MdpClientRequest,
    (mdp.MDPC02, mdp.MAJORTOMO_REQUEST, TO): mdp.MdpClientRequest,  # majortomo's numbering
    (mdp.MDPC02, mdp.C02_PARTIAL, FROM): mdp.MdpClientPartial,
    (mdp.MDPC02, mdp.C02_FINAL, FROM): mdp.MdpClientReply,
    (mdp.MDPW02, mdp.W_READY, TO): mdp.MdpWorkerReady,
    (mdp.MDPW02, mdp.W02_PARTIAL, TO): mdp.MdpWorkerPartial,
    (mdp.MDPW02, mdp.W02_FINAL, TO): mdp.MdpWorkerReply,
    (mdp.MDPW02, mdp.W02_HEARTBEAT, TO): mdp.MdpWorkerHeartbeat,
    (mdp.MDPW02, mdp.W02_DISCONNECT, TO): mdp.MdpWorkerDisconnect,
    (mdp.MDPW02, mdp.W_REQUEST, FROM): mdp.MdpWorkerRequest,
    (mdp.MDPW02, mdp.W02_HEARTBEAT, FROM): mdp.MdpWorkerHeartbeat,
    (mdp.MDPW02, mdp.W02_DISCONNECT, FROM): mdp.MdpWorkerDisconnect,
}

#: Read-only view of the table, for tests and docs.
COMMANDS: Final[Mapping[_Key, type[Message]]] = MappingProxyType(_TABLE)

#: MDP/0.2 signatures that may come without the empty frame 0 (18/MDP's own text, §10).
_UNDELIMITED: Final = frozenset({mdp.MDPC02, mdp.MDPW02})

#: Every signature this implementation speaks; anything else in frame 1 is a 501.
SIGNATURES: Final = frozenset(signature for signature, _, _ in COMMANDS)


def _decode(
    frames: Sequence[bytes],
    direction: Direction,
    accept: Collection[bytes],
    max_frame_bytes: int,
) -> Message:
    # Fast path for the common case (hot path included): one tuple key, one dict lookup, one
    # C-level size scan. Anything unusual falls through to the checks below, which name the
    # exact problem in the order of docs/protocol.md §2.4.
    if len(frames) > 2 and not frames[0]:
        signature = frames[1]
        if signature in accept and signature != mdp.MDPC01:
            cls = _TABLE.get((signature, frames[2], direction))
            if cls is not None and max(map(len, frames)) <= max_frame_bytes:
                return cls.from_frames(frames)
    if frames and frames[0] in _UNDELIMITED and frames[0] in accept:
        # 18/MDP's own framing has no empty frame 0 (§10): read it as if it had one, and say
        # so on the message, which is answered in the same framing. Frame numbers in errors
        # count the frame 0 it left out.
        message = _decode([EMPTY, *frames], direction, accept, max_frame_bytes)
        return dataclasses.replace(message, delimited=False)  # type: ignore[type-var]
    check_frame_sizes(frames, max_frame_bytes)
    if not frames:
        raise ProtocolError.malformed(FRAME_EMPTY, "empty delimiter missing (0 frames)")
    if frames[FRAME_EMPTY]:
        raise ProtocolError.malformed(
            FRAME_EMPTY, f"expected empty delimiter, got {len(frames[FRAME_EMPTY])} bytes"
        )
    if len(frames) < 2:
        raise ProtocolError.malformed(FRAME_SIGNATURE, "signature missing (1 frame)")
    signature = frames[FRAME_SIGNATURE]
    if signature not in SIGNATURES:
        raise ProtocolError.unknown(FRAME_SIGNATURE, f"unknown signature {show(signature)}")
    if signature not in accept:
        raise ProtocolError.malformed(
            FRAME_SIGNATURE, f"signature {show(signature)} is not accepted here"
        )
    if signature == mdp.MDPC01:
        command = b""  # 7/MDP client messages have no command frame
    elif len(frames) < 3:
        raise ProtocolError.malformed(FRAME_COMMAND, "command missing (2 frames)")
    else:
        command = frames[FRAME_COMMAND]
    cls = _TABLE.get((signature, command, direction))
    if cls is None:
        raise ProtocolError.unknown(
            FRAME_COMMAND,
            f"unknown command {show(command)} for {signature.decode('ascii')} {direction.value}",
        )
    return cls.from_frames(frames)


def decode_to_broker(
    frames: Sequence[bytes],
    *,
    max_frame_bytes: int,
    signatures: Collection[bytes] = SIGNATURES,
) -> Message:
    """Decode what a broker received on a ROUTER socket (frames after the routing id).

    ``signatures`` limits what this socket accepts (FRONTEND_SIGNATURES, BACKEND_SIGNATURES,
    PEER_SIGNATURES); a known signature outside it is 400, an unknown one 501 (§2.4).
    Raises only ProtocolError.
    """
    return _decode(frames, TO, signatures, max_frame_bytes)


def decode_from_broker(
    frames: Sequence[bytes], *, signature: bytes, max_frame_bytes: int
) -> Message:
    """Decode what a client, worker or peer DEALER received from a broker.

    ``signature`` is the one protocol this connection speaks. Raises only ProtocolError.
    """
    return _decode(frames, FROM, (signature,), max_frame_bytes)


def encode(message: Message) -> list[bytes]:
    """Frames of ``message``, starting with the empty delimiter (prepend a routing id to send)."""
    return message.to_frames()
