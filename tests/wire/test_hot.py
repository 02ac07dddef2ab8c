"""The hot-path readers agree with the typed decoders, and decline rather than guess."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.wire import ClientRequest, ProtocolError, WorkerReply
from scale0.wire.hot import client_request_fields, worker_reply_fields
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
