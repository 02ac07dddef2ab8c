"""scale0.net.frames_io: the C batch calls and the pyzmq fallback behave the same, on real sockets.

Each test runs against both implementations. ``pip install -e .`` builds the C one; on a machine
without a C compiler it is not built, its cases are skipped (saying so), and the fallback's run:
``test_the_extension_runs_when_built_and_the_fallback_is_reported_when_not`` checks that the
broker uses the extension wherever it was built, and the fallback only where it was not
(``tools/test-fallback`` runs the suite that way).
"""

from __future__ import annotations

import array
import errno
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zmq.utils import z85

from scale0.net import frames_io

WAIT_S = 5.0
CHILD_TIMEOUT_S = 120


@dataclass(frozen=True)
class Impl:
    name: str
    io_key: Callable[[zmq.Socket[Any]], Any]
    recv_batch: Callable[[Any, int], list[list[bytes]]]
    send_batch: Callable[[list[tuple[Any, bytes, list[Any]]]], tuple[int, list[int]]]


C_BUILT = importlib.util.find_spec("scale0.net._zmqio") is not None
"""Whether the install built the extension (it does not without a C compiler)."""


def _c_impl() -> Impl:
    if not C_BUILT:
        pytest.skip("the C extension was not built here (no C compiler at install)")
    try:
        from scale0.net import _zmqio
    except ImportError as exc:
        pytest.fail(f"the C extension scale0.net._zmqio was built but does not load: {exc}")
    _zmqio.setup(zmq.ZMQError)
    return Impl("c", frames_io._c_io_key, _zmqio.recv_batch, _zmqio.send_batch)


PY = Impl(
    "pyzmq",
    frames_io._py_io_key,
    frames_io._py_recv_batch,
    frames_io._py_send_batch,  # type: ignore[arg-type]
)


@pytest.fixture(params=["c", "pyzmq"])
def impl(request: pytest.FixtureRequest) -> Impl:
    return _c_impl() if request.param == "c" else PY


@dataclass
class Pair:
    """A bound ROUTER (the broker's side) and a DEALER with a known routing id."""

    router: zmq.Socket[bytes]
    dealer: zmq.Socket[bytes]
    dealer_id: bytes


@pytest.fixture
def pair() -> Iterator[Pair]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind("tcp://127.0.0.1:*")
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.setsockopt(zmq.IDENTITY, b"d1")
    dealer.connect(router.getsockopt(zmq.LAST_ENDPOINT).decode())  # type: ignore[union-attr]
    try:
        # The ROUTER knows the DEALER's id only once it has heard from it.
        dealer.send(b"hello")
        assert router.poll(int(WAIT_S * 1000)), "the DEALER did not connect"
        assert router.recv_multipart() == [b"d1", b"hello"]
        yield Pair(router, dealer, b"d1")
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def _collect(
    impl: Impl, sock: zmq.Socket[bytes], count: int, limit: int = 1000
) -> list[list[bytes]]:
    """Batches until ``count`` messages arrived (bounded wait), using only recv_batch."""
    got: list[list[bytes]] = []
    deadline = time.monotonic() + WAIT_S
    key = impl.io_key(sock)
    while len(got) < count and time.monotonic() < deadline:
        batch = impl.recv_batch(key, limit)
        assert len(batch) <= limit
        got.extend(batch)
        if not batch:
            sock.poll(50)
    return got


def test_the_extension_runs_when_built_and_the_fallback_is_reported_when_not() -> None:
    forced = os.environ.get("SCALE0_PURE") == "1"
    expected = "c" if C_BUILT and not forced else "pyzmq"
    assert expected == frames_io.IMPLEMENTATION, (
        f"built: {C_BUILT}, SCALE0_PURE=1: {forced}; a built extension that does not load "
        "makes the broker fall back silently to the slow path"
    )
    # What the broker reports in broker_ready ("io") is this value; SCALE0_PURE=1 forces it.
    reported = subprocess.run(
        [sys.executable, "-c", "from scale0.net import frames_io; print(frames_io.IMPLEMENTATION)"],
        env={**os.environ, "SCALE0_PURE": "1"},
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=True,
    )
    assert reported.stdout.strip() == "pyzmq"


