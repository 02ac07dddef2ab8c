"""Every message class survives encode -> decode unchanged, through the public entry points."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.wire import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    PEER_SIGNATURES,
    Message,
    PublishedConfig,
    decode_config_publication,
    decode_from_broker,
    decode_to_broker,
    encode,
    mdp,
)
from scale0.wire.registry import COMMANDS, Direction
from tests.wire.strategies import MESSAGES, published_configs

LIMIT = 1 << 20
SOCKET_SIGNATURES = {
    signature: accepted
    for accepted in (FRONTEND_SIGNATURES, BACKEND_SIGNATURES, PEER_SIGNATURES)
    for signature in accepted
}


def _key_command(frames: list[bytes]) -> bytes:
    return b"" if frames[1] == mdp.MDPC01 else frames[2]


def test_every_registered_class_has_a_strategy() -> None:
    assert set(COMMANDS.values()) == set(MESSAGES)


@pytest.mark.parametrize("cls", list(MESSAGES), ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_round_trip(cls: type[Message], data: st.DataObject) -> None:
    message = data.draw(MESSAGES[cls])
    frames = encode(message)
    assert frames[0] == b""
    assert all(isinstance(frame, bytes) for frame in frames)
    signature = frames[1]
    assert signature == message.protocol
    command = _key_command(frames)
    directions = [
        way for way in Direction if COMMANDS.get((signature, command, way)) is type(message)
    ]
    assert directions, f"{cls.__name__} encodes to an unregistered key"
    for way in directions:
        if way is Direction.TO_BROKER:
            decoded = decode_to_broker(
                frames, max_frame_bytes=LIMIT, signatures=SOCKET_SIGNATURES[signature]
            )
        else:
            decoded = decode_from_broker(frames, signature=signature, max_frame_bytes=LIMIT)
        assert decoded == message
        assert type(decoded) is type(message)


@given(published_configs)
def test_published_config_round_trip(config: PublishedConfig) -> None:
    frames = config.to_frames()
    assert frames[0] == b"CONFIG"
    assert decode_config_publication(frames, max_frame_bytes=LIMIT) == config


def test_hot_path_frames_are_positional() -> None:
    """§3.3/§4.3: hot-path messages are the documented frames, no options frame."""
    from scale0.wire import ClientReply, ClientRequest, WorkerReply, WorkerRequest

    assert encode(ClientRequest("echo", b"r1", (b"a", b"b"))) == [
        b"", b"S0C1", b"REQUEST", b"echo", b"r1", b"a", b"b",
    ]  # fmt: skip
    assert encode(ClientReply("echo", b"r1", 200, (b"ok",))) == [
        b"", b"S0C1", b"REPLY", b"echo", b"r1", b"200", b"ok",
    ]  # fmt: skip
    assert encode(WorkerRequest(b"t1", "echo", (b"a",))) == [
        b"", b"S0W1", b"REQUEST", b"t1", b"echo", b"a",
    ]  # fmt: skip
    assert encode(WorkerReply(b"t1", 500)) == [b"", b"S0W1", b"REPLY", b"t1", b"500"]


def test_control_options_are_compact_json_and_omit_absent_optionals() -> None:
    from scale0.wire import SIG_CLIENT, CheckConfig, ConfigType, Disconnect

    assert encode(CheckConfig(ConfigType.JSON, protocol=SIG_CLIENT))[3] == b'{"config_type":"json"}'
    assert encode(Disconnect(protocol=SIG_CLIENT)) == [b"", b"S0C1", b"DISCONNECT", b""]


def test_mdp_frames_match_the_rfcs() -> None:
    """7/MDP and 18/MDP layouts, spelled out (docs/protocol.md §10)."""
    assert encode(mdp.MdpClientRequest("echo", (b"x",), protocol=mdp.MDPC01)) == [
        b"", b"MDPC01", b"echo", b"x",
    ]  # fmt: skip
    assert encode(mdp.MdpClientRequest("echo", (b"x",), protocol=mdp.MDPC02)) == [
        b"", b"MDPC02", b"\x01", b"echo", b"x",
    ]  # fmt: skip
    assert encode(mdp.MdpWorkerReply(b"t", (b"x",), protocol=mdp.MDPW01)) == [
        b"", b"MDPW01", b"\x03", b"t", b"", b"x",
    ]  # fmt: skip
    assert encode(mdp.MdpWorkerReply(b"t", (b"x",), protocol=mdp.MDPW02)) == [
        b"", b"MDPW02", b"\x04", b"t", b"", b"x",
    ]  # fmt: skip
    assert encode(mdp.MdpWorkerHeartbeat(protocol=mdp.MDPW01)) == [b"", b"MDPW01", b"\x04"]
    assert encode(mdp.MdpWorkerDisconnect(protocol=mdp.MDPW02)) == [b"", b"MDPW02", b"\x06"]
