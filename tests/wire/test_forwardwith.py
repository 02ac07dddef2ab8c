"""FORWARDWITH and HELLO's ``understands`` (docs/protocol.md §5.1, §5.4): the encoding, the
older forms it leaves byte for byte as they were, and every malformed message named."""

from __future__ import annotations

import json

import pytest

from scale0.wire import ProtocolError, decode_from_broker, decode_to_broker
from scale0.wire.frames import SIG_BROKER
from scale0.wire.peer import BrokerState, Forward, Hello, TableMode

LIMIT = 1 << 16
KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # 40 Z85 characters
HEAD = [b"", b"S0B1", b"FORWARDWITH", b"T1", b"echo", b"b1"]


def decode(frames: list[bytes]) -> object:
    message = decode_to_broker(frames, max_frame_bytes=LIMIT, signatures={SIG_BROKER})
    assert decode_from_broker(frames, signature=SIG_BROKER, max_frame_bytes=LIMIT) == message
    return message


def refused(options: bytes | None, *body: bytes) -> ProtocolError:
    frames = HEAD if options is None else [*HEAD, options, *body]
    with pytest.raises(ProtocolError) as info:
        decode_to_broker(list(frames), max_frame_bytes=LIMIT, signatures={SIG_BROKER})
    return info.value


def test_forwardwith_carries_ids_deadline_and_caller_and_decodes_to_the_same_message() -> None:
    message = Forward(
        b"T1",
        "echo",
        "b1",
        (b"x", b""),
        caller=KEY,
        client_id="alice",
        request_id=b"\x00\xffr1",
        deadline_ms=1500,
    )
    frames = message.to_frames()
    assert frames[:6] == HEAD and frames[7:] == [b"x", b""]
    assert json.loads(frames[6]) == {
        "deadline_ms": 1500,
        "client_id": "alice",
        "request_id": "00ff7231",
        "caller": KEY,
    }
    assert decode(frames) == message


def test_forwardwith_without_ids_or_caller_and_an_unknown_option_is_ignored() -> None:
    plain = Forward(b"T1", "echo", "b1", (b"x",), deadline_ms=0)
    assert plain.to_frames()[6] == b'{"deadline_ms":0}'
    assert decode(plain.to_frames()) == plain
    later = [*HEAD, b'{"deadline_ms":7,"priority":"high"}', b"x"]  # §2.2 rule 5
    assert decode(later) == Forward(b"T1", "echo", "b1", (b"x",), deadline_ms=7)


def test_without_a_deadline_forward_and_forwardas_are_the_older_forms_byte_for_byte() -> None:
    assert Forward(b"T1", "echo", "b1", (b"x",)).to_frames() == [
        b"",
        b"S0B1",
        b"FORWARD",
        b"T1",
        b"echo",
        b"b1",
        b"x",
    ]
    frames = Forward(b"T1", "echo", "b1", (b"x",), caller=KEY).to_frames()
    assert frames[2] == b"FORWARDAS" and frames[6] == KEY.encode()
    # An older broker's FORWARD decodes with no ids and no deadline.
    older = decode([b"", b"S0B1", b"FORWARD", b"T1", b"echo", b"b1", b"x"])
    assert isinstance(older, Forward) and older.deadline_ms is None and older.client_id == ""