def test_nothing_waiting_is_an_empty_batch(impl: Impl, pair: Pair) -> None:
    assert impl.recv_batch(impl.io_key(pair.router), 10) == []


def test_whole_messages_in_order_and_at_most_limit_per_batch(impl: Impl) -> None:
    # inproc: a send puts the message in the peer's pipe before it returns, so all 25 are
    # waiting when the first batch is read, and the limit (not an empty socket) ends it.
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://limit")
        dealer.setsockopt(zmq.IDENTITY, b"d1")
        dealer.connect("inproc://limit")
        sent = [[b"", b"S0C1", b"REQUEST", b"echo", b"%d" % i, b"x" * i] for i in range(25)]
        for message in sent:
            dealer.send_multipart(message)
        key = impl.io_key(router)
        first = impl.recv_batch(key, 10)
        assert len(first) == 10
        second = impl.recv_batch(key, 10)
        assert len(second) == 10
        rest = impl.recv_batch(key, 10)
        assert [m[1:] for m in first + second + rest] == sent
        assert all(m[0] == b"d1" for m in first + second + rest)
        assert impl.recv_batch(key, 10) == []
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def test_large_and_empty_frames_arrive_intact(impl: Impl, pair: Pair) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB, every byte value
    pair.dealer.send_multipart([b"", big, b"", b"end"])
    (message,) = _collect(impl, pair.router, 1)
    assert message == [pair.dealer_id, b"", big, b"", b"end"]


def test_send_batch_sends_in_order_and_reports_each_failure(impl: Impl, pair: Pair) -> None:
    key = impl.io_key(pair.router)
    sent, failed = impl.send_batch(
        [
            (key, pair.dealer_id, [b"", b"one"]),
            (key, b"nobody", [b"", b"lost"]),  # ROUTER_MANDATORY: EHOSTUNREACH
            (key, pair.dealer_id, [memoryview(b"two"), bytearray(b"2")]),
            (key, pair.dealer_id, []),  # a message that is only the routing id: nothing arrives
        ]
    )
    assert (sent, failed) == (3, [errno.EHOSTUNREACH])
    got = [pair.dealer.recv_multipart() for _ in range(2) if pair.dealer.poll(int(WAIT_S * 1000))]
    assert got == [[b"", b"one"], [b"two", b"2"]]


def test_a_frame_that_is_not_bytes_raises_type_error(impl: Impl, pair: Pair) -> None:
    key = impl.io_key(pair.router)
    with pytest.raises(TypeError):
        impl.send_batch([(key, pair.dealer_id, [b"", 7])])


def _next_message(sock: zmq.Socket[bytes]) -> list[bytes]:
    assert sock.poll(int(WAIT_S * 1000)), "nothing arrived"
    return sock.recv_multipart()


# A bad frame at each place a batch can hold one: the (message, frame) it is at, frame 0 being
# the first frame (the routing id on a ROUTER).
BAD_PLACES = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (2, 3)]


@pytest.mark.parametrize(("message", "frame"), BAD_PLACES)
@pytest.mark.parametrize(
    "bad",
    [7, "text", None, memoryview(b"abcdef")[::2]],
    ids=["int", "str", "None", "strided-memoryview"],
)
def test_a_bad_frame_refuses_the_whole_batch_and_the_next_message_arrives_whole(
    impl: Impl, pair: Pair, message: int, frame: int, bad: object
) -> None:
    """Nothing of a batch with a bad frame is sent, so no peer gets a spliced message.

    Before the fix, the frames before the bad one went out with SNDMORE, and the next message
    sent on the socket was glued onto them: the receiver read ``[b"", b"m0", b"d1", ...]``.
    """
    key = impl.io_key(pair.router)
    batch: list[tuple[Any, Any, list[Any]]] = [
        (key, pair.dealer_id, [b"", b"m%d" % i, b"end"]) for i in range(3)
    ]
    frames = [batch[message][1], *batch[message][2]]
    frames[frame] = bad
    batch[message] = (key, frames[0], frames[1:])
    with pytest.raises(TypeError) as refused:
        impl.send_batch(batch)
    assert impl.send_batch([(key, pair.dealer_id, [b"", b"next"])]) == (1, [])
    assert _next_message(pair.dealer) == [b"", b"next"]
    assert re.fullmatch(
        rf"send_batch: message {message}, frame {frame}: \w+ is not a contiguous "
        r"bytes-like object; nothing in this batch was sent",
        str(refused.value),
    )


