"""The hot-path readers agree with the typed decoders, and decline rather than guess."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.wire import ClientRequest, ProtocolError, WorkerReply
from scale0.wire.client import Heartbeat
from scale0.wire.frames import control_frames
from scale0.wire.hot import (
    client_request_fields,
    heartbeat_fields,
    mdp_client_request_fields,
    mdp_worker_reply_fields,
    worker_reply_fields,
)
from scale0.wire.mdp import MdpClientRequest, MdpWorkerReply
from scale0.wire.registry import BACKEND_SIGNATURES, FRONTEND_SIGNATURES, decode_to_broker

LIMIT = 1024
RID = b"\x00k\x8bEg"

# Near-valid frames: the plain form, with any frame swapped for something odd.
odd_frame = st.one_of(
    st.sampled_from(
        [b"", b"S0C1", b"S0W1", b"REQUEST", b"REPLY", b"200", b"099", b"600", b"2x0", b"echo"]
    ),
    st.sampled_from([b"mmi.service", b"bad\x00name", b"\xff\xfe", b"x" * 256, b"x" * (LIMIT + 1)]),
    st.binary(max_size=12),
)


@st.composite
def near(draw: st.DrawFn, template: list[bytes]) -> list[bytes]:
    frames = list(template) + draw(st.lists(st.binary(max_size=8), max_size=3))
    for _ in range(draw(st.integers(0, 2))):
        frames[draw(st.integers(1, len(frames) - 1))] = draw(odd_frame)
    if draw(st.booleans()):
        frames = frames[: draw(st.integers(1, len(frames)))]
    return frames


REQUEST = [RID, b"", b"S0C1", b"REQUEST", b"echo", b"id-1", b"body"]
REPLY = [RID, b"", b"S0W1", b"REPLY", b"ticket-1", b"200", b"body"]


def typed(frames: list[bytes], signatures: frozenset[bytes]) -> object:
    try:
        return decode_to_broker(frames[1:], max_frame_bytes=LIMIT, signatures=signatures)
    except ProtocolError as error:
        return error


@settings(max_examples=400)
@given(near(REQUEST))
def test_request_reader_returns_what_the_decoder_reads_or_declines(frames: list[bytes]) -> None:
    fields = client_request_fields(frames, LIMIT)  # first: it must not need the decoder's help
    message = typed(frames, FRONTEND_SIGNATURES)
    if fields is not None:
        assert isinstance(message, ClientRequest)
        assert fields == (message.service, message.request_id, message.body)


@settings(max_examples=400)
@given(near(REPLY))
def test_reply_reader_returns_what_the_decoder_reads_or_declines(frames: list[bytes]) -> None:
    message = typed(frames, BACKEND_SIGNATURES)
    fields = worker_reply_fields(frames, LIMIT)
    if fields is not None:
        assert isinstance(message, WorkerReply)
        assert fields == (message.ticket, message.status, message.body)


def test_plain_messages_take_the_fast_way() -> None:
    assert client_request_fields(REQUEST, LIMIT) == ("echo", b"id-1", (b"body",))
    assert client_request_fields([*REQUEST[:6]], LIMIT) == ("echo", b"id-1", ())
    assert worker_reply_fields(REPLY, LIMIT) == (b"ticket-1", 200, (b"body",))
    assert worker_reply_fields([*REPLY, b"more"], LIMIT) == (b"ticket-1", 200, (b"body", b"more"))


def test_a_service_name_never_decoded_before_takes_the_fast_way_too() -> None:
    unseen = [*REQUEST[:4], b"never-seen-service", *REQUEST[5:]]
    assert client_request_fields(unseen, LIMIT) == ("never-seen-service", b"id-1", (b"body",))


def test_anything_unusual_is_left_to_the_typed_decoder() -> None:
    for name in (b"bad\x00name", b"\xff\xfe", b"x" * 256, b""):
        bad = [*REQUEST[:4], name, *REQUEST[5:]]
        assert client_request_fields(bad, LIMIT) is None, name
        assert isinstance(typed(bad, FRONTEND_SIGNATURES), ProtocolError), name
    assert client_request_fields([*REQUEST[:5], b"", b"body"], LIMIT) is None  # empty request_id
    assert client_request_fields([*REQUEST[:6], b"x" * (LIMIT + 1)], LIMIT) is None
    assert client_request_fields([RID, b"", b"S0W1", *REQUEST[3:]], LIMIT) is None
    assert worker_reply_fields([*REPLY[:5], b"099"], LIMIT) is None
    assert worker_reply_fields([*REPLY[:5], b"20"], LIMIT) is None
    assert worker_reply_fields([RID, b"x", *REPLY[2:]], LIMIT) is None
    assert worker_reply_fields(REPLY[:5], LIMIT) is None


# --- HEARTBEAT ---------------------------------------------------------------------------------

BEAT = [RID, b"", b"S0C1", b"HEARTBEAT", b'{"time":1764127000.25,"config_version":3}']
WORKER_BEAT = [RID, b"", b"S0W1", b"HEARTBEAT", b'{"time": 0.5, "config_version": 0}']

# Options frames near the plain form: numbers at and past the limits, other keys, odd spacing.
number = st.one_of(
    st.sampled_from(
        [b"0", b"1", b"0.0", b"1.5", b"-1.5", b"01.5", b"1.", b".5", b"1e5", b"1.0e999", b"1.5E-3"]
    ),
    st.sampled_from(
        [
            b"0",
            b"3",
            b"1764127000.25",
            b"9" * 18,
            b"9" * 19,
            b"9223372036854775807",
            b"true",
            b"null",
            b'"1"',
        ]
    ),
    st.floats(allow_nan=True).map(lambda f: repr(f).encode()),
    st.integers(-(2**64), 2**64).map(lambda i: b"%d" % i),
)
# Mostly none (each options frame has eight places for it), sometimes JSON's, sometimes not.
space = st.sampled_from([b""] * 40 + [b" ", b"\t\n", b"\r", b"\x0b", b"\xa0"])


@st.composite
def beat_options(draw: st.DrawFn) -> bytes:
    keys = draw(
        st.sampled_from(
            [
                *[(b"time", b"config_version")] * 4,
                (b"config_version", b"time"),
                (b"time", b"time"),
                (b"time", b"config_version", b"hbeatinterval_ms"),
                *[(b"time", b"config_version", b"interval_ms")] * 3,
                (b"time", b"interval_ms", b"config_version"),
                (b"time", b"config_version", b"interval_ms", b"interval_ms"),
                (b"time",),
                (b"tim\\u0065", b"config_version"),
            ]
        )
    )
    fitting = {
        b"time": st.floats(0, 2e9).map(lambda f: repr(f).encode()),
        b"config_version": st.integers(0, 2**63 - 1).map(lambda i: b"%d" % i),
        b"interval_ms": st.integers(0, 2**32).map(lambda i: b"%d" % i),
    }
    parts = [
        b'%s"%s"%s:%s%s%s'
        % (
            draw(space),
            key,
            draw(space),
            draw(space),
            draw(st.one_of(fitting.get(key, number), number)),
            draw(space),
        )
        for key in keys
    ]
    return draw(space) + b"{" + b",".join(parts) + b"}" + draw(space)


@st.composite
def near_beat(draw: st.DrawFn) -> list[bytes]:
    frames = [*BEAT[:4], draw(beat_options())]
    if draw(st.booleans()):
        frames[2] = b"S0W1"
    if draw(st.integers(0, 4)) == 0:
        frames = draw(near(frames))
    return frames


@settings(max_examples=1000)
@given(near_beat(), st.sampled_from([b"S0C1", b"S0W1"]))
def test_heartbeat_reader_returns_what_the_decoder_reads_or_declines(
    frames: list[bytes], signature: bytes
) -> None:
    fields = heartbeat_fields(frames, signature, LIMIT)
    accept = FRONTEND_SIGNATURES if signature == b"S0C1" else BACKEND_SIGNATURES
    message = typed(frames, accept)
    if fields is not None:
        assert isinstance(message, Heartbeat) and message.protocol == signature
        assert message.hbeatinterval_ms is None
        assert fields == (message.time, message.config_version, message.interval_ms or 0)
        assert type(fields[0]) is float and type(fields[1]) is int and type(fields[2]) is int


def test_plain_heartbeats_take_the_fast_way() -> None:
    assert heartbeat_fields(BEAT, b"S0C1", LIMIT) == (1764127000.25, 3, 0)
    assert heartbeat_fields(WORKER_BEAT, b"S0W1", LIMIT) == (0.5, 0, 0)
    # What the broker's own encoder and a Python client's json.dumps write:
    ours = [RID, *Heartbeat(1764127000.123456, 7, protocol=b"S0C1").to_frames()]
    assert heartbeat_fields(ours, b"S0C1", LIMIT) == (1764127000.123456, 7, 0)
    # An idle client's or worker's promise (§3.4):
    idle = [RID, *Heartbeat(1764127000.5, 7, interval_ms=5000, protocol=b"S0W1").to_frames()]
    assert heartbeat_fields(idle, b"S0W1", LIMIT) == (1764127000.5, 7, 5000)
    spaced = [*BEAT[:4], b'{"time":1.5 , "config_version":3 ,\n"interval_ms" : 999999999 }']
    assert heartbeat_fields(spaced, b"S0C1", LIMIT) == (1.5, 3, 999999999)


def test_unusual_heartbeats_are_left_to_the_typed_decoder() -> None:
    assert heartbeat_fields(BEAT, b"S0W1", LIMIT) is None  # another channel's signature
    assert heartbeat_fields([*BEAT, b""], b"S0C1", LIMIT) is None  # a frame too many: 400
    assert heartbeat_fields(BEAT[:4], b"S0C1", LIMIT) is None  # options missing: 400
    for options in (
        b"",  # empty options: 400 (time missing)
        b'{"time":1.0e999,"config_version":3}',  # not finite: 400
        b'{"time":5,"config_version":3}',  # an integer time: valid, the typed path reads it
        b'{"config_version":3,"time":1.5}',  # another order: valid, typed path
        b'{"time":1.5,"config_version":3,"hbeatinterval_ms":1000}',  # the broker's own form
        b'{"time":1.5,"config_version":3,"interval_ms":0}',  # below 1: 400
        b'{"time":1.5,"config_version":3,"interval_ms":05000}',  # not JSON: 400
        b'{"time":1.5,"config_version":3,"interval_ms":1000000000}',  # 10 digits: typed path
        b'{"time":1.5,"config_version":3,"interval_ms":5000.0}',  # not an int: 400
        b'{"time":1.5,"config_version":3,"interval_ms":"5000"}',  # not an int: 400
        b'{"time":1.5,"interval_ms":5000,"config_version":3}',  # another order: typed path
        b'{"time":1.5,"config_version":9223372036854775808}',  # past int64: 400
        b'{"time":-1.5,"config_version":3}',  # negative: 400
        b'{"time":1.5,"config_version":3}' + b" " * LIMIT,  # too long: 400
    ):
        assert heartbeat_fields([*BEAT[:4], options], b"S0C1", LIMIT) is None, options


@given(
    st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 2**53),
    st.integers(0, 2**63 - 1),
    st.none() | st.integers(1, 2**31 - 1),
    st.none() | st.integers(1, 2**31 - 1),
    st.sampled_from([b"S0C1", b"S0W1"]),
)
def test_heartbeat_frames_are_the_bytes_of_the_options_encoder(
    sent: float, version: int, interval: int | None, promise: int | None, protocol: bytes
) -> None:
    beat = Heartbeat(sent, version, interval, promise, protocol=protocol)
    expected = control_frames(
        protocol,
        b"HEARTBEAT",
        {
            "time": sent,
            "config_version": version,
            "hbeatinterval_ms": interval,
            "interval_ms": promise,
        },
    )
    assert beat.to_frames() == expected


# --- Majordomo REQUEST and final reply (§10) ----------------------------------------------------

MDP_REQUESTS = [
    [RID, b"", b"MDPC01", b"echo", b"body"],
    [RID, b"", b"MDPC02", b"\x01", b"echo", b"body"],
    [RID, b"", b"MDPC02", b"\x02", b"echo", b"body"],  # majortomo's numbering
]
MDP_REPLIES = [
    [RID, b"", b"MDPW01", b"\x03", b"ticket-1", b"", b"body"],
    [RID, b"", b"MDPW02", b"\x04", b"ticket-1", b"", b"body"],
]
odd_mdp = st.sampled_from(
    [b"", b"\x01", b"\x02", b"\x03", b"\x04", b"\x05", b"MDPC01", b"MDPC02", b"MDPW01", b"MDPW02"]
)


@st.composite
def near_mdp(draw: st.DrawFn, templates: list[list[bytes]]) -> list[bytes]:
    frames = list(draw(st.sampled_from(templates)))
    frames += draw(st.lists(st.binary(max_size=4), max_size=2))
    for _ in range(draw(st.integers(0, 2))):
        frames[draw(st.integers(1, len(frames) - 1))] = draw(st.one_of(odd_mdp, odd_frame))
    if draw(st.booleans()):
        frames = frames[: draw(st.integers(1, len(frames)))]
    return frames


@settings(max_examples=600)
@given(near_mdp(MDP_REQUESTS))
def test_mdp_request_reader_returns_what_the_decoder_reads_or_declines(
    frames: list[bytes],
) -> None:
    fields = mdp_client_request_fields(frames, LIMIT)
    message = typed(frames, FRONTEND_SIGNATURES)
    if fields is not None:
        assert isinstance(message, MdpClientRequest)
        reading = (message.protocol, message.delimited, message.majortomo)
        assert fields == (reading, message.service, message.body)


@settings(max_examples=600)
@given(near_mdp(MDP_REPLIES))
def test_mdp_reply_reader_returns_what_the_decoder_reads_or_declines(frames: list[bytes]) -> None:
    fields = mdp_worker_reply_fields(frames, LIMIT)
    message = typed(frames, BACKEND_SIGNATURES)
    if fields is not None:
        assert isinstance(message, MdpWorkerReply)
        assert fields == (message.ticket, message.body)


def test_plain_mdp_messages_take_the_fast_way() -> None:
    readings = [(b"MDPC01", True, False), (b"MDPC02", True, False), (b"MDPC02", True, True)]
    for frames, reading in zip(MDP_REQUESTS, readings, strict=True):
        assert mdp_client_request_fields(frames, LIMIT) == (reading, "echo", (b"body",))
    for frames in MDP_REPLIES:
        assert mdp_worker_reply_fields(frames, LIMIT) == (b"ticket-1", (b"body",))
    assert mdp_worker_reply_fields(MDP_REPLIES[0][:6], LIMIT) == (b"ticket-1", ())


def test_unusual_mdp_messages_are_left_to_the_typed_decoder() -> None:
    assert mdp_client_request_fields([RID, b"MDPC02", b"\x01", b"echo"], LIMIT) is None  # 18/MDP
    assert mdp_client_request_fields([RID, b"", b"MDPC02", b"\x03", b"echo"], LIMIT) is None
    assert mdp_client_request_fields([RID, b"", b"MDPC02", b"\x01"], LIMIT) is None  # no service
    assert mdp_client_request_fields([RID, b"", b"MDPC01", b"bad\x00name"], LIMIT) is None
    assert mdp_worker_reply_fields([RID, b"", b"MDPW02", b"\x03", b"t", b"", b"b"], LIMIT) is None
    assert mdp_worker_reply_fields([RID, b"", b"MDPW01", b"\x04", b"t", b"", b"b"], LIMIT) is None
    assert mdp_worker_reply_fields([RID, b"", b"MDPW01", b"\x03", b"", b"", b"b"], LIMIT) is None
    assert mdp_worker_reply_fields([RID, b"", b"MDPW01", b"\x03", b"t", b"x", b"b"], LIMIT) is None
    big = [*MDP_REPLIES[1][:6], b"x" * (LIMIT + 1)]
    assert mdp_worker_reply_fields(big, LIMIT) is None
