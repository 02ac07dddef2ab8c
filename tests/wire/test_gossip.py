"""PING, PINGREQ, ACK and their member rows (docs/protocol.md §5.6): round trips and garbage.

The registry's own tests cover these classes too (tests/wire/strategies.py lists them, so
test_roundtrip and test_fuzz draw them); here the member rows' frame is attacked directly.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.wire import ProtocolError
from scale0.wire.frames import SIG_BROKER
from scale0.wire.gossip import MAX_MEMBER_ROWS, Ack, MemberRow, MemberStatus, Ping, PingReq
from scale0.wire.peer import BrokerState
from scale0.wire.registry import decode_to_broker
from tests.wire.strategies import json_values, member_rows, names, times, versions0

LIMIT = 1 << 20
ROW = {
    "broker_id": "b1",
    "status": "alive",
    "incarnation": 7,
    "state": "active",
    "config_version": 3,
    "services": {"echo": 4},
}


def frames_with(members: bytes, command: bytes = b"PING") -> list[bytes]:
    options = b'{"broker_id":"b2","seq":1,"target":"b1","time":1.5}'
    return [b"", SIG_BROKER, command, options, members]


@given(st.sampled_from([Ping, PingReq, Ack]), names, versions0, names, times, member_rows)
def test_each_probe_message_round_trips_through_the_registry(
    cls: type[Ping], sender: str, seq: int, target: str, time: float, rows: tuple[MemberRow, ...]
) -> None:
    message = cls(sender, seq, target, time, rows)
    assert decode_to_broker(message.to_frames(), max_frame_bytes=LIMIT) == message


def test_a_row_is_json_with_the_names_of_the_protocol() -> None:
    row = MemberRow("b1", MemberStatus.ALIVE, 7, BrokerState.ACTIVE, 3, (("echo", 4),))
    frames = Ping("b2", 1, "b1", 1.5, (row,)).to_frames()
    assert json.loads(frames[4]) == [ROW]
    assert decode_to_broker(frames, max_frame_bytes=LIMIT) == Ping("b2", 1, "b1", 1.5, (row,))


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"status": "zombie"}, "members[0]"),
        ({"incarnation": -1}, "incarnation"),
        ({"incarnation": 1.5}, "incarnation"),
        ({"state": "asleep"}, "state"),
        ({"broker_id": ""}, "broker_id"),
        ({"services": []}, "services"),
        ({"services": {"echo": -1}}, "echo"),
        ({"services": {"echo": "4"}}, "echo"),
        ({"services": {"": 1}}, "service"),
        ({"config_version": None}, "config_version"),
    ],
)
def test_a_bad_row_is_a_protocol_error_naming_the_row_and_field(
    change: dict[str, object], complaint: str
) -> None:
    row = {**ROW, **change}
    with pytest.raises(ProtocolError) as caught:
        decode_to_broker(frames_with(json.dumps([row]).encode()), max_frame_bytes=LIMIT)
    assert "members[0]" in caught.value.reason
    assert complaint in caught.value.reason


@pytest.mark.parametrize(
    "members",
    [
        b"{}",
        b"null",
        b"[1]",
        b"not json",
        b'"rows"',
        json.dumps([ROW] * (MAX_MEMBER_ROWS + 1)).encode(),
    ],
)
def test_a_members_frame_that_is_not_a_list_of_rows_is_a_protocol_error(members: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_to_broker(frames_with(members), max_frame_bytes=LIMIT)


def test_a_missing_members_frame_or_one_too_many_is_a_protocol_error() -> None:
    frames = frames_with(b"[]")
    for bad in (frames[:4], [*frames, b"[]"]):
        with pytest.raises(ProtocolError):
            decode_to_broker(bad, max_frame_bytes=LIMIT)


@given(st.lists(json_values, max_size=4))
def test_arbitrary_json_in_the_members_frame_raises_nothing_but_protocol_error(
    rows: list[object],
) -> None:
    for command in (b"PING", b"PINGREQ", b"ACK"):
        with contextlib.suppress(ProtocolError):
            decode_to_broker(frames_with(json.dumps(rows).encode(), command), max_frame_bytes=LIMIT)
