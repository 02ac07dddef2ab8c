"""Arbitrary frames raise nothing but ProtocolError from every decode entry point (§2.4)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.wire import ProtocolError, decode_config_publication, decode_from_broker, encode
from scale0.wire.frames import encode_json
from scale0.wire.registry import COMMANDS, SIGNATURES, decode_to_broker
from tests.wire.strategies import any_message, json_values

LIMIT = 512

Decoder = Callable[[Sequence[bytes]], object]
DECODERS: list[tuple[str, Decoder]] = [
    ("to_broker", lambda frames: decode_to_broker(frames, max_frame_bytes=LIMIT)),
    *(
        (
            f"from_broker:{signature.decode()}",
            lambda frames, s=signature: decode_from_broker(
                frames, signature=s, max_frame_bytes=LIMIT
            ),
        )
        for signature in sorted(SIGNATURES)
    ),
    ("publication", lambda frames: decode_config_publication(frames, max_frame_bytes=LIMIT)),
]

# Every option name any message uses, so garbage options hit the typed readers, not just "missing".
OPTION_KEYS = sorted(
    {
        "args", "auth_id", "auth_password", "broker_id", "capacity", "client_id", "code",
        "command", "config_type", "config_version", "endpoint", "endpoints", "family", "full",
        "hbeatinterval_ms", "heartbeat", "message", "origin", "reason", "request_id",
        "services", "sha256", "signature", "since_seq", "state", "table_mode", "table_seq",
        "time", "worker_id", "last_heartbeat", "seq", "target", "incarnation", "status",
    }
)  # fmt: skip

garbage_frame = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"200", b"{}", b"[]", b"null", b"NaN", b"\xff", b"mmi.x", b"[" * 50]),
    json_values.map(encode_json),
    st.dictionaries(st.sampled_from(OPTION_KEYS), json_values, max_size=8).map(encode_json),
    st.binary(min_size=LIMIT - 2, max_size=LIMIT + 2),
)
prefixes = st.sampled_from(
    sorted(
        {
            (b"", signature) if command == b"" else (b"", signature, command)
            for signature, command, _ in COMMANDS
        }
    )
)


def assert_only_protocol_errors(frames: list[bytes]) -> None:
    for name, decode in DECODERS:
        try:
            decode(frames)
        except ProtocolError as error:
            assert error.code in (400, 501), name
            if error.frame is not None:
                assert str(error).startswith(f"frame {error.frame}: "), name
                # An MDPC02/MDPW02 message without the empty frame 0 is numbered as if it
                # were there (docs/protocol.md §10, "Three readings"): one past its frames.
                undelimited = bool(frames) and frames[0] in (b"MDPC02", b"MDPW02")
                assert 0 <= error.frame <= len(frames) + undelimited, name


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_frames(frames: list[bytes]) -> None:
    assert_only_protocol_errors(frames)


@settings(max_examples=500)
@given(prefixes, st.lists(garbage_frame, max_size=6))
def test_valid_prefix_then_garbage(prefix: tuple[bytes, ...], tail: list[bytes]) -> None:
    assert_only_protocol_errors([*prefix, *tail])


@settings(max_examples=300)
@given(any_message, st.data())
def test_mutated_valid_messages(message: object, data: st.DataObject) -> None:
    frames = encode(message)  # type: ignore[arg-type]
    index = data.draw(st.integers(0, len(frames)))
    action = data.draw(st.sampled_from(["replace", "insert", "truncate"]))
    if action == "replace" and index < len(frames):
        frames[index] = data.draw(garbage_frame)
    elif action == "insert":
        frames.insert(index, data.draw(garbage_frame))
    else:
        del frames[index:]
    assert_only_protocol_errors(frames)


@settings(max_examples=200)
@given(st.lists(garbage_frame, max_size=2))
def test_publication_garbage(tail: list[bytes]) -> None:
    assert_only_protocol_errors([b"CONFIG", *tail])