@pytest.mark.parametrize("frame", [0, 1, 2])
def test_a_bad_frame_on_a_dealer_leaves_no_half_message_either(
    impl: Impl, pair: Pair, frame: int
) -> None:
    """A peer link is a DEALER (no routing id): the ROUTER behind it must not get a splice."""
    key = impl.io_key(pair.dealer)
    frames: list[Any] = [b"S0P1", b"HELLO", b"x"]
    frames[frame] = 7
    with pytest.raises(TypeError) as refused:
        impl.send_batch([(key, b"S0P1", [b"PING"]), (key, frames[0], frames[1:])])
    assert impl.send_batch([(key, b"S0P1", [b"NEXT"])]) == (1, [])
    assert _next_message(pair.router) == [pair.dealer_id, b"S0P1", b"NEXT"]
    assert f"message 1, frame {frame}: int " in str(refused.value)


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ((b"first",), "message 1 is not a (socket"),
        ("not a tuple", "message 1 is not a (socket"),
        (("not a socket", b"id", []), "message 1: the socket"),
        ((None, b"id", []), "message 1: the socket"),
        (("key", b"id", 7), "message 1: its other frames are not a sequence"),
    ],
)
def test_a_bad_item_refuses_the_whole_batch(
    impl: Impl, pair: Pair, item: tuple[Any, ...], says: str
) -> None:
    key = impl.io_key(pair.router)
    if item and item[0] == "key":
        item = (key, *item[1:])
    good = (key, pair.dealer_id, [b"", b"first"])
    with pytest.raises(TypeError) as refused:
        impl.send_batch([good, item, good])  # type: ignore[list-item]
    assert impl.send_batch([(key, pair.dealer_id, [b"", b"next"])]) == (1, [])
    assert _next_message(pair.dealer) == [b"", b"next"]
    assert says in str(refused.value)
    assert str(refused.value).endswith("nothing in this batch was sent")


@pytest.mark.parametrize("frames", [bytearray(b"ab"), memoryview(b"ab"), array.array("B", b"ab")])
def test_bytes_like_frames_are_sent_as_their_bytes(impl: Impl, pair: Pair, frames: Any) -> None:
    key = impl.io_key(pair.router)
    assert impl.send_batch([(key, bytearray(pair.dealer_id), [frames, b"end"])]) == (1, [])
    assert _next_message(pair.dealer) == [b"ab", b"end"]


def test_full_pipe_is_eagain_not_a_block(impl: Impl, pair: Pair) -> None:
    """A DEALER whose peer is not there yet: its send HWM fills and sends fail with EAGAIN."""
    ctx = zmq.Context.instance()
    lonely = ctx.socket(zmq.DEALER)
    lonely.linger = 0
    lonely.sndhwm = 5
    lonely.connect("tcp://127.0.0.1:9")  # discard port: nobody accepts
    try:
        key = impl.io_key(lonely)
        sent, failed = impl.send_batch([(key, b"frame", [b"%d" % i]) for i in range(20)])
        assert sent + len(failed) == 20
        assert failed and set(failed) == {errno.EAGAIN}
    finally:
        lonely.close(0)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    messages=st.lists(
        st.lists(st.binary(max_size=300), min_size=1, max_size=8), min_size=1, max_size=20
    ),
    limit=st.integers(min_value=1, max_value=7),
)
def test_both_implementations_read_the_same_messages(
    pair: Pair, messages: list[list[bytes]], limit: int
) -> None:
    for impl in (_c_impl(), PY) if C_BUILT else (PY,):
        for message in messages:
            pair.dealer.send_multipart(message)
        got = _collect(impl, pair.router, len(messages), limit)
        assert [m[1:] for m in got] == messages, impl.name
        key = impl.io_key(pair.router)
        sent, failed = impl.send_batch([(key, m[0], m[1:]) for m in got])
        assert (sent, failed) == (len(got), [])
        echoed = []
        for _ in messages:
            assert pair.dealer.poll(int(WAIT_S * 1000))
            echoed.append(pair.dealer.recv_multipart())
        assert echoed == messages, impl.name


