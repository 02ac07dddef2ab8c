"""The command table: consistent with the classes, the socket signature sets, and the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scale0.wire import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    PEER_SIGNATURES,
    SIG_BROKER,
    SIG_CLIENT,
    SIG_WORKER,
    BrokerState,
    ClientRequest,
    Heartbeat,
    PeerHeartbeat,
    WorkerRequest,
    decode_from_broker,
    decode_to_broker,
)
from scale0.wire.frames import S0_SIGNATURES
from scale0.wire.registry import COMMANDS, SIGNATURES, Direction

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_s0_classes_encode_the_command_they_are_registered_under() -> None:
    for (signature, command, _), cls in COMMANDS.items():
        if signature in S0_SIGNATURES:
            # FORWARD's class also encodes FORWARDAS, its form with a caller (§5.4).
            assert command in (cls.COMMAND, *getattr(cls, "ALSO", ())), cls.__name__


def test_socket_signature_sets_partition_the_table() -> None:
    assert FRONTEND_SIGNATURES | BACKEND_SIGNATURES | PEER_SIGNATURES == SIGNATURES
    assert not FRONTEND_SIGNATURES & BACKEND_SIGNATURES
    assert {SIG_BROKER} == PEER_SIGNATURES


def test_direction_decides_the_request_class() -> None:
    """§3.3 / §4.3: REQUEST means different frames on each channel and direction."""
    assert COMMANDS[(SIG_CLIENT, b"REQUEST", Direction.TO_BROKER)] is ClientRequest
    assert COMMANDS[(SIG_WORKER, b"REQUEST", Direction.FROM_BROKER)] is WorkerRequest
    assert (SIG_CLIENT, b"REQUEST", Direction.FROM_BROKER) not in COMMANDS
    assert (SIG_WORKER, b"REQUEST", Direction.TO_BROKER) not in COMMANDS


def test_shared_heartbeat_keeps_its_signature() -> None:
    frames = Heartbeat(1.0, 2, protocol=SIG_WORKER).to_frames()
    decoded = decode_to_broker(frames, max_frame_bytes=1024, signatures=BACKEND_SIGNATURES)
    assert decoded.protocol == SIG_WORKER
    peer = PeerHeartbeat("b1", 1.0, BrokerState.ACTIVE, 1, 0)
    assert decode_from_broker(peer.to_frames(), signature=SIG_BROKER, max_frame_bytes=1024) == peer


def test_peer_commands_are_symmetric() -> None:
    for signature, command, way in COMMANDS:
        if signature == SIG_BROKER:
            other = Direction.FROM_BROKER if way is Direction.TO_BROKER else Direction.TO_BROKER
            assert (signature, command, other) in COMMANDS


@pytest.mark.parametrize(
    "command",
    sorted({command.decode() for signature, command, _ in COMMANDS if signature in S0_SIGNATURES}),
)
def test_every_command_is_documented(command: str) -> None:
    """Each S0P/1 command has a row in a command table of docs/protocol.md."""
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    assert re.search(rf"^\| {command}[ |]", text, re.MULTILINE), command


def test_every_class_is_in_the_implementation_map() -> None:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    for cls in set(COMMANDS.values()):
        assert f"`{cls.__name__}`" in text, cls.__name__


def test_docs_have_a_deviations_section() -> None:
    assert "## 13. Deviations from the brief" in PROTOCOL_MD.read_text(encoding="utf-8")
