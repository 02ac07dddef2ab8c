"""scale0.net._zmqio.Lane: the C thread that owns the broker's ROUTERs (phase 3a of the C lane).

Real sockets on 127.0.0.1: DEALER peers, the two ROUTERs the lane owns, and the two inproc PAIR
pipes between the lane and Python. Absence is never waited for: a message the lane should take is
followed by a marker from the same peer, and the marker reaching the pipe (the lane keeps each
connection's order) shows the beat was read before it, so had it been passed it would be there.
Every wait is bounded (WAIT_S).

The extension is optional (setup.py): where it is not built these tests skip, saying so. The
build test compiles both sources afresh with -Werror. To check the C side for memory errors,
build the extension with AddressSanitizer and run this module on that build (pytest captures
fd 2, so ASan's report goes to its log_path; no log file means no report):

    inc=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    mkdir -p /tmp/asan-lane && gcc -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
      -shared -fPIC -I"$inc" -o /tmp/asan-lane/_zmqio.so scale0/net/_zmqio.c scale0/net/_lane.c \
      -ldl -lpthread
    SCALE0_ZMQIO_SO=/tmp/asan-lane/_zmqio.so \
      ASAN_OPTIONS=detect_leaks=0:log_path=/tmp/asan-lane/log \
      LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
      .venv/bin/python -m pytest -p no:cacheprovider tests/net/test_lane.py
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import struct
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from hypothesis import given, settings
from hypothesis import strategies as st
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from scale0.wire import hot
from scale0.wire.client import Heartbeat
from scale0.wire.errors import ProtocolError
from scale0.wire.mdp import MDPW01, MDPW02, MdpWorkerHeartbeat
from scale0.wire.registry import BACKEND_SIGNATURES, decode_to_broker
from tests.extensions import load_extension

WAIT_S = 10.0
MAX_FRAME = 65536
SIG = (b"S0C1", b"S0W1")
FRONT, BACK = 0, 1
ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "scale0" / "net" / "_zmqio.c", ROOT / "scale0" / "net" / "_lane.c"]
NOT_BUILT = "scale0.net._zmqio was not built here (no C compiler at install; setup.py: optional)"

if os.environ.get("SCALE0_ZMQIO_SO"):  # a sanitizer build instead of the installed one
    load_extension("scale0.net._zmqio", os.environ["SCALE0_ZMQIO_SO"])

try:
    from scale0.net._zmqio import Lane
except ImportError:  # pragma: no cover - where the extension is not built
    Lane = None

pytestmark = pytest.mark.skipif(Lane is None, reason=NOT_BUILT)


def options(sent: float, version: int, interval: int | None = None) -> bytes:
    """A HEARTBEAT's options frame, as a peer writes it."""
    return Heartbeat(
        time=sent, config_version=version, interval_ms=interval, protocol=b""
    ).to_frames()[3]


def beat(channel: int, sent: float, version: int, interval: int | None = None) -> list[bytes]:
    """A HEARTBEAT from a DEALER (the ROUTER prepends the routing id)."""
    return [b"", SIG[channel], b"HEARTBEAT", options(sent, version, interval)]


def header(fd: int, key: bytes = b"") -> bytes:
    return struct.pack("<i", fd) + key