# ---- in a child process: signals, and code that frees what a batch still uses ----------------


def _child(*args: str) -> Any:
    """Run ``tests.net.frames_io_child`` with ``args``; its JSON answer (it must exit 0).

    A child of its own because these tests arm SIGALRM (pytest-timeout's too) or, before the
    fix, crashed the interpreter; PYTHONMALLOC=debug fills freed memory so a use after free
    shows every time.
    """
    env = {**os.environ, "PYTHONMALLOC": "debug"} if args[0] == "freed" else None
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "tests.net.frames_io_child", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"child exited {result.returncode}: {result.stderr[-3000:]}"
    return json.loads(result.stdout)


def test_interrupted_sends_and_receives_are_retried_not_reported(impl: Impl) -> None:
    """EINTR is retried: no message fails with it, no receive raises it, nothing is lost.

    The child sends and receives while SIGALRM fires every 20 µs (see the child). Before the
    fix the C path reported EINTR as a failed message or raised it, within a few hundred calls.
    """
    if impl.name == "c":
        _c_impl()  # fails here, clearly, if the extension was built but does not load
    answer = _child("storm", impl.name)
    assert answer["signals"] > answer["calls"] // 10, "the storm did not happen"
    assert answer["send_results"] == [[1, []], [2, []]]
    assert answer["to_dealer"] == "in order, none missing"
    assert answer["to_router"] == "in order, none missing"


def test_a_signal_handler_that_raises_never_leaves_half_a_message(impl: Impl) -> None:
    """Ctrl-C mid-receive may cost messages, never split one: no tail comes out on its own.

    The child receives while SIGALRM's handler raises every third time (see the child). pyzmq
    runs handlers after each frame; before the fix the fallback then dropped the frames read so
    far and the next call returned the rest as a message (``["17", "17", "17"]``).
    """
    if impl.name == "c":
        _c_impl()
    answer = _child("raising", impl.name)
    assert answer["raised"] > 0, "the handler never raised inside a receive"
    assert answer["not_whole"] == []
    assert answer["in_order_once"]


@pytest.mark.parametrize(
    "how",
    [
        "iterator",
        pytest.param(
            "buffer",
            marks=pytest.mark.skipif(
                sys.version_info < (3, 12), reason="a __buffer__ in Python needs 3.12"
            ),
        ),
    ],
)
def test_a_batch_holds_its_frames_while_python_code_frees_the_callers(impl: Impl, how: str) -> None:
    """The caller's items and frames are freed, by code the batch itself runs, mid-batch.

    The code empties the caller's list of items, the only reference to the messages and their
    frames: the iteration of the first message's other frames, or (3.12+) a frame's
    ``__buffer__``. The batch must still send both messages, whole, as they were when
    send_batch was called. Before the fix the C path read freed memory (a crash, or garbage
    sent) and the fallback sent only the first message.
    """
    if impl.name == "c":
        _c_impl()
    answer = _child("freed", impl.name, how)
    assert answer["result"] == [2, []]
    assert answer["received"] == [["", "zero", "0" * 1000], ["", "one", "1" * 1000]]


def _batch_fds(impl: Impl) -> Callable[[], list[int]]:
    if impl.name == "c":
        from scale0.net import _zmqio

        return _zmqio.batch_fds
    return frames_io._py_batch_fds


def test_batch_fds_names_each_message_s_connection(impl: Impl) -> None:
    """R20, §8: each message of a batch, the fd of the connection it came over (its
    getpeername is the sender's address), in order; reset by the next batch."""
    import socket

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind("tcp://127.0.0.1:*")
    frontend = router.getsockopt(zmq.LAST_ENDPOINT).decode()  # type: ignore[union-attr]
    frames_io._py_tracked.add(router)  # what track_connections does on the fallback
    dealers = []
    try:
        for source in ("127.0.0.2", "127.0.0.3"):
            dealer = ctx.socket(zmq.DEALER)
            dealer.linger = 0
            dealer.connect(f"tcp://{source}:0;" + frontend.removeprefix("tcp://"))
            dealers.append(dealer)
        for n, dealer in enumerate(dealers * 2):
            dealer.send(b"%d" % n)
            time.sleep(0.05)  # arrival order = send order, across connections
        batch = _collect(impl, router, 4)
        fds = _batch_fds(impl)()
        assert [m[1] for m in batch] == [b"0", b"1", b"2", b"3"]
        assert len(fds) == len(batch) and fds[0] == fds[2] and fds[1] == fds[3] != fds[0]
        addresses = []
        for fd in fds[:2]:
            sock = socket.socket(fileno=fd)
            try:
                addresses.append(sock.getpeername()[0])
            finally:
                sock.detach()
        assert addresses == ["127.0.0.2", "127.0.0.3"]
        assert impl.recv_batch(impl.io_key(router), 10) == []
        assert _batch_fds(impl)() == []
    finally:
        for dealer in dealers:
            dealer.close(0)
        router.close(0)
        ctx.term()


