"""heartbeat_items: the C reader (scale0.net._zmqio) and the Python one (scale0.wire.hot) give
the same items for the same batch, and both agree with heartbeat_fields message by message.

The broker uses the C one with the C batch calls and the Python one on the fallback
(``SCALE0_PURE=1``, or no extension): whichever runs, the core is handed the same HEARTBEATs
(docs/performance.md, "Liveness"). Hypothesis plays near-valid options frames at both.
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
from scale0.wire.client import Heartbeat

LIMIT = 1024
RID = b"\x00k\x8bEg"
C_BUILT = importlib.util.find_spec("scale0.net._zmqio") is not None


def _c_items() -> Any:
    if not C_BUILT:
        pytest.skip("the C extension was not built here (no C compiler at install)")
    from scale0.net import _zmqio

    _zmqio.setup(zmq.ZMQError)
    assert hasattr(_zmqio, "heartbeat_items"), "the extension was built from an older source"
    return _zmqio.heartbeat_items


def beat(options: bytes, signature: bytes = b"S0C1") -> list[bytes]:
    return [RID, b"", signature, b"HEARTBEAT", options]


EXAMPLES = [
    b'{"time":1764127000.25,"config_version":3}',
    b'{"time":0.5,"config_version":0}',
    b' {"time":0.5,"config_version":0}',  # whitespace before "{": not the plain form
    b'{ "time" : 0.5 ,\n\t"config_version" :\r7 } \n',
    b'{"time":1.5e3,"config_version":3}',
    b'{"time":1.5E-3,"config_version":3}',
    b'{"time":1.5e+03,"config_version":3}',
    b'{"time":1.5e,"config_version":3}',
    b'{"time":1.5e+,"config_version":3}',
    b'{"time":1.0e999,"config_version":3}',  # not finite
    b'{"time":1.0e-999,"config_version":3}',  # 0.0
    b'{"time":5,"config_version":3}',
    b'{"time":05.5,"config_version":3}',
    b'{"time":0.,"config_version":3}',
    b'{"time":-1.5,"config_version":3}',
    b'{"time":1.5,"config_version":03}',
    b'{"time":1.5,"config_version":123456789012345678}',  # 18 digits
    b'{"time":1.5,"config_version":1234567890123456789}',  # 19: not the plain form
    b'{"time":1.5,"config_version":-1}',
    b'{"config_version":3,"time":1.5}',
    b'{"time":1.5,"config_version":3,"hbeatinterval_ms":1000}',
    b'{"time":1.5,"config_version":3,"interval_ms":5000}',  # idle beating (§3.4)
    b'{"time":1.5,"config_version":3 , "interval_ms" :\n999999999 }\t',
    b'{"time":1.5,"config_version":3,"interval_ms":1000000000}',  # 10 digits: typed path
    b'{"time":1.5,"config_version":3,"interval_ms":0}',
    b'{"time":1.5,"config_version":3,"interval_ms":05}',
    b'{"time":1.5,"config_version":3,"interval_ms":-5}',
    b'{"time":1.5,"config_version":3,"interval_ms":5.0}',
    b'{"time":1.5,"config_version":3,"interval_ms":5000,}',
    b'{"time":1.5,"config_version":3,"interval_ms":}',
    b'{"time":1.5,"config_version":3,"interval_ms"}',
    b'{"time":1.5,"config_version":3,"interval":5000}',
    b'{"time":1.5,"config_version":3,}',
    b'{"time":1.5,"config_version":3}x',
    b'{"time":1.5,"config_version":3',
    b'{"time":1.5 "config_version":3}',
    b'{"time":' + b"1" * 400 + b'.5,"config_version":3}',  # long: a heap copy in C; inf
    b'{"time":0.' + b"1" * 400 + b',"config_version":3}',  # long and finite
    b"",
    b"{}",
    b'{"time":1.5,"config_version":3}\x00',
    b'{"time":1.5,"config_version":3}' + b" " * LIMIT,  # past the frame limit
]


def test_the_c_and_python_readers_agree_on_every_example() -> None:
    c_items = _c_items()
    batch = [beat(options) for options in EXAMPLES]
    batch += [beat(EXAMPLES[0], b"S0W1"), [*beat(EXAMPLES[0]), b""], beat(EXAMPLES[0])[:4]]
    batch += [[RID, b"x", b"S0C1", b"HEARTBEAT", EXAMPLES[0]], [RID, b"", b"S0C1", b"HEARTBEAt"]]
    batch += [[RID], [], [RID, b"", b"S0C1", b"REQUEST", b"echo", b"id", b"body"]]
    python = hot.heartbeat_items(batch, b"S0C1", LIMIT)
    c = c_items(batch, b"S0C1", LIMIT)
    assert c == python
    assert [type(x) for x in c] == [type(x) for x in python]
    for frames, item in zip(batch, c, strict=True):
        fields = hot.heartbeat_fields(frames, b"S0C1", LIMIT)
        if fields is None:
            assert item is frames  # passed through, the very list
        else:
            assert item == (RID, *fields) and type(item[1]) is float and type(item[2]) is int
            assert type(item[3]) is int
    read = sum(1 for item in c if isinstance(item, tuple))
    assert read == 11, "the examples must exercise both outcomes"
    assert {item[3] for item in c if isinstance(item, tuple)} == {0, 5000, 999999999}


json_ws = st.sampled_from([b"", b" ", b"\t", b"\n", b"\r", b"  ", b"x"])
number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).encode()),
    st.from_regex(rb"\A-?[0-9]{0,3}\.?[0-9]{0,3}([eE][-+]?[0-9]{0,4})?\Z", fullmatch=True),
    st.integers(-10, 10**20).map(lambda n: b"%d" % n),
)


@st.composite
def options(draw: st.DrawFn) -> bytes:
    w = [draw(json_ws) for _ in range(13)]
    key1, key2 = draw(st.sampled_from([(b'"time"', b'"config_version"')] * 4 + [(b'"t"', b"x")]))
    text = b"{" + w[0] + key1 + w[1] + b":" + w[2] + draw(number) + w[3] + b"," + w[4] + key2 + w[5]
    text += b":" + w[6] + draw(number) + w[7]
    key3 = draw(st.sampled_from([None, None, b'"interval_ms"', b'"interval_ms"', b'"i"']))
    if key3 is not None:  # idle beating's promise (§3.4)
        text += b"," + w[8] + key3 + w[9] + b":" + w[10] + draw(number) + w[11]
    text += b"}" + w[12]
    if draw(st.booleans()):  # one byte changed
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1 :]
    return text


@settings(max_examples=500, deadline=None)
@given(st.lists(options(), min_size=1, max_size=6), st.sampled_from([b"S0C1", b"S0W1"]))
def test_the_c_and_python_readers_agree_on_near_valid_heartbeats(
    texts: list[bytes], signature: bytes
) -> None:
    c_items = _c_items()
    batch = [beat(text, signature) for text in texts]
    c = c_items(batch, signature, LIMIT)
    assert c == hot.heartbeat_items(batch, signature, LIMIT)
    assert [type(x) for x in c] == [type(x) for x in hot.heartbeat_items(batch, signature, LIMIT)]


@given(
    st.floats(min_value=0, allow_infinity=False),
    st.integers(0, 10**18 - 1),
    st.none() | st.integers(1, 2**31 - 1),
)
def test_what_the_broker_and_clients_write_is_read_the_same_by_both(
    time: float, version: int, promise: int | None
) -> None:
    c_items = _c_items()
    frames = [RID, *Heartbeat(time, version, interval_ms=promise, protocol=b"S0W1").to_frames()]
    c = c_items([frames], b"S0W1", LIMIT)
    assert c == hot.heartbeat_items([frames], b"S0W1", LIMIT)


def test_the_broker_reads_with_the_c_reader_exactly_when_it_uses_the_c_batch_calls() -> None:
    chosen = frames_io._heartbeat_items
    if frames_io.IMPLEMENTATION == "c":
        assert chosen is _c_items()
    else:
        assert chosen is hot.heartbeat_items