class Rig:
    """The two ROUTERs and two pipes of a lane, the lane started, and DEALER peers."""

    def __init__(
        self,
        *,
        keyed_front: bool = False,
        curve: tuple[bytes, bytes] | None = None,
        max_frame_bytes: int = MAX_FRAME,
        hwm: int | None = None,
        start: bool = True,
        authenticator: bool = True,
    ) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.auth: ThreadAuthenticator | None = None
        if curve is not None and authenticator:
            self.auth = ThreadAuthenticator(self.ctx)
            self.auth.start()
            self.auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        self.curve = curve
        self.public = b""  # the CURVE public key of the last DEALER made on a CURVE frontend
        self.routers: list[zmq.Socket[Any]] = []
        self.monitors: list[zmq.Socket[Any]] = []
        self.endpoints: list[str] = []
        for channel in (FRONT, BACK):
            router = self.ctx.socket(zmq.ROUTER)
            router.linger = 0
            if hwm is not None:
                router.rcvhwm = hwm
            if curve is not None and channel == FRONT:
                router.curve_server = True
                router.curve_publickey, router.curve_secretkey = curve
            self.monitors.append(router.get_monitor_socket(zmq.EVENT_ACCEPTED))
            router.bind("tcp://127.0.0.1:*")
            self.endpoints.append(router.getsockopt(zmq.LAST_ENDPOINT).decode())
            self.routers.append(router)
        self.pipes: list[zmq.Socket[Any]] = []  # Python's ends
        self.lane_pipes: list[zmq.Socket[Any]] = []
        for channel in (FRONT, BACK):
            ours = self.ctx.socket(zmq.PAIR)
            theirs = self.ctx.socket(zmq.PAIR)
            for sock in (ours, theirs):
                sock.linger = 0
                if hwm is not None:
                    sock.sndhwm = sock.rcvhwm = hwm
            endpoint = f"inproc://lane-{id(self)}-{channel}"
            ours.bind(endpoint)
            theirs.connect(endpoint)
            self.pipes.append(ours)
            self.lane_pipes.append(theirs)
        self.dealers: list[zmq.Socket[Any]] = []
        assert Lane is not None
        self.lane = Lane(
            self.routers[0].underlying,
            self.routers[1].underlying,
            self.lane_pipes[0].underlying,
            self.lane_pipes[1].underlying,
            keyed_front,
            False,
            max_frame_bytes,
        )
        if start:
            self.lane.start()

    def dealer(
        self, channel: int, rid: bytes | None = None, pair: tuple[bytes, bytes] | None = None
    ) -> tuple[zmq.Socket[Any], int]:
        """A connected DEALER and the fd of its connection at the ROUTER (from the monitor)."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.linger = 0
        if rid is not None:
            dealer.setsockopt(zmq.ROUTING_ID, rid)
        if self.curve is not None and channel == FRONT:
            dealer.curve_serverkey = self.curve[0]
            self.public, secret = pair or zmq.curve_keypair()
            dealer.curve_publickey, dealer.curve_secretkey = self.public, secret
        dealer.connect(self.endpoints[channel])
        self.dealers.append(dealer)
        monitor = self.monitors[channel]
        assert monitor.poll(WAIT_S * 1000), "no connection accepted"
        event = recv_monitor_message(monitor)
        assert event["event"] == zmq.EVENT_ACCEPTED
        return dealer, int(event["value"])

    def from_pipe(self, channel: int) -> list[bytes]:
        assert self.pipes[channel].poll(WAIT_S * 1000), "nothing reached the pipe"
        return self.pipes[channel].recv_multipart()

    def until_marker(self, channel: int, marker: bytes) -> list[list[bytes]]:
        """Messages from the pipe up to and including the one whose last frame is ``marker``."""
        got: list[list[bytes]] = []
        while True:
            message = self.from_pipe(channel)
            got.append(message)
            if message[-1] == marker:
                return got

    def close(self) -> None:
        if self.lane is not None:
            while True:  # a failed test may leave the lock held: stop() would refuse
                try:
                    self.lane.unlock()
                except RuntimeError:
                    break
        self.lane.stop()
        for sock in [*self.dealers, *self.pipes, *self.lane_pipes, *self.routers, *self.monitors]:
            sock.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def recv(sock: zmq.Socket[Any]) -> list[bytes]:
    assert sock.poll(WAIT_S * 1000), "nothing arrived"
    return sock.recv_multipart()


# ---- build --------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc here to build with -Werror")
def test_the_sources_build_with_werror(tmp_path: Path) -> None:
    include = sysconfig.get_paths()["include"]
    out = tmp_path / "_zmqio.so"
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", f"-I{include}"]
    subprocess.run(
        ["gcc", *flags, "-o", str(out), *map(str, SOURCES), "-ldl", "-lpthread"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert out.stat().st_size > 0


# ---- pass-through, start and stop ---------------------------------------------------------------


def test_messages_pass_both_ways_with_their_header_in_order(rig: Rig) -> None:
    for channel in (FRONT, BACK):
        dealer, fd = rig.dealer(channel, b"peer%d" % channel)
        sent = [[b"", SIG[channel], b"READY", b"%d" % n] for n in range(5)]
        sent.insert(2, [b"x" * 70000, b""])  # big and empty frames, as they are
        for frames in sent:
            dealer.send_multipart(frames)
        for frames in sent:
            assert rig.from_pipe(channel) == [header(fd), b"peer%d" % channel, *frames]
        rig.pipes[channel].send_multipart([b"peer%d" % channel, b"", SIG[channel], b"REPLY"])
        assert recv(dealer) == [b"", SIG[channel], b"REPLY"]
    rig.lane.stop()  # (joined: its counters are final)
    stats = rig.lane.stats()
    assert stats["received"] == stats["passed"] == 12
    assert stats["sent"] == 2 and stats["beats"] == 0 and stats["answers"] == 0


def test_the_header_names_each_connection_s_fd(rig: Rig) -> None:
    peers = [rig.dealer(FRONT, name) for name in (b"a", b"b")]
    assert peers[0][1] != peers[1][1]
    for name, (dealer, fd) in zip((b"a", b"b"), peers, strict=True):
        dealer.send(b"hi " + name)
        assert rig.from_pipe(FRONT) == [header(fd), name, b"hi " + name]


def test_a_keyed_channel_s_header_carries_the_sender_s_curve_key() -> None:
    server = zmq.curve_keypair()
    rig = Rig(keyed_front=True, curve=server)
    try:
        dealer, fd = rig.dealer(FRONT, b"curvy")
        public = rig.public
        dealer.send_multipart([b"", b"S0C1", b"HELLO"])
        assert rig.from_pipe(FRONT) == [header(fd, public), b"curvy", b"", b"S0C1", b"HELLO"]
        plain, bfd = rig.dealer(BACK, b"w")  # the backend is not keyed: no key in its header
        plain.send(b"x")
        assert rig.from_pipe(BACK) == [header(bfd), b"w", b"x"]
    finally:
        rig.close()


def test_a_key_that_is_not_utf8_is_empty_as_recv_batch_keyed_gives_it() -> None:
    """User-Ids from a ZAP handler of the test's own: UTF-8 ones as they are, others ""."""
    from tests.net.test_frames_io import _Zap

    server = zmq.curve_keypair()
    rig = Rig(keyed_front=True, curve=server, authenticator=False)
    pairs = [zmq.curve_keypair() for _ in range(4)]
    user_ids = [b"caf\xc3\xa9 \xf0\x9f\x99\x82", b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf"]
    zap = _Zap(rig.ctx, {public: uid for (public, _s), uid in zip(pairs, user_ids, strict=True)})
    try:
        for n, (pair, uid) in enumerate(zip(pairs, user_ids, strict=True)):
            dealer, fd = rig.dealer(FRONT, b"d%d" % n, pair)
            dealer.send(b"hi")
            key = uid if n == 0 else b""
            assert rig.from_pipe(FRONT) == [header(fd, key), b"d%d" % n, b"hi"]
    finally:
        rig.lane.stop()
        zap.close()
        rig.close()


def test_stop_forwards_python_s_pending_sends() -> None:
    rig = Rig()
    try:
        dealer, _fd = rig.dealer(FRONT, b"c")
        dealer.send(b"hello")  # the ROUTER knows the peer once its first message is read
        rig.from_pipe(FRONT)
        for n in range(300):
            rig.pipes[FRONT].send_multipart([b"c", b"", b"S0C1", b"DISCONNECT", b"%d" % n])
        rig.lane.stop()
        got = [recv(dealer)[-1] for _ in range(300)]
        assert got == [b"%d" % n for n in range(300)]
        assert rig.lane.stats()["sent"] == 300
    finally:
        rig.close()


def test_stop_is_idempotent_and_wakes_a_thread_blocked_in_poll() -> None:
    rig = Rig()
    try:
        rig.lane.stop()
        rig.lane.stop()
        with pytest.raises(RuntimeError, match="stopped"):
            rig.lane.start()
        # the ROUTERs are Python's again
        dealer, _fd = rig.dealer(FRONT, b"p")
        dealer.send(b"after")
        assert rig.routers[FRONT].poll(WAIT_S * 1000)
        assert rig.routers[FRONT].recv_multipart() == [b"p", b"after"]
    finally:
        rig.close()


def test_stop_from_two_threads_during_a_flood() -> None:
    """Both stop() calls return once the thread is joined; the flood's messages not yet read stay
    on the ROUTER, Python's again."""
    import threading

    rig = Rig()
    try:
        dealer, _fd = rig.dealer(BACK, b"flood")
        for n in range(2000):
            dealer.send(b"%d" % n)
        rig.from_pipe(BACK)
        stoppers = [threading.Thread(target=rig.lane.stop) for _ in range(2)]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(WAIT_S)
            assert not thread.is_alive(), "stop() did not return"
        passed = rig.lane.stats()["passed"]
        rest: list[bytes] = []
        while rig.routers[BACK].poll(WAIT_S * 1000 if len(rest) + passed < 2000 else 0):
            rest.append(rig.routers[BACK].recv_multipart()[1])
        # what the lane passed, then what Python reads itself: all of it, in order
        got = [rig.from_pipe(BACK)[2] for _ in range(passed - 1)]
        assert [b"0", *got, *rest] == [b"%d" % n for n in range(2000)]
    finally:
        rig.close()


def test_stop_without_start_and_start_twice() -> None:
    rig = Rig(start=False)
    try:
        rig.lane.start()
        with pytest.raises(RuntimeError, match="already started"):
            rig.lane.start()
    finally:
        rig.close()
    idle = Rig(start=False)
    idle.close()  # stop() of a lane never started


def test_bad_arguments_are_named() -> None:
    assert Lane is not None
    with pytest.raises(TypeError, match="frontend"):
        Lane("nope", 1, 1, 1, False, False, 10)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        Lane(1, 1, 1, 1, False, False, -1)
    rig = Rig(start=False)
    try:
        with pytest.raises(ValueError, match="channel"):
            rig.lane.note(2, b"x", 0, 0.0, 0.0)
        with pytest.raises(ValueError, match="gap_s"):
            rig.lane.note(0, b"x", 0, -1.0, 0.0)
        with pytest.raises(ValueError, match="fd"):
            rig.lane.negotiated(0, -1)
        with pytest.raises(ValueError, match="max_skew_s"):
            rig.lane.configure(1, math.nan)
    finally:
        rig.close()


def test_a_full_pipe_stalls_the_router_and_loses_nothing() -> None:
    rig = Rig(hwm=4)
    try:
        dealer, fd = rig.dealer(BACK, b"w")
        count = 400
        for n in range(count):
            dealer.send(b"%d" % n)
        deadline = time.monotonic() + WAIT_S
        while rig.lane.stats()["stalled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rig.lane.stats()["stalled"] > 0
        got = [rig.from_pipe(BACK) for _ in range(count)]
        assert got == [[header(fd), b"w", b"%d" % n] for n in range(count)]
        rig.lane.stop()  # (joined: its counters are final)
        stats = rig.lane.stats()
        assert stats["passed"] == stats["received"] == count and stats["lost"] == 0
    finally:
        rig.close()


def test_stopped_while_stalled_what_the_pipe_cannot_take_is_counted_lost() -> None:
    rig = Rig(hwm=4)
    try:
        dealer, _fd = rig.dealer(BACK, b"w")
        for n in range(400):
            dealer.send(b"%d" % n)
        deadline = time.monotonic() + WAIT_S
        while rig.lane.stats()["stalled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        rig.lane.stop()
        stats = rig.lane.stats()
        assert stats["lost"] > 0
        assert stats["received"] == stats["beats"] + stats["passed"] + stats["lost"]
        got = []
        while rig.pipes[BACK].poll(0):
            got.append(rig.pipes[BACK].recv_multipart()[2])
        assert got == [b"%d" % n for n in range(stats["passed"])]
    finally:
        rig.close()


def test_nothing_crashes_the_lane(rig: Rig) -> None:
    """Huge frames, a routing id of 255 bytes, many frames, a peer gone mid-flow, odd notes."""
    rig.lane.configure(1, 30.0)
    rig.lane.note(FRONT, b"", 0, 0.0, 0.0)  # a 0-byte routing id in the table
    rig.lane.note(FRONT, b"r" * 255, 0, 0.0, 0.0)
    long_rid, fd = rig.dealer(FRONT, b"r" * 255)
    long_rid.send_multipart([b"y" * 3_000_000])
    long_rid.send_multipart([b"f"] * 300)
    long_rid.send_multipart([b"", b"S0C1", b"HEARTBEAT", b"{" * 100_000])
    long_rid.send_multipart([b"", b"S0C1", b"HEARTBEAT", b'{"time":1e999,"config_version":1}'])
    assert rig.from_pipe(FRONT) == [header(fd), b"r" * 255, b"y" * 3_000_000]
    assert rig.from_pipe(FRONT) == [header(fd), b"r" * 255, *[b"f"] * 300]
    assert len(rig.from_pipe(FRONT)) == 6
    assert len(rig.from_pipe(FRONT)) == 6
    gone, _fd = rig.dealer(FRONT, b"gone")
    for n in range(200):
        gone.send(b"%d" % n)
    gone.close(0)
    rig.dealers.remove(gone)
    rig.pipes[FRONT].send_multipart([b"gone", b"to nobody"])  # dropped by the ROUTER, not a crash
    rig.pipes[FRONT].send_multipart([b"r" * 255, b"still here"])
    assert recv(long_rid) == [b"still here"]
    long_rid.send(b"marker")
    rig.until_marker(FRONT, b"marker")


# ---- the session table and the take rule --------------------------------------------------------


def test_the_table_s_own_calls(rig: Rig) -> None:
    lane = rig.lane
    assert lane.last_seen(FRONT, b"a") is None
    lane.note(FRONT, b"a", 0, 0.0, 5.0)
    lane.note(FRONT, b"a", 0, 0.0, 3.0)  # last_seen only rises
    assert lane.last_seen(FRONT, b"a") == 5.0
    assert lane.last_seen(BACK, b"a") is None  # channels are apart
    lane.forget(FRONT, b"a")
    lane.forget(FRONT, b"a")
    assert lane.last_seen(FRONT, b"a") is None
    for n in range(1000):
        lane.note(BACK, b"w%d" % n, 0, 0.0, float(n))
    assert lane.last_seen(BACK, b"w999") == 999.0
    lane.clear()
    assert lane.last_seen(BACK, b"w999") is None
    assert lane.heard() == []


class Beating:
    """A rig with one configured session per channel, beating over a negotiated connection."""

    def __init__(self, rig: Rig, channel: int, promise: int = 0, gap: float = 0.0) -> None:
        self.rig = rig
        self.channel = channel
        self.rid = b"peer-%d" % channel
        rig.lane.configure(7, 30.0)
        self.dealer, self.fd = rig.dealer(channel, self.rid)
        rig.lane.negotiated(channel, self.fd)
        rig.lane.note(channel, self.rid, promise, gap, time.monotonic())
        self.markers = itertools.count()

    def send(self, frames: list[bytes]) -> list[list[bytes]]:
        """Send ``frames`` then a marker: what reached the pipe, the marker's message dropped."""
        marker = b"marker-%d" % next(self.markers)
        self.dealer.send_multipart(frames)
        self.dealer.send(marker)
        got = self.rig.until_marker(self.channel, marker)
        assert got[-1] == [header(self.fd), self.rid, marker]
        return got[:-1]

    def taken(self, frames: list[bytes]) -> None:
        before = time.monotonic()
        assert self.send(frames) == []
        heard = self.rig.lane.heard()
        assert [(c, r) for c, r, _seen in heard] == [(self.channel, self.rid)]
        assert before <= heard[0][2] <= time.monotonic()

    def passed(self, frames: list[bytes]) -> None:
        assert self.send(frames) == [[header(self.fd), self.rid, *frames]]
        assert self.rig.lane.heard() == []


def test_a_frontend_beat_is_taken_and_answered(rig: Rig) -> None:
    peer = Beating(rig, FRONT)
    before = time.time()
    peer.taken(beat(FRONT, time.time(), 7))
    answer = recv(peer.dealer)
    decoded = Heartbeat.from_frames(answer)
    assert before <= decoded.time <= time.time()
    assert decoded.config_version == 7 and decoded.interval_ms is None
    # exactly the bytes the Python broker writes for that answer (time as repr writes it)
    assert answer == Heartbeat(time=decoded.time, config_version=7, protocol=b"S0C1").to_frames()
    rig.lane.stop()  # (joined: its counters are final)
    stats = rig.lane.stats()
    assert stats["beats"] == 1 and stats["answers"] == 1


def test_an_idle_beat_s_answer_carries_its_promise(rig: Rig) -> None:
    peer = Beating(rig, FRONT, promise=5000)
    peer.taken(beat(FRONT, time.time(), 9, 5000))  # a newer config_version is taken too
    answer = recv(peer.dealer)
    decoded = Heartbeat.from_frames(answer)
    assert (decoded.config_version, decoded.interval_ms) == (7, 5000)
    assert (
        answer
        == Heartbeat(
            time=decoded.time, config_version=7, interval_ms=5000, protocol=b"S0C1"
        ).to_frames()
    )


def test_a_backend_beat_is_taken_without_an_answer(rig: Rig) -> None:
    peer = Beating(rig, BACK, gap=math.inf)
    peer.taken(beat(BACK, time.time(), 7))
    peer.dealer.send(b"last")
    rig.until_marker(BACK, b"last")
    assert not peer.dealer.poll(0)  # (the marker's round trip came after any answer would)
    assert rig.lane.stats()["answers"] == 0


def test_without_a_session_it_is_passed(rig: Rig) -> None:
    peer = Beating(rig, FRONT)
    rig.lane.forget(FRONT, peer.rid)
    peer.passed(beat(FRONT, time.time(), 7))


def test_before_configure_nothing_is_taken() -> None:
    rig = Rig()
    try:
        dealer, fd = rig.dealer(FRONT, b"early")
        rig.lane.negotiated(FRONT, fd)
        rig.lane.note(FRONT, b"early", 0, 0.0, 0.0)
        frames = beat(FRONT, time.time(), 0)
        dealer.send_multipart(frames)
        assert rig.from_pipe(FRONT) == [header(fd), b"early", *frames]
        assert rig.lane.heard() == []
    finally:
        rig.close()


def test_an_unnegotiated_connection_s_beat_is_passed(rig: Rig) -> None:
    peer = Beating(rig, FRONT)
    rig.lane.gone(FRONT, peer.fd)
    peer.passed(beat(FRONT, time.time(), 7))
    rig.lane.negotiated(FRONT, peer.fd)
    peer.taken(beat(FRONT, time.time(), 7))


def test_a_skewed_clock_s_beat_is_passed(rig: Rig) -> None:
    peer = Beating(rig, FRONT)
    peer.passed(beat(FRONT, time.time() + 1000.0, 7))
    peer.passed(beat(FRONT, time.time() - 1000.0, 7))
    peer.taken(beat(FRONT, time.time() + 1.0, 7))


def test_an_older_config_version_s_beat_is_passed(rig: Rig) -> None:
    peer = Beating(rig, FRONT)
    peer.passed(beat(FRONT, time.time(), 6))
    peer.taken(beat(FRONT, time.time(), 7))


def test_a_changed_promise_is_passed(rig: Rig) -> None:
    peer = Beating(rig, FRONT, promise=0)
    peer.passed(beat(FRONT, time.time(), 7, 5000))
    rig.lane.note(FRONT, peer.rid, 5000, 0.0, 0.0)
    peer.passed(beat(FRONT, time.time(), 7))
    peer.taken(beat(FRONT, time.time(), 7, 5000))


def test_a_backend_beat_after_a_gap_is_passed(rig: Rig) -> None:
    peer = Beating(rig, BACK, gap=60.0)
    rig.lane.forget(BACK, peer.rid)
    rig.lane.note(BACK, peer.rid, 0, 60.0, time.monotonic() - 120.0)  # silent for 2 minutes
    peer.passed(beat(BACK, time.time(), 7))
    # the beat (and its marker) raised last_seen: the next one is within the gap
    peer.taken(beat(BACK, time.time(), 7))
    rig.lane.note(BACK, peer.rid, 0, 0.0, 0.0)  # gap_s 0: no check
    peer.taken(beat(BACK, time.time(), 7))


def test_only_the_exact_heartbeat_shape_is_taken() -> None:
    def timed(digits: int) -> list[bytes]:
        return [
            b"",
            b"S0C1",
            b"HEARTBEAT",
            b'{"time":%.*f,"config_version":7}' % (digits, time.time()),
        ]

    rig = Rig(max_frame_bytes=len(timed(5)[3]))
    try:
        peer = Beating(rig, FRONT)
        peer.passed(timed(6))  # options over max_frame_bytes
        peer.taken(timed(5))  # at it
        peer.passed([b"", b"S0W1", b"HEARTBEAT", b'{"time":1.5,"config_version":7}'])
        peer.passed([b"", b"S0C1", b"HEARTBEAT", b'{"time":1.5,"config_version":7}', b"x"])
        peer.passed([b"x", b"S0C1", b"HEARTBEAT", b"{}"])
        peer.passed([b"", b"S0C1", b"HEARTBEAT", b'{"config_version":7,"time":1.5}'])
    finally:
        rig.close()
    wide = Rig()
    try:
        peer = Beating(wide, BACK, gap=math.inf)
        peer.passed(beat(FRONT, time.time(), 7))  # the frontend's signature on the backend
        peer.taken(beat(BACK, time.time(), 7))
    finally:
        wide.close()


# ---- a Majordomo worker's HEARTBEAT --------------------------------------------------------------

#: Every form of a Majordomo worker HEARTBEAT the registry decodes (from a DEALER): 7/MDP's,
#: 18/MDP's with the empty frame 0 (majortomo's worker sends this one), and 18/MDP's own text's
#: without it. The core's only answer to one from a worker with a session is Sessions.seen.
MDP_BEATS = {
    "MDPW01": [b"", MDPW01, b"\x04"],
    "MDPW02": [b"", MDPW02, b"\x05"],
    "MDPW02-undelimited": [MDPW02, b"\x05"],
}
MDP_FORMS = pytest.mark.parametrize("form", list(MDP_BEATS))


def mdp_beat_decoded(frames: list[bytes], max_frame_bytes: int) -> bool:
    """Whether the backend's decoder reads ``frames`` as a Majordomo worker HEARTBEAT."""
    try:
        message = decode_to_broker(
            frames, max_frame_bytes=max_frame_bytes, signatures=BACKEND_SIGNATURES
        )
    except ProtocolError:
        return False
    return isinstance(message, MdpWorkerHeartbeat)


def test_the_mdp_forms_are_the_registry_s_worker_heartbeats_and_near_misses_are_not() -> None:
    for frames in MDP_BEATS.values():
        assert mdp_beat_decoded(frames, 6)
        assert not mdp_beat_decoded(frames, 5)  # MDPW0x is over the frame limit
    for protocol in (MDPW01, MDPW02):
        for delimited in (True, False):
            frames = MdpWorkerHeartbeat(protocol=protocol, delimited=delimited).to_frames()
            assert (frames in MDP_BEATS.values()) == (protocol == MDPW02 or delimited)
    for near in MDP_NEAR_MISSES:
        assert not mdp_beat_decoded(near, MAX_FRAME)


#: Not a Majordomo worker HEARTBEAT for the decoder (the test above says so): passed.
MDP_NEAR_MISSES = [
    [MDPW01, b"\x04"],  # 7/MDP has no undelimited reading
    [b"", MDPW01, b"\x05"],  # 7/MDP's DISCONNECT
    [b"", MDPW02, b"\x04"],  # 18/MDP's FINAL, empty
    [b"", MDPW02, b"\x05", b""],  # one frame too many
    [MDPW02, b"\x05", b""],
    [b"", b"", MDPW02, b"\x05"],
    [b"x", MDPW02, b"\x05"],
    [b"", b"MDPC02", b"\x05"],
    [b"", b"mdpw02", b"\x05"],
    [b"", MDPW02, b"\x05\x00"],
    [b"", MDPW02],
]


@MDP_FORMS
def test_a_majordomo_worker_s_beat_is_taken_without_an_answer(rig: Rig, form: str) -> None:
    frames = MDP_BEATS[form]
    peer = Beating(rig, BACK)
    peer.taken(frames)
    peer.taken(frames)
    peer.dealer.send(b"last")
    rig.until_marker(BACK, b"last")
    assert not peer.dealer.poll(0)  # (the marker's round trip came after any answer would)
    rig.lane.stop()  # (joined: its counters are final)
    stats = rig.lane.stats()
    assert stats["beats"] == 2 and stats["answers"] == 0


@MDP_FORMS
def test_a_majordomo_worker_s_beat_checks_no_clock_version_promise_or_gap(
    rig: Rig, form: str
) -> None:
    """Majordomo.worker_heartbeat makes none of these checks, so neither does the lane: a
    promise, an older configured version and a silence far past the gap change nothing."""
    peer = Beating(rig, BACK)
    rig.lane.configure(10**9, 0.0)
    rig.lane.forget(BACK, peer.rid)
    rig.lane.note(BACK, peer.rid, 5000, 60.0, time.monotonic() - 120.0)  # silent for 2 minutes
    peer.taken(MDP_BEATS[form])


@MDP_FORMS
def test_a_majordomo_worker_s_beat_without_a_session_is_passed(rig: Rig, form: str) -> None:
    peer = Beating(rig, BACK)
    rig.lane.forget(BACK, peer.rid)
    peer.passed(MDP_BEATS[form])
    rig.lane.note(BACK, peer.rid, 0, 0.0, 0.0)
    peer.taken(MDP_BEATS[form])


@MDP_FORMS
def test_a_majordomo_worker_s_beat_on_an_unnegotiated_connection_is_passed(
    rig: Rig, form: str
) -> None:
    peer = Beating(rig, BACK)
    rig.lane.gone(BACK, peer.fd)
    peer.passed(MDP_BEATS[form])
    rig.lane.negotiated(BACK, peer.fd)
    peer.taken(MDP_BEATS[form])


@MDP_FORMS
def test_a_majordomo_worker_s_beat_before_configure_is_passed(form: str) -> None:
    rig = Rig()
    try:
        dealer, fd = rig.dealer(BACK, b"early")
        rig.lane.negotiated(BACK, fd)
        rig.lane.note(BACK, b"early", 0, 0.0, 0.0)
        dealer.send_multipart(MDP_BEATS[form])
        assert rig.from_pipe(BACK) == [header(fd), b"early", *MDP_BEATS[form]]
        assert rig.lane.heard() == []
    finally:
        rig.close()


@MDP_FORMS
def test_a_majordomo_worker_s_beat_on_the_frontend_is_passed(rig: Rig, form: str) -> None:
    """Only the backend takes it (on the frontend the registry does not accept MDPW0x)."""
    peer = Beating(rig, FRONT)
    peer.passed(MDP_BEATS[form])
    peer.taken(beat(FRONT, time.time(), 7))


@MDP_FORMS
def test_a_majordomo_worker_s_beat_over_max_frame_bytes_is_passed(form: str) -> None:
    for limit, taken in ((5, False), (6, True)):
        rig = Rig(max_frame_bytes=limit)
        try:
            peer = Beating(rig, BACK)
            if taken:
                peer.taken(MDP_BEATS[form])
            else:
                peer.passed(MDP_BEATS[form])
        finally:
            rig.close()


@MDP_FORMS
def test_a_majordomo_worker_s_beat_waits_for_python_to_finish_its_earlier_messages(
    rig: Rig, form: str
) -> None:
    """Order, as for S0P beats: with done marks on, a beat behind a message still in Python's
    hands (a READY, say) goes to Python too; once marked done, the next is taken."""
    peer = Beating(rig, BACK)
    read = 0

    def from_pipe() -> list[bytes]:
        nonlocal read
        read += 1
        return rig.from_pipe(BACK)

    def mark() -> None:
        rig.pipes[BACK].send(struct.pack("<Q", read))

    frames = MDP_BEATS[form]
    mark()
    ready = [b"", MDPW02, b"\x01", b"echo"]
    peer.dealer.send_multipart(ready)
    peer.dealer.send_multipart(frames)
    assert from_pipe() == [header(peer.fd), peer.rid, *ready]
    assert from_pipe() == [header(peer.fd), peer.rid, *frames]  # the READY was still Python's
    assert rig.lane.heard() == []
    mark()
    peer.dealer.send_multipart(frames)
    peer.dealer.send(b"marker")
    assert from_pipe() == [header(peer.fd), peer.rid, b"marker"]  # the beat was taken
    assert [(c, r) for c, r, _s in rig.lane.heard()] == [(BACK, peer.rid)]


@pytest.mark.parametrize("channel", [FRONT, BACK])
def test_an_s0p_beat_from_a_session_that_speaks_majordomo_is_passed(rig: Rig, channel: int) -> None:
    """The core would note that it speaks S0P now: not the lane's to take. Its Majordomo
    beats (a worker's) are still taken."""
    peer = Beating(rig, channel)
    rig.lane.note(channel, peer.rid, 0, 0.0, 0.0, True)
    peer.passed(beat(channel, time.time(), 7))
    if channel == BACK:
        peer.taken(MDP_BEATS["MDPW02"])
    rig.lane.note(channel, peer.rid, 0, 0.0, 0.0, False)
    peer.taken(beat(channel, time.time(), 7))


def test_a_near_miss_of_a_majordomo_worker_s_beat_is_passed_intact(rig: Rig) -> None:
    peer = Beating(rig, BACK)
    for near in MDP_NEAR_MISSES:
        peer.passed(near)
    peer.taken(MDP_BEATS["MDPW02"])


def test_any_message_raises_last_seen_only_beats_reach_heard(rig: Rig) -> None:
    peer = Beating(rig, BACK)
    rig.lane.forget(BACK, peer.rid)
    rig.lane.note(BACK, peer.rid, 0, 0.0, 1.0)
    before = time.monotonic()
    peer.passed([b"", b"S0W1", b"REPLY", b"t", b"200"])
    seen = rig.lane.last_seen(BACK, peer.rid)
    assert seen is not None and before <= seen <= time.monotonic()
    rig.lane.note(BACK, peer.rid, 0, 0.0, seen + 1000.0)  # Python's later clock wins (max)
    peer.send([b"x"])
    assert rig.lane.last_seen(BACK, peer.rid) == seen + 1000.0


def test_with_done_marks_a_beat_waits_for_python_to_finish_its_peer_s_earlier_messages(
    rig: Rig,
) -> None:
    """Order: once Python marks how many messages it has read (and answered) from a pipe, a
    HEARTBEAT from a peer whose earlier message Python may still be handling goes to Python too,
    so the peer sees the answers in the order it sent; without marks the lane takes it."""
    peer = Beating(rig, FRONT)
    read = 0

    def from_pipe() -> list[bytes]:
        nonlocal read
        read += 1
        return rig.from_pipe(FRONT)

    def mark() -> None:
        rig.pipes[FRONT].send(struct.pack("<Q", read))

    mark()  # the order rule is on; Python has read nothing
    rid, fd = peer.rid, peer.fd
    later = beat(FRONT, time.time(), 7)
    peer.dealer.send(b"first")
    peer.dealer.send_multipart(later)
    assert from_pipe() == [header(fd), rid, b"first"]
    assert from_pipe() == [header(fd), rid, *later]  # "first" was still Python's
    mark()  # Python has answered both
    peer.dealer.send_multipart(later)
    peer.dealer.send(b"marker")
    assert from_pipe() == [header(fd), rid, b"marker"]  # the beat was taken
    assert [r for _c, r, _s in rig.lane.heard()] == [rid]
    mark()
    # A newcomer's first message (no session yet): Python opens its session while handling
    # it (note), and answers it in the same round, before its mark.
    newcomer, nfd = rig.dealer(FRONT, b"new")
    rig.lane.negotiated(FRONT, nfd)
    newcomer.send(b"hello")
    assert from_pipe() == [header(nfd), b"new", b"hello"]
    rig.lane.note(FRONT, b"new", 0, 0.0, 0.0)
    newcomer.send_multipart(later)
    assert from_pipe() == [header(nfd), b"new", *later]  # "hello" is still Python's
    mark()
    newcomer.send_multipart(later)
    newcomer.send(b"marker")
    assert from_pipe() == [header(nfd), b"new", b"marker"]
    rig.lane.stop()  # (joined: its counters are final)
    stats = rig.lane.stats()
    assert stats["marks"] == 4 and stats["sent"] == 0 and stats["beats"] == 2


def test_heard_is_sorted_once_each_and_forget_drops_it(rig: Rig) -> None:
    rig.lane.configure(1, 30.0)
    peers = []
    for name in (b"a", b"b", b"c"):
        dealer, fd = rig.dealer(FRONT, name)
        rig.lane.negotiated(FRONT, fd)
        rig.lane.note(FRONT, name, 0, 0.0, 0.0)
        peers.append(dealer)
    for dealer in reversed(peers):
        dealer.send_multipart(beat(FRONT, time.time(), 1))
        dealer.send_multipart(beat(FRONT, time.time(), 1))
        recv(dealer)
        recv(dealer)
    heard = rig.lane.heard()
    assert sorted(r for _c, r, _s in heard) == [b"a", b"b", b"c"]
    assert [s for _c, _r, s in heard] == sorted(s for _c, _r, s in heard)
    assert rig.lane.heard() == []
    peers[0].send_multipart(beat(FRONT, time.time(), 1))
    recv(peers[0])
    rig.lane.forget(FRONT, b"a")
    assert rig.lane.heard() == []


def test_stats_count_what_happened(rig: Rig) -> None:
    peer = Beating(rig, FRONT)
    for _ in range(3):
        peer.taken(beat(FRONT, time.time(), 7))
        recv(peer.dealer)
    peer.passed([b"hello"])
    rig.pipes[FRONT].send_multipart([peer.rid, b"back"])
    assert recv(peer.dealer) == [b"back"]
    rig.lane.stop()  # (joined: its counters are final)
    stats = rig.lane.stats()
    assert set(stats) >= {
        "wakeups", "received", "beats", "passed", "sent", "send_dropped", "answers", "stalled"
    }  # fmt: skip
    assert stats["received"] == 3 + 1 + 4  # the beats, hello, four markers
    assert stats["beats"] == stats["answers"] == 3
    assert stats["passed"] == 5 and stats["sent"] == 1
    assert stats["send_dropped"] == stats["stalled"] == 0
    assert 1 <= stats["wakeups"] <= stats["received"] + stats["sent"] + 1


# ---- random messages: each taken by the rule or passed intact -----------------------------------

_FIELDS = st.sampled_from([b"", b"S0C1", b"S0W1", b"HEARTBEAT", b"READY", b"\x00\xff", b"{}"])
_TIMES = st.sampled_from([0.0, 0.0, 1.0, -1.0, 1000.0, -1000.0])


def _beats(channel: int) -> st.SearchStrategy[list[bytes]]:
    """HEARTBEATs, most of the shape the lane takes, the rest off by one condition or more."""
    return st.builds(
        lambda offset, version, interval, sig, extra: [
            b"",
            sig,
            b"HEARTBEAT",
            options(time.time() + offset, version, interval),
            *extra,
        ],
        _TIMES,
        st.sampled_from([7, 7, 8, 6, 0]),
        st.sampled_from([5000, 5000, None, 1]),
        st.sampled_from([SIG[channel], SIG[channel], SIG[1 - channel]]),
        st.sampled_from([[], [], [], [b""]]),
    )


_RAW = st.lists(st.one_of(_FIELDS, st.binary(max_size=40)), min_size=1, max_size=7)
_TEXT = st.builds(
    lambda text: [b"", b"S0C1", b"HEARTBEAT", text],
    st.one_of(
        st.binary(max_size=80),
        st.builds(
            lambda t, v: json.dumps({"time": t, "config_version": v}).encode(),
            st.floats(allow_nan=True),
            st.integers(min_value=-(10**20), max_value=10**20),
        ),
    ),
)
_MDP = st.one_of(
    st.sampled_from([*MDP_BEATS.values(), *MDP_NEAR_MISSES]),
    st.lists(
        st.sampled_from([b"", MDPW01, MDPW02, b"\x04", b"\x05", b"\x01"]), min_size=1, max_size=5
    ),
)
RANDOM_MAX_FRAME = 66


@pytest.mark.parametrize("channel", [FRONT, BACK])
def test_random_messages_are_taken_by_the_rule_or_passed_intact(channel: int) -> None:
    """Every message from a DEALER is either taken, as hot.heartbeat_fields and the table say
    (frontend: answered), or reaches the pipe intact, in its connection's order; the lane lives.
    max_frame_bytes sits inside the range of the options' lengths: some beats are over it."""
    rig = Rig(max_frame_bytes=RANDOM_MAX_FRAME)
    try:
        lane = rig.lane
        lane.configure(7, 30.0)
        known, fd = rig.dealer(channel, b"known")
        lane.negotiated(channel, fd)
        lane.note(channel, b"known", 5000, math.inf, 0.0)
        stranger, sfd = rig.dealer(channel, b"stranger")
        lane.negotiated(channel, sfd)
        markers = itertools.count()

        @settings(max_examples=120)
        @given(
            st.lists(
                st.tuples(
                    st.sampled_from([True, True, False]),  # (from the known peer?)
                    st.one_of(_beats(channel), _beats(channel), _RAW, _TEXT, _MDP),
                ),
                min_size=1,
                max_size=8,
            )
        )
        def run(messages: list[tuple[bool, list[bytes]]]) -> None:
            expected: list[list[bytes]] = []
            taken = 0
            for from_known, frames in messages:
                rid, dealer, conn = (
                    (b"known", known, fd) if from_known else (b"stranger", stranger, sfd)
                )
                dealer.send_multipart(frames)
                fields = hot.heartbeat_fields([rid, *frames], SIG[channel], RANDOM_MAX_FRAME)
                takes = from_known and (
                    (
                        fields is not None
                        # (times are now, or 1000 s off: a slow machine cannot blur the 30 s)
                        and abs(fields[0] - time.time()) <= 30.0
                        and fields[1] >= 7
                        and fields[2] == 5000
                    )
                    # a Majordomo worker HEARTBEAT as the decoder reads it (backend only)
                    or (channel == BACK and mdp_beat_decoded(frames, RANDOM_MAX_FRAME))
                )
                if takes:
                    taken += 1
                else:
                    expected.append([header(conn), rid, *frames])
            # a marker from each connection (the lane keeps each one's order, not theirs)
            marker = b"marker\x00%d" % next(markers)
            known.send(marker)
            stranger.send(marker)
            got = rig.until_marker(channel, marker)
            got += rig.until_marker(channel, marker)
            got = [m for m in got if m[-1] != marker or len(m) != 3]
            # per connection, in order, intact; nothing lost, nothing extra
            for rid in (b"known", b"stranger"):
                assert [m for m in got if m[1] == rid] == [m for m in expected if m[1] == rid]
            for _ in range(taken if channel == FRONT else 0):
                answer = recv(known)
                sent = Heartbeat.from_frames(answer).time
                assert (
                    answer
                    == Heartbeat(
                        time=sent, config_version=7, interval_ms=5000, protocol=b"S0C1"
                    ).to_frames()
                )
            assert not known.poll(0)
            assert [(c, r) for c, r, _s in lane.heard()] == [(channel, b"known")] * (taken > 0)

        run()
        assert lane.stats()["lost"] == lane.stats()["errors"] == 0
    finally:
        rig.close()