# ---- recv_batch_keyed: each message's sender's CURVE key (User-Id), on real CURVE sockets --------


def _keyed(impl: Impl) -> Callable[[Any, int], tuple[list[list[bytes]], list[str]]]:
    if impl.name == "c":
        from scale0.net import _zmqio

        return _zmqio.recv_batch_keyed
    return frames_io._py_recv_batch_keyed


class _Zap:
    """A ZAP handler (RFC 27) in a thread that admits every CURVE client and gives each the
    ``User-Id`` ``user_ids`` names for its public key (Z85), raw bytes: a real one, garbage
    that is not UTF-8, ... (pyzmq's authenticator always gives the key itself, so these cases
    need a handler of the test's own). Answers until stopped; every wait is bounded."""

    def __init__(self, ctx: zmq.Context[Any], user_ids: dict[bytes, bytes]) -> None:
        import threading

        self._sock = ctx.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind("inproc://zeromq.zap.01")
        self._user_ids = user_ids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="zap", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(20):
                continue
            version, request_id, _domain, _address, _identity, mechanism, *creds = (
                self._sock.recv_multipart()
            )
            user_id = b""
            if mechanism == b"CURVE" and creds:
                user_id = self._user_ids.get(z85.encode(creds[0]), b"")
            self._sock.send_multipart([version, request_id, b"200", b"OK", user_id, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the ZAP thread did not stop"
        self._sock.close(0)


def _curve_router(ctx: zmq.Context[Any], server: tuple[bytes, bytes]) -> zmq.Socket[Any]:
    router: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.curve_server = True
    router.curve_publickey, router.curve_secretkey = server
    router.bind("tcp://127.0.0.1:*")
    return router


def _curve_dealer(
    ctx: zmq.Context[Any],
    endpoint: str,
    server_public: bytes,
    name: bytes,
    pair: tuple[bytes, bytes] | None = None,
) -> tuple[zmq.Socket[Any], str]:
    public, secret = pair if pair is not None else zmq.curve_keypair()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.setsockopt(zmq.IDENTITY, name)
    dealer.curve_serverkey = server_public
    dealer.curve_publickey, dealer.curve_secretkey = public, secret
    dealer.connect(endpoint)
    return dealer, public.decode("ascii")


def _collect_keyed(
    impl: Impl, sock: zmq.Socket[Any], count: int, limit: int = 1000
) -> tuple[list[list[bytes]], list[str], list[int]]:
    """Keyed batches until ``count`` messages arrived (bounded wait), with their fds."""
    read = _keyed(impl)
    got: list[list[bytes]] = []
    keys: list[str] = []
    fds: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        batch, batch_keys = read(impl.io_key(sock), limit)
        assert len(batch) == len(batch_keys) <= limit
        got.extend(batch)
        keys.extend(batch_keys)
        fds.extend(_batch_fds(impl)())
        if not batch:
            sock.poll(50)
    return got, keys, fds


def test_recv_batch_keyed_gives_each_message_its_sender_s_key(impl: Impl) -> None:
    """Each message, whole and in order, with the User-Id ZAP gave its connection: the key
    itself; "" for one that is not UTF-8 (pyzmq raises reading it) or empty; a UTF-8 User-Id
    that is no key passes as it is (the core's grants judge it). Garbage never splits a
    message, and batch_fds names each message's connection as after recv_batch."""
    if impl.name == "c":
        _c_impl()
    ctx: zmq.Context[Any] = zmq.Context()
    server = zmq.curve_keypair()
    names = (b"good", b"garbage", b"empty", b"text")
    zap: _Zap | None = None
    router = _curve_router(ctx, server)
    frames_io._py_tracked.add(router)  # what track_connections does on the fallback
    dealers: dict[bytes, tuple[zmq.Socket[Any], str]] = {}
    try:
        endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        pairs = {name: zmq.curve_keypair() for name in names}
        user_ids = {
            pairs[b"good"][0]: pairs[b"good"][0],
            pairs[b"garbage"][0]: b"\xff\xfe\x80 not UTF-8",
            pairs[b"empty"][0]: b"",
            pairs[b"text"][0]: "not a key é".encode(),
        }
        zap = _Zap(ctx, user_ids)  # bound before any handshake: else libzmq asks no one
        for name in names:
            dealers[name] = _curve_dealer(ctx, endpoint, server[0], name, pairs[name])
        sent = []
        for n in range(12):
            name = names[n % len(names)]
            message = [b"", b"S0C1", b"REQUEST", b"%d" % n, b"x" * n]
            dealers[name][0].send_multipart(message)
            sent.append([name, *message])
        got, keys, fds = _collect_keyed(impl, router, len(sent), limit=5)
        assert sorted(map(repr, got)) == sorted(map(repr, sent))  # whole, none lost
        for name in names:  # in order per connection (connections interleave freely)
            assert [m for m in got if m[0] == name] == [m for m in sent if m[0] == name]
        expected = {b"good": dealers[b"good"][1], b"garbage": "", b"empty": "", b"text": ""}
        expected[b"text"] = "not a key é"
        assert keys == [expected[m[0]] for m in got]
        assert len(fds) == len(got) and all(fd >= 0 for fd in fds)
        by_name = {m[0]: fd for m, fd in zip(got, fds, strict=True)}
        assert len(set(by_name.values())) == len(names)  # one connection each
        assert _keyed(impl)(impl.io_key(router), 10) == ([], [])
        assert _batch_fds(impl)() == []
    finally:
        for dealer, _public in dealers.values():
            dealer.close(0)
        router.close(0)
        if zap is not None:
            zap.close()
        ctx.term()


def test_recv_batch_keyed_without_a_user_id_gives_an_empty_key(impl: Impl) -> None:
    """A CURVE server with no ZAP handler (libzmq then admits everyone and sets no User-Id)
    and a plain ROUTER: every message comes whole, its key "" (pyzmq raises reading the
    property; before, the fallback left the message's other frames on the socket)."""
    if impl.name == "c":
        _c_impl()
    ctx: zmq.Context[Any] = zmq.Context()
    server = zmq.curve_keypair()
    router = _curve_router(ctx, server)
    plain = ctx.socket(zmq.ROUTER)
    plain.linger = 0
    plain.bind("tcp://127.0.0.1:*")
    dealer: zmq.Socket[Any] | None = None
    other = ctx.socket(zmq.DEALER)
    other.linger = 0
    other.setsockopt(zmq.IDENTITY, b"plain")
    try:
        endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        dealer, _public = _curve_dealer(ctx, endpoint, server[0], b"nozap")
        other.connect(plain.getsockopt_string(zmq.LAST_ENDPOINT))
        for n in range(6):
            dealer.send_multipart([b"", b"%d" % n, b"tail"])
            other.send_multipart([b"", b"%d" % n, b"tail"])
        for sock, name in ((router, b"nozap"), (plain, b"plain")):
            got, keys, _fds = _collect_keyed(impl, sock, 6, limit=4)
            assert got == [[name, b"", b"%d" % n, b"tail"] for n in range(6)]
            assert keys == [""] * 6
            assert _keyed(impl)(impl.io_key(sock), 10) == ([], [])
    finally:
        if dealer is not None:
            dealer.close(0)
        other.close(0)
        plain.close(0)
        router.close(0)
        ctx.term()


def test_the_broker_picks_the_keyed_read_of_its_implementation() -> None:
    """frames_io.recv_batch_keyed is the C function wherever recv_batch is."""
    if frames_io.IMPLEMENTATION == "c":
        from scale0.net import _zmqio

        assert frames_io._recv_batch_keyed is _zmqio.recv_batch_keyed
    else:
        assert frames_io._recv_batch_keyed is frames_io._py_recv_batch_keyed
