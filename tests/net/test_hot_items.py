"""hot_items: the C reader (scale0.net._zmqio) and the Python one (scale0.wire.hot) give the
same items for the same batch, and both agree, message by message, with the readers the fast
path used one message at a time (client_request_fields, worker_reply_fields, heartbeat_fields).

The broker uses the C one with the C batch calls and the Python one on the fallback
(``SCALE0_PURE=1``, or no extension): whichever runs, the core is handed the same runs of
REQUESTs, REPLYs and HEARTBEATs (docs/performance.md, "Runs of REQUESTs and REPLYs in one
call"). Hypothesis plays near-valid messages at both.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.net import frames_io
from scale0.wire import hot
from scale0.wire.client import ClientRequest, Heartbeat
from scale0.wire.worker import WorkerReply

LIMIT = 1024
RID = b"\x00k\x8bEg"
C_BUILT = importlib.util.find_spec("scale0.net._zmqio") is not None
NAMES = {b"echo": "echo", b"a.b": "a.b", "é".encode(): "é"}
BEAT = b'{"time":1764127000.25,"config_version":3}'


def _c_items() -> Any:
    if not C_BUILT:
        pytest.skip("the C extension was not built here (no C compiler at install)")
    from scale0.net import _zmqio

    _zmqio.setup(zmq.ZMQError)
    assert hasattr(_zmqio, "hot_items"), "the extension was built from an older source"
    return _zmqio.hot_items


def _expected(frames: list[bytes], signature: bytes) -> Any:
    """What hot_items must make of ``frames``: the one-message readers' fields, with the
    routing id first, or the very list (a REQUEST whose service is not in NAMES too)."""
    if signature == b"S0C1":
        fields: Any = None
        if len(frames) > 4 and frames[4] in NAMES:
            fields = hot.client_request_fields(frames, LIMIT)
    else:
        fields = hot.worker_reply_fields(frames, LIMIT)
    if fields is None:
        fields = hot.heartbeat_fields(frames, signature, LIMIT)
    return frames if fields is None else (frames[0], *fields)


def _check(batch: list[list[bytes]], signature: bytes) -> list[Any]:
    """The Python reader against the one-message readers, and the C one (where it is built:
    on the fallback the Python reader is the one the broker runs) against the Python one."""
    python = hot.hot_items(batch, signature, LIMIT, dict(NAMES))
    for frames, item in zip(batch, python, strict=True):
        expected = _expected(frames, signature)
        assert item == expected
        if expected is frames:
            assert item is frames  # passed through, the very list
        else:
            assert [type(x) for x in item] == [type(x) for x in expected]
    if C_BUILT:
        c = _c_items()(batch, signature, LIMIT, dict(NAMES))
        assert c == python
        assert [type(x) for x in c] == [type(x) for x in python]
        assert all((a is b) == (a is f) for a, b, f in zip(c, python, batch, strict=True))
    return python


def request(*rest: bytes) -> list[bytes]:
    return [RID, b"", b"S0C1", b"REQUEST", *rest]


def reply(*rest: bytes) -> list[bytes]:
    return [RID, b"", b"S0W1", b"REPLY", *rest]


REQUESTS = [
    request(b"echo", b"1", b"body"),
    request(b"echo", b"1"),  # no body
    request(b"echo", b"1", b"", b"two", b"three"),
    request(b"a.b", b"x" * 255, b"b"),
    "é".encode() and request("é".encode(), b"id"),
    request(b"echo", b"x" * 256, b"b"),  # request_id too long
    request(b"echo", b"", b"b"),  # request_id empty
    request(b"other", b"1", b"b"),  # valid name, not checked yet: passed through
    request(b"bad name", b"1"),
    request(b"", b"1"),
    request(b"echo"),  # too short
    request(b"echo", b"1", b"x" * (LIMIT + 1)),  # a frame past the limit
    request(b"echo", b"1", b"x" * LIMIT),
    [RID, b"x", b"S0C1", b"REQUEST", b"echo", b"1"],  # frame 1 not empty
    [RID, b"", b"S0W1", b"REQUEST", b"echo", b"1"],  # the other signature
    [RID, b"", b"S0C1", b"REQUESt", b"echo", b"1"],
    [RID, b"", b"MDPC02", b"\x02", b"echo", b"body"],
    [RID, b"", b"S0C1", b"HEARTBEAT", BEAT],
    [RID, b"", b"S0C1", b"HEARTBEAT", BEAT, b""],
    [RID, b"", b"S0C1", b"CHECKCONFIG", b"{}"],
    [RID],
    [],
]
REPLIES = [
    reply(b"ticket", b"200", b"answer"),
    reply(b"ticket", b"200"),
    reply(b"t" * 255, b"599", b"", b"b"),
    reply(b"t", b"100"),
    reply(b"t" * 256, b"200"),  # ticket too long
    reply(b"", b"200"),
    reply(b"t", b"099"),
    reply(b"t", b"600"),
    reply(b"t", b"20"),
    reply(b"t", b"2000"),
    reply(b"t", b"2x0"),
    reply(b"t", b" 20"),
    reply(b"t"),  # too short
    reply(b"t", b"200", b"x" * (LIMIT + 1)),
    [RID, b"x", b"S0W1", b"REPLY", b"t", b"200"],
    [RID, b"", b"S0C1", b"REPLY", b"t", b"200"],
    [RID, b"", b"S0W1", b"PARTIAL", b"t", b"b"],
    [RID, b"", b"S0W1", b"HEARTBEAT", BEAT],
    [RID, b"", b"MDPW02", b"\x04", b"t", b"", b"body"],
]


def _beats(items: list[Any]) -> int:
    """How many items are HEARTBEATs read (their time is a float, R23's promise last)."""
    return sum(1 for item in items if isinstance(item, tuple) and type(item[1]) is float)


def _reads(items: list[Any]) -> int:
    """How many items are REQUESTs or REPLYs read."""
    return sum(1 for item in items if isinstance(item, tuple) and type(item[1]) is not float)


def test_the_readers_agree_on_every_request_example() -> None:
    items = _check(REQUESTS, b"S0C1")
    assert _reads(items) == 6
    assert _beats(items) == 1


def test_the_readers_agree_on_every_reply_example() -> None:
    items = _check(REPLIES, b"S0W1")
    assert _reads(items) == 4
    assert _beats(items) == 1


def test_a_new_service_name_is_read_once_the_fast_path_has_checked_it() -> None:
    names = dict(NAMES)
    frames = request(b"fresh", b"1", b"b")
    assert hot.hot_items([frames], b"S0C1", LIMIT, names) == [frames]
    from scale0.wire.frames import CHECKED_NAMES

    assert hot.client_request_fields(frames, LIMIT) is not None  # checks and remembers it
    assert CHECKED_NAMES[b"fresh"] == "fresh"
    assert hot.hot_items([frames], b"S0C1", LIMIT, CHECKED_NAMES) == [(RID, "fresh", b"1", (b"b",))]


frame = st.one_of(
    st.sampled_from([b"", b"echo", b"a.b", b"other", b"x" * 255, b"x" * 256, b"200", b"599"]),
    st.sampled_from([b"099", b"600", b"20", b"5000", b"1a0", b"REQUEST", b"REPLY", b"\xff"]),
    st.binary(max_size=8),
    st.integers(LIMIT - 1, LIMIT + 1).map(lambda n: b"y" * n),
)


@st.composite
def near_valid(draw: st.DrawFn, signature: bytes) -> list[bytes]:
    command = b"REQUEST" if signature == b"S0C1" else b"REPLY"
    frames = [RID, b"", signature, command, *draw(st.lists(frame, min_size=0, max_size=5))]
    if draw(st.booleans()):  # one head frame changed
        at = draw(st.integers(1, 3))
        frames[at] = draw(st.sampled_from([b"x", b"S0C1", b"S0W1", b"HEARTBEAT", command, b""]))
    if draw(st.integers(0, 9)) == 0:
        frames = [RID, b"", signature, b"HEARTBEAT", BEAT]
    return frames


@settings(max_examples=500, deadline=None)
@given(st.data(), st.sampled_from([b"S0C1", b"S0W1"]))
def test_the_readers_agree_on_near_valid_messages(data: st.DataObject, signature: bytes) -> None:
    batch = data.draw(st.lists(near_valid(signature), min_size=1, max_size=6))
    _check(batch, signature)


@given(
    st.sampled_from(["echo", "a.b", "é"]),
    st.binary(min_size=1, max_size=255),
    st.integers(100, 599),
    st.lists(st.binary(max_size=20), max_size=3),
)
def test_what_clients_and_workers_write_is_read_the_same_by_both(
    service: str, some_id: bytes, status: int, body: list[bytes]
) -> None:
    sent = [RID, *ClientRequest(service, some_id, tuple(body)).to_frames()]
    assert _check([sent], b"S0C1") == [(RID, service, some_id, tuple(body))]
    answered = [RID, *WorkerReply(some_id, status, tuple(body)).to_frames()]
    assert _check([answered], b"S0W1") == [(RID, some_id, status, tuple(body))]
    beat = [RID, *Heartbeat(1.5, 3, protocol=b"S0W1").to_frames()]
    assert _check([beat], b"S0W1") == [(RID, 1.5, 3, 0)]
    idle = [RID, *Heartbeat(1.5, 3, interval_ms=5000, protocol=b"S0W1").to_frames()]
    assert _check([idle], b"S0W1") == [(RID, 1.5, 3, 5000)]


def test_the_broker_reads_with_the_c_reader_exactly_when_it_uses_the_c_batch_calls() -> None:
    chosen = frames_io._hot_items
    if frames_io.IMPLEMENTATION == "c":
        assert chosen is _c_items()
    else:
        assert chosen is hot.hot_items