@pytest.mark.parametrize(
    ("options", "text"),
    [
        (None, "frame 6: options missing (6 frames)"),
        (b"[]", "frame 6: options is not a JSON object"),
        (b"{bad", "frame 6: options is not valid JSON"),
        (b"{}", "frame 6: option 'deadline_ms' is missing"),
        (b'{"deadline_ms":-1}', "frame 6: option 'deadline_ms' is -1"),
        (b'{"deadline_ms":true}', "frame 6: option 'deadline_ms' must be an integer"),
        (b'{"deadline_ms":1.5}', "frame 6: option 'deadline_ms' must be an integer"),
        (b'{"deadline_ms":1,"client_id":"alice"}', "frame 6: option 'request_id' missing"),
        (b'{"deadline_ms":1,"request_id":"7231"}', "frame 6: option 'client_id' missing"),
        (b'{"deadline_ms":1,"client_id":"","request_id":"72"}', "frame 6: option 'client_id'"),
        (b'{"deadline_ms":1,"client_id":"a","request_id":"ABCD"}', "frame 6: option 'request_id'"),
        (b'{"deadline_ms":1,"client_id":"a","request_id":"abc"}', "frame 6: option 'request_id'"),
        (b'{"deadline_ms":1,"client_id":"a","request_id":""}', "frame 6: option 'request_id'"),
        (b'{"deadline_ms":1,"client_id":"a","request_id":7}', "frame 6: option 'request_id'"),
        (
            b'{"deadline_ms":1,"client_id":"a","request_id":"' + b"ab" * 256 + b'"}',
            "frame 6: option 'request_id' is not 1..255 bytes",
        ),
        (b'{"deadline_ms":1,"caller":"short"}', "frame 6: caller is not a CURVE key"),
        (b'{"deadline_ms":1,"caller":42}', "frame 6: option 'caller' is not a string"),
    ],
)
def test_a_malformed_forwardwith_is_refused_naming_what_is_wrong(
    options: bytes | None, text: str
) -> None:
    error = refused(options, b"x")
    assert error.code == 400
    assert str(error).startswith(text), str(error)


@pytest.mark.parametrize(
    ("index", "frame", "text"),
    [
        (3, b"", "frame 3: ticket is 0 bytes"),
        (4, b"", "frame 4: service is empty"),
        (5, b"\xff", "frame 5: origin_broker is not valid UTF-8"),
    ],
)
def test_a_forwardwith_with_a_bad_head_frame_is_refused(
    index: int, frame: bytes, text: str
) -> None:
    frames = [*HEAD, b'{"deadline_ms":1}']
    frames[index] = frame
    with pytest.raises(ProtocolError) as info:
        decode_to_broker(frames, max_frame_bytes=LIMIT, signatures={SIG_BROKER})
    assert info.value.code == 400 and str(info.value).startswith(text), str(info.value)


def test_hello_says_what_it_understands_and_an_older_hello_says_nothing() -> None:
    hello = Hello(
        "b1", "fam", BrokerState.ACTIVE, 3, {}, TableMode.PULL, frozenset({"FORWARDWITH"})
    )
    frames = hello.to_frames()
    assert json.loads(frames[3])["understands"] == ["FORWARDWITH"]
    assert decode(frames) == hello
    older = Hello("b1", "fam", BrokerState.ACTIVE, 3, {}, TableMode.PULL)
    assert "understands" not in json.loads(older.to_frames()[3])
    decoded = decode(older.to_frames())
    assert isinstance(decoded, Hello) and decoded.understands == frozenset()
    # A name this version does not know is kept (and never acted on): a later broker's HELLO.
    later = json.loads(frames[3])
    later["understands"] = ["FORWARDWITH", "FORWARDLATER"]
    decoded = decode([*frames[:3], json.dumps(later).encode()])
    assert isinstance(decoded, Hello) and "FORWARDLATER" in decoded.understands


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("FORWARDWITH", "frame 3: option 'understands' must be an array"),
        (["X"] * 33, "frame 3: option 'understands' must be an array of at most 32"),
        (["forwardwith"], "frame 3: option 'understands[0]' is not a command name"),
        (["FORWARDWITH", 7], "frame 3: option 'understands[1]' is not a command name"),
        ([""], "frame 3: option 'understands[0]' is not a command name"),
    ],
)
def test_a_malformed_understands_is_refused(value: object, text: str) -> None:
    options = json.loads(
        Hello("b1", "fam", BrokerState.ACTIVE, 3, {}, TableMode.PULL).to_frames()[3]
    )
    options["understands"] = value
    frames = [b"", b"S0B1", b"HELLO", json.dumps(options).encode()]
    with pytest.raises(ProtocolError) as info:
        decode_to_broker(frames, max_frame_bytes=LIMIT, signatures={SIG_BROKER})
    assert info.value.code == 400 and str(info.value).startswith(text), str(info.value)
