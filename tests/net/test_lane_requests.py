"""The C lane takes Majordomo client REQUESTs and their workers' final REPLYs (phase 3b, step 1).

Real sockets on 127.0.0.1 (tests/net/test_lane.py's Rig: the two ROUTERs the lane owns, its two
inproc pipes, DEALER peers) and a real scale0.core._pool.Pool shared with the lane. Every frame a
peer sends is built by scale0.wire.mdp's classes, and every frame the lane sends is compared
byte for byte with what those classes write. Each take condition is shown both ways: spoilt,
the message reaches Python's pipe intact; restored, the lane takes the next one. A message
taken is seen where it went (the worker's or the client's DEALER), one passed on the pipe, so
no test waits for an absence. Every wait is bounded (test_lane.WAIT_S).
"""

from __future__ import annotations

import itertools
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import zmq
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from scale0.config.model import NetworkConfig
from scale0.core.context import Core
from scale0.core.majordomo import Reading
from scale0.core.metrics import LATENCY_BUCKETS_S
from scale0.wire.mdp import (
    MDPC01,
    MDPC02,
    MDPW01,
    MDPW02,
    MdpClientReply,
    MdpClientRequest,
    MdpWorkerPartial,
    MdpWorkerReady,
    MdpWorkerReply,
    MdpWorkerRequest,
)
from scale0.wire.peer import BrokerState
from scale0.wire.registry import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    decode_to_broker,
)
from tests.extensions import load_extension
from tests.net.test_lane import BACK, FRONT, MAX_FRAME, ROOT, Lane, Rig, header, recv, rig

if os.environ.get("SCALE0_POOL_SO"):  # a sanitizer build of the pool too (before the lane's import)
    load_extension("scale0.core._pool", os.environ["SCALE0_POOL_SO"])

try:
    from scale0.core._pool import Pool
except ImportError:  # pragma: no cover - where the extension is not built
    Pool = None

__all__ = ["rig"]  # (a fixture: tests/net/test_lane.py's, used by name)

pytestmark = pytest.mark.skipif(
    Lane is None or Pool is None, reason="scale0.net._zmqio or scale0.core._pool not built here"
)

PREFIX = b"boot-id-"
ALL_DONE = 2**64 - 1  # a done mark past every message passed
TIMEOUT_S = 30.0
MAX_QUEUED = 100

#: Every reading of a Majordomo client the registry decodes: (protocol, delimited, majortomo).
CLIENT_READINGS = [
    Reading(MDPC01, True, False),
    Reading(MDPC02, True, False),
    Reading(MDPC02, False, False),
    Reading(MDPC02, True, True),
    Reading(MDPC02, False, True),
]
#: Every reading of a Majordomo worker.
WORKER_READINGS = [Reading(MDPW01, True), Reading(MDPW02, True), Reading(MDPW02, False)]


def pack(reading: Reading) -> int:
    """note()'s majordomo: bit 0 version 1, bit 1 version 2, bit 2 delimited, bit 3 majortomo."""
    version = 1 if reading.protocol in (MDPC01, MDPW01) else 2
    return version | (4 if reading.delimited else 0) | (8 if reading.majortomo else 0)


def reading_of(frames: list[bytes], channel: int) -> Reading:
    """The reading the registry finds in ``frames`` (the authority the lane is the twin of)."""
    accept = FRONTEND_SIGNATURES if channel == FRONT else BACKEND_SIGNATURES
    msg: Any = decode_to_broker(frames, max_frame_bytes=MAX_FRAME, signatures=accept)
    return Reading(msg.protocol, msg.delimited, getattr(msg, "majortomo", False))


def request(service: str, body: tuple[bytes, ...], reading: Reading) -> list[bytes]:
    return MdpClientRequest(
        service,
        body,
        protocol=reading.protocol,
        delimited=reading.delimited,
        majortomo=reading.majortomo,
    ).to_frames()


def ticket_of(number: int) -> bytes:
    """The ticket numbered ``number`` of the shared seq (_lane.c's next_ticket; Python's own
    while a lane is attached, scale0.core.context.Core.next_ticket): one numbering, so a
    worker's tickets sort in the order they were issued, whoever issued them."""
    return PREFIX + number.to_bytes(8, "big")


@contextmanager
def locked(lane: Any) -> Iterator[None]:
    lane.lock()
    try:
        yield
    finally:
        lane.unlock()


class Peer:
    def __init__(
        self, dealer: zmq.Socket[Any], rid: bytes, fd: int, reading: Reading, key: bytes = b""
    ) -> None:
        self.dealer, self.rid, self.fd, self.reading = dealer, rid, fd, reading
        self.key = key  # its CURVE key, on a keyed frontend (the pipe's header carries it)


class Net:
    """A started lane serving Majordomo requests from a shared pool, with its peers."""

    def __init__(self, rig: Rig, *, cap: int = 10, timeout: float = TIMEOUT_S) -> None:
        self.rig = rig
        self.lane = rig.lane
        self.pool = Pool()
        self.lane.attach_pool(self.pool)
        self.lane.serve(True, timeout, cap, PREFIX, MAX_QUEUED, False)
        self.markers = itertools.count()

    def worker(
        self,
        rid: bytes,
        reading: Reading = WORKER_READINGS[1],
        service: str = "echo",
        capacity: int = 1,
    ) -> Peer:
        dealer, fd = self.rig.dealer(BACK, rid)
        ready = MdpWorkerReady(
            service, protocol=reading.protocol, delimited=reading.delimited
        ).to_frames()
        dealer.send_multipart(ready)  # through the lane to Python: the ROUTER knows it now
        assert self.rig.from_pipe(BACK) == [header(fd), rid, *ready]
        self.lane.negotiated(BACK, fd)
        self.lane.note(BACK, rid, 0, 0.0, time.monotonic(), pack(reading))
        with locked(self.lane):
            self.pool.add(rid, (service,), capacity)
            self.pool.list_ready(rid)
        return Peer(dealer, rid, fd, reading)

    def client(self, rid: bytes, reading: Reading = CLIENT_READINGS[1]) -> Peer:
        dealer, fd = self.rig.dealer(FRONT, rid)
        self.lane.negotiated(FRONT, fd)
        self.note_client(rid, reading)
        return Peer(dealer, rid, fd, reading, self.rig.public if self.rig.curve else b"")

    def note_client(self, rid: bytes, reading: Reading, **kw: Any) -> None:
        kw.setdefault("client_id", b"b." + rid)
        self.lane.note(FRONT, rid, 0, 0.0, time.monotonic(), pack(reading), **kw)

    def send(self, peer: Peer, frames: list[bytes], channel: int) -> list[list[bytes]]:
        """Send ``frames`` then a marker: what reached the pipe before the marker."""
        marker = b"marker-%d" % next(self.markers)
        peer.dealer.send_multipart(frames)
        peer.dealer.send(marker)
        got = self.rig.until_marker(channel, marker)
        assert got[-1] == [header(peer.fd, peer.key), peer.rid, marker]
        return got[:-1]

    def ask(self, client: Peer, body: tuple[bytes, ...] = (b"hi",), service: str = "echo") -> None:
        """A REQUEST the lane must pass: it reaches the pipe intact."""
        frames = request(service, body, client.reading)
        passed = [[header(client.fd, client.key), client.rid, *frames]]
        assert self.send(client, frames, FRONT) == passed

    def dispatch(
        self, client: Peer, worker: Peer, body: tuple[bytes, ...] = (b"hi",), service: str = "echo"
    ) -> bytes:
        """A REQUEST the lane must take: the worker gets exactly mdp's REQUEST; its ticket."""
        frames = request(service, body, client.reading)
        assert self.send(client, frames, FRONT) == []
        got = recv(worker.dealer)
        ticket = got[3] if worker.reading.delimited else got[2]
        expect = MdpWorkerRequest(
            ticket, body, protocol=worker.reading.protocol, delimited=worker.reading.delimited
        ).to_frames()
        assert got == expect
        return ticket

    def reply_frames(
        self, worker: Peer, ticket: bytes, body: tuple[bytes, ...] = (b"done",)
    ) -> list[bytes]:
        return MdpWorkerReply(
            ticket, body, protocol=worker.reading.protocol, delimited=worker.reading.delimited
        ).to_frames()

    def answered(
        self,
        worker: Peer,
        client: Peer,
        ticket: bytes,
        body: tuple[bytes, ...] = (b"done",),
        service: str = "echo",
    ) -> None:
        """A final REPLY the lane must take: the client gets exactly mdp's reply."""
        assert self.send(worker, self.reply_frames(worker, ticket, body), BACK) == []
        reading = client.reading
        expect = MdpClientReply(
            service,
            body,
            protocol=reading.protocol,
            delimited=reading.delimited,
            majortomo=reading.majortomo,
        ).to_frames()
        assert recv(client.dealer) == expect

    def passed_reply(self, worker: Peer, frames: list[bytes]) -> None:
        assert self.send(worker, frames, BACK) == [[header(worker.fd), worker.rid, *frames]]


@pytest.fixture
def net(rig: Rig) -> Net:
    return Net(rig)


# ---- the readings ---------------------------------------------------------------------------


def test_the_readings_are_the_registry_s() -> None:
    """The test's packed readings are what the registry decodes from each form."""
    for reading in CLIENT_READINGS:
        assert reading_of(request("echo", (b"x",), reading), FRONT) == reading
    for reading in WORKER_READINGS:
        frames = MdpWorkerReply(
            b"t", (b"x",), protocol=reading.protocol, delimited=reading.delimited
        ).to_frames()
        assert reading_of(frames, BACK) == reading


@pytest.mark.parametrize("worker_reading", WORKER_READINGS, ids=pack)
@pytest.mark.parametrize("client_reading", CLIENT_READINGS, ids=pack)
def test_a_request_and_its_reply_go_through_the_lane_in_every_reading(
    net: Net, client_reading: Reading, worker_reading: Reading
) -> None:
    worker = net.worker(b"w1", worker_reading)
    client = net.client(b"c1", client_reading)
    before = time.monotonic()
    body = (b"frame one", b"", b"x" * 60000)
    ticket = net.dispatch(client, worker, body)
    assert ticket == ticket_of(2)  # (the request is numbered 1, its dispatch 2)
    lane, pool = net.lane, net.pool
    assert lane.in_flight() == 1 and lane.held(b"b.c1") == 1 and lane.busy(b"c1")
    with locked(lane):
        assert pool.tickets(b"w1") == [ticket] and pool.ready_count("echo") == 0
    heard = lane.heard()
    assert [(c, r) for c, r, _s in heard] == [(FRONT, b"c1")]
    assert before <= heard[0][2] <= time.monotonic()
    due = lane.next_due()
    assert due is not None and before + TIMEOUT_S <= due <= time.monotonic() + TIMEOUT_S
    net.answered(worker, client, ticket, (b"answer", b"", b"y" * 60000))
    assert lane.in_flight() == 0 and lane.held(b"b.c1") == 0 and not lane.busy(b"c1")
    assert lane.next_due() is None
    with locked(lane):
        assert pool.tickets(b"w1") == [] and pool.queue("echo") == [b"w1"]
    assert [(c, r) for c, r, _s in lane.heard()] == [(BACK, b"w1")]
    requests, replies, histograms, changed, _forwards, _forwarded = lane.drain()
    assert (requests, replies, changed) == (1, 1, ["echo"])
    [(service, status, counts, sum_s)] = histograms  # (a Majordomo answer is status 200)
    assert (
        service == "echo"
        and status == 200
        and len(counts) == len(LATENCY_BUCKETS_S) + 1
        and sum(counts) == 1
    )
    assert 0.0 <= sum_s <= time.monotonic() - before
    assert lane.drain() == (0, 0, [], [], 0, 0)
    # the next request is numbered on: 3, its ticket 4
    assert net.dispatch(client, worker) == ticket_of(4)
    lane.stop()
    stats = lane.stats()
    assert (stats["requests"], stats["replies"], stats["handed"]) == (2, 1, 0)
    assert (
        stats["received"]
        == stats["beats"] + stats["requests"] + stats["replies"] + stats["passed"] + stats["lost"]
    )


def test_the_lane_s_buckets_are_the_core_s() -> None:
    source = (ROOT / "scale0" / "net" / "_lane.c").read_text()
    found = re.search(r"BUCKETS_S\[S0_BUCKETS\] = \{([^}]*)\}", source)
    assert found is not None
    assert tuple(float(x) for x in found.group(1).split(",")) == LATENCY_BUCKETS_S
    assert re.search(r"#define S0_BUCKETS (\d+)", source).group(1) == str(  # type: ignore[union-attr]
        len(LATENCY_BUCKETS_S)
    )


def test_the_least_recently_used_worker_is_dispatched_to(net: Net) -> None:
    workers = [net.worker(b"w%d" % n) for n in range(3)]
    client = net.client(b"c1")
    tickets = [net.dispatch(client, w) for w in workers]  # w0, w1, w2 in LRU order
    assert tickets == [ticket_of(n) for n in (2, 4, 6)]  # (each request 1, 3, 5 numbered first)
    net.answered(workers[1], client, tickets[1])
    net.answered(workers[0], client, tickets[0])
    assert net.dispatch(client, workers[1]) == ticket_of(8)  # w1 freed first: first again


# ---- the REQUEST take rule, each condition both ways ------------------------------------------

Spoil = Callable[[Net, Peer, Peer], Callable[[], None]]


def _serve_off(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.serve(False, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)
    return lambda: net.lane.serve(True, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)


def _no_pool(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.attach_pool(None)
    return lambda: net.lane.attach_pool(net.pool)


def _other_reading(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    other = CLIENT_READINGS[0] if c.reading != CLIENT_READINGS[0] else CLIENT_READINGS[1]
    net.note_client(c.rid, other)
    return lambda: net.note_client(c.rid, c.reading)


def _speaks_s0p(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.note(FRONT, c.rid, 0, 0.0, 0.0, 0, client_id=b"b." + c.rid)
    return lambda: net.note_client(c.rid, c.reading)


def _majordomo_true(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.note(FRONT, c.rid, 0, 0.0, 0.0, True, client_id=b"b." + c.rid)
    return lambda: net.note_client(c.rid, c.reading)


def _promise(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.note(FRONT, c.rid, 5000, 0.0, 0.0, pack(c.reading), client_id=b"b." + c.rid)
    return lambda: net.note_client(c.rid, c.reading)


def _not_open(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.note_client(c.rid, c.reading, open=False)
    return lambda: net.note_client(c.rid, c.reading)


def _no_session(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.forget(FRONT, c.rid)
    return lambda: net.note_client(c.rid, c.reading)


def _not_negotiated(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.gone(FRONT, c.fd)
    return lambda: net.lane.negotiated(FRONT, c.fd)


def _python_holds(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.python_holds(b"b." + c.rid, 10)  # (Python's + the lane's reach the cap, 10)
    net.lane.python_holds(b"b.other", 0)  # (another, never held: nothing)
    return lambda: net.lane.python_holds(b"b." + c.rid, 9)  # (one under it: taken)


def _python_waits(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.python_waits("echo", 1)
    return lambda: net.lane.python_waits("echo", 0)


def _cap_zero(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.serve(True, TIMEOUT_S, 0, PREFIX, MAX_QUEUED, False)
    return lambda: net.lane.serve(True, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)


def _worker_speaks_s0p(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.note(BACK, w.rid, 0, 0.0, 0.0, 0)
    return lambda: net.lane.note(BACK, w.rid, 0, 0.0, 0.0, pack(w.reading))


def _worker_reading_unknown(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.note(BACK, w.rid, 0, 0.0, 0.0, True)  # "speaks Majordomo", no framing: not written
    return lambda: net.lane.note(BACK, w.rid, 0, 0.0, 0.0, pack(w.reading))


def _worker_promise(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.note(BACK, w.rid, 5000, 0.0, 0.0, pack(w.reading))
    return lambda: net.lane.note(BACK, w.rid, 0, 0.0, 0.0, pack(w.reading))


def _worker_no_session(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    net.lane.forget(BACK, w.rid)
    return lambda: net.lane.note(BACK, w.rid, 0, 0.0, 0.0, pack(w.reading))


def _worker_not_ready(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    with locked(net.lane):
        net.pool.hold(w.rid, b"python's")
        net.pool.list_ready(w.rid)  # full: out of the queue

    def restore() -> None:
        with locked(net.lane):
            net.pool.release(w.rid, b"python's")
            net.pool.list_ready(w.rid)

    return restore


def _worker_gone(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    with locked(net.lane):
        net.pool.remove(w.rid)

    def restore() -> None:
        with locked(net.lane):
            net.pool.add(w.rid, ("echo",), 1)
            net.pool.list_ready(w.rid)

    return restore


def _order(net: Net, c: Peer, w: Peer) -> Callable[[], None]:
    """Done marks on, and a message of the client still in Python's hands."""
    pipe = net.rig.pipes[FRONT]
    pipe.send(struct.pack("<Q", 0))
    c.dealer.send(b"python's")
    assert net.rig.from_pipe(FRONT) == [header(c.fd), c.rid, b"python's"]
    return lambda: pipe.send(struct.pack("<Q", ALL_DONE))


SPOILS: dict[str, Spoil] = {
    "serve off": _serve_off,
    "no pool attached": _no_pool,
    "another reading": _other_reading,
    "speaks S0P": _speaks_s0p,
    "majordomo=True": _majordomo_true,
    "promise": _promise,
    "not open": _not_open,
    "no session": _no_session,
    "fd not negotiated": _not_negotiated,
    "python holds": _python_holds,
    "python waits": _python_waits,
    "cap": _cap_zero,
    "worker speaks S0P": _worker_speaks_s0p,
    "worker reading unknown": _worker_reading_unknown,
    "worker promise": _worker_promise,
    "worker without session": _worker_no_session,
    "no ready worker": _worker_not_ready,
    "no worker": _worker_gone,
    "order": _order,
}


@pytest.mark.parametrize("spoil", SPOILS.values(), ids=SPOILS.keys())
@pytest.mark.parametrize("client_reading", CLIENT_READINGS[:2] + CLIENT_READINGS[4:], ids=pack)
def test_each_request_condition_both_ways(net: Net, spoil: Spoil, client_reading: Reading) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1", client_reading)
    restore = spoil(net, client, worker)
    net.ask(client)
    assert net.lane.in_flight() == 0 and net.lane.stats()["requests"] == 0
    restore()
    ticket = net.dispatch(client, worker)
    net.answered(worker, client, ticket)


def test_the_cap_counts_the_lane_s_requests_of_the_client(net: Net) -> None:
    net.lane.serve(True, TIMEOUT_S, 2, PREFIX, MAX_QUEUED, False)
    worker = net.worker(b"w1", capacity=5)
    client = net.client(b"c1")
    other = net.client(b"c2")
    net.lane.note(FRONT, b"c2", 0, 0.0, 0.0, pack(other.reading), client_id=b"b.c1")  # same id
    first = net.dispatch(client, worker)
    net.dispatch(other, worker)
    assert net.lane.held(b"b.c1") == 2
    net.ask(client)  # a third of that client_id: Python's (R20's cap)
    net.answered(worker, client, first)
    net.dispatch(client, worker)


@pytest.mark.parametrize(
    "frames",
    [
        [b"", MDPC02, b"\x01"],  # no service frame
        [b"", MDPC01],
        [MDPC02, b"\x01"],
        [b"", MDPC02, b"\x03", b"echo", b"x"],  # not a REQUEST command
        [b"", MDPC02, b"\x01", b"", b"x"],  # empty service
        [b"", MDPC02, b"\x01", b"ec\xffho", b"x"],  # not UTF-8
        [b"", MDPC02, b"\x01", b"ec\x01ho", b"x"],  # not printable
        [b"", MDPC02, b"\x01", b"e" * 256, b"x"],  # too long a name
        [b"", MDPC02, b"\x01", b"mmi.service", b"x"],  # reserved
        [b"", MDPC02, b"\x01", b"scale0.status", b"x"],  # reserved
        [MDPC01, b"echo", b"x"],  # 7/MDP has no undelimited form
        [b"x", MDPC02, b"\x01", b"echo"],
        [b"", MDPC02, b"\x01", b"echo", b"x" * (MAX_FRAME + 1)],  # over max_frame_bytes
        [b"", b"S0C1", b"REQUEST", b"{}", b"echo"],
    ],
)
def test_what_is_not_exactly_a_request_it_may_take_is_passed_intact(
    net: Net, frames: list[bytes]
) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    assert net.send(client, frames, FRONT) == [[header(client.fd), client.rid, *frames]]
    net.dispatch(client, worker)


def test_a_service_no_worker_offers_is_passed(net: Net) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    net.ask(client, service="other")
    net.ask(client, service="caf\u00e9")  # (a non-ASCII name too: only the pool's are routed)
    net.dispatch(client, worker)


def test_a_non_ascii_service_the_pool_offers_is_routed(net: Net) -> None:
    worker = net.worker(b"w1", service="caf\u00e9")
    client = net.client(b"c1")
    ticket = net.dispatch(client, worker, service="caf\u00e9")
    net.answered(worker, client, ticket, service="caf\u00e9")


def test_a_frame_at_max_frame_bytes_is_taken() -> None:
    rig = Rig(max_frame_bytes=100)
    try:
        net = Net(rig)
        worker = net.worker(b"w1")
        client = net.client(b"c1")
        ticket = net.dispatch(client, worker, (b"x" * 100,))
        net.answered(worker, client, ticket, (b"y" * 100,))
        net.ask(client, (b"x" * 101,))
        ticket = net.dispatch(client, worker)
        net.passed_reply(worker, net.reply_frames(worker, ticket, (b"y" * 101,)))
    finally:
        rig.close()


# ---- the REPLY take rule --------------------------------------------------------------------


def test_a_partial_goes_to_python_and_the_final_after_it_too_once_adopted(net: Net) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    ticket = net.dispatch(client, worker)
    partial = MdpWorkerPartial(ticket, (b"part",)).to_frames()
    net.passed_reply(worker, partial)
    record = net.lane.adopt(ticket)  # Python finds the ticket is not its own
    assert record is not None and record[0] == ticket
    net.passed_reply(worker, net.reply_frames(worker, ticket))


def test_an_unknown_ticket_is_passed(net: Net) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    ticket = net.dispatch(client, worker)
    net.passed_reply(worker, net.reply_frames(worker, ticket_of(99)))
    net.passed_reply(worker, net.reply_frames(worker, b"python-ticket"))
    net.answered(worker, client, ticket)


def test_another_worker_s_reply_to_a_lane_ticket_is_passed(net: Net) -> None:
    w1 = net.worker(b"w1")
    w2 = net.worker(b"w2")
    client = net.client(b"c1")
    ticket = net.dispatch(client, w1)
    net.passed_reply(w2, net.reply_frames(w2, ticket))
    assert net.lane.in_flight() == 1
    net.answered(w1, client, ticket)


@pytest.mark.parametrize(
    "frames",
    [
        [b"", MDPW02, b"\x04", b"TICKET"],  # no empty frame
        [b"", MDPW02, b"\x04", b"TICKET", b"x", b"body"],  # not empty
        [b"", MDPW01, b"\x04", b"TICKET", b"", b"body"],  # MDPW01 0x04 is a HEARTBEAT
        [MDPW01, b"\x03", b"TICKET", b"", b"body"],  # MDPW01 is always delimited
        [b"", MDPW02, b"\x03", b"TICKET", b"", b"body"],  # a PARTIAL
        [b"", MDPW02, b"\x04", b"TICKET", b"", b"x" * (MAX_FRAME + 1)],
    ],
)
def test_what_is_not_exactly_a_final_reply_is_passed_intact(net: Net, frames: list[bytes]) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    ticket = net.dispatch(client, worker)
    frames = [ticket if f == b"TICKET" else f for f in frames]
    net.passed_reply(worker, frames)
    net.answered(worker, client, ticket)


def _reply_serve_off(net: Net, w: Peer) -> Callable[[], None]:
    net.lane.serve(False, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)
    return lambda: net.lane.serve(True, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)


def _reply_waits(net: Net, w: Peer) -> Callable[[], None]:
    net.lane.python_waits("echo", 1)
    return lambda: net.lane.python_waits("echo", 0)


def _reply_not_negotiated(net: Net, w: Peer) -> Callable[[], None]:
    net.lane.gone(BACK, w.fd)
    return lambda: net.lane.negotiated(BACK, w.fd)


def _reply_no_session(net: Net, w: Peer) -> Callable[[], None]:
    net.lane.forget(BACK, w.rid)
    return lambda: net.lane.note(BACK, w.rid, 0, 0.0, 0.0, pack(w.reading))


def _reply_no_pool(net: Net, w: Peer) -> Callable[[], None]:
    net.lane.attach_pool(None)
    return lambda: net.lane.attach_pool(net.pool)


def _reply_order(net: Net, w: Peer) -> Callable[[], None]:
    pipe = net.rig.pipes[BACK]
    pipe.send(struct.pack("<Q", 0))
    w.dealer.send(b"python's")
    assert net.rig.from_pipe(BACK) == [header(w.fd), w.rid, b"python's"]
    return lambda: pipe.send(struct.pack("<Q", ALL_DONE))


REPLY_SPOILS: dict[str, Callable[[Net, Peer], Callable[[], None]]] = {
    "serve off": _reply_serve_off,
    "python waits": _reply_waits,
    "fd not negotiated": _reply_not_negotiated,
    "worker without session": _reply_no_session,
    "no pool attached": _reply_no_pool,
    "order": _reply_order,
}


@pytest.mark.parametrize("spoil", REPLY_SPOILS.values(), ids=REPLY_SPOILS.keys())
@pytest.mark.parametrize("worker_reading", WORKER_READINGS, ids=pack)
def test_each_reply_condition_both_ways(
    net: Net, spoil: Callable[[Net, Peer], Callable[[], None]], worker_reading: Reading
) -> None:
    worker = net.worker(b"w1", worker_reading, capacity=2)
    client = net.client(b"c1")
    first = net.dispatch(client, worker)
    second = net.dispatch(client, worker)
    restore = spoil(net, worker)
    net.passed_reply(worker, net.reply_frames(worker, first))
    assert net.lane.in_flight() == 2  # (Python would adopt it now)
    restore()
    net.answered(worker, client, second)
    assert net.lane.in_flight() == 1


# ---- handing records to Python ----------------------------------------------------------------


def test_adopt_hands_the_whole_record_and_the_reply_then_goes_to_python() -> None:
    server = zmq.curve_keypair()
    rig = Rig(keyed_front=True, curve=server)
    try:
        net = Net(rig)
        worker = net.worker(b"w1")
        client = net.client(b"c1")
        key = rig.public.decode()
        before = time.monotonic()
        ticket = net.dispatch(client, worker, (b"a", b"", b"c"))
        with locked(net.lane):
            assert net.lane.adopt(b"nope") is None
            record = net.lane.adopt(ticket)
            assert net.lane.adopt(ticket) is None
            assert net.pool.tickets(b"w1") == [ticket]  # its slot stays held, under its ticket
        assert record is not None
        t, wrid, crid, client_id, caller, service, body, started, deadline, request_id, seq, ids = (
            record[:12]
        )
        assert record[12:] == (b"", "", float("inf"), "")  # (not forwarded either way)
        assert (t, wrid, crid, client_id, caller, service, body) == (
            ticket,
            b"w1",
            b"c1",
            b"b.c1",
            key,
            "echo",
            (b"a", b"", b"c"),
        )
        assert before <= started <= time.monotonic() and deadline == started + TIMEOUT_S
        assert request_id == b"mdp.L1" and seq == 1 and ids is False
        assert net.lane.in_flight() == 0 and net.lane.held(b"b.c1") == 0
        assert not net.lane.busy(b"c1") and net.lane.stats()["handed"] == 1
        net.passed_reply(worker, net.reply_frames(worker, ticket))
    finally:
        rig.close()


def test_adopt_worker_and_adopt_all_in_ticket_order(net: Net) -> None:
    w1 = net.worker(b"w1", capacity=3)
    w2 = net.worker(b"w2", capacity=3)
    client = net.client(b"c1")
    tickets = [net.dispatch(client, w) for w in (w1, w2, w1, w2, w1)]
    with locked(net.lane):
        got = net.lane.adopt_worker(b"w1")
        assert [r[0] for r in got] == [tickets[0], tickets[2], tickets[4]]
        assert net.lane.adopt_worker(b"w1") == [] and net.lane.adopt_worker(b"w9") == []
        rest = net.lane.adopt_all()
        assert [r[0] for r in rest] == [tickets[1], tickets[3]]
        assert [r[9] for r in rest] == [b"mdp.L2", b"mdp.L4"]
        assert net.lane.adopt_all() == []
    assert net.lane.stats()["handed"] == 5 and net.lane.in_flight() == 0
    for w, t in zip((w1, w2, w1, w2, w1), tickets, strict=True):
        net.passed_reply(w, net.reply_frames(w, t))


def test_adopt_due_in_deadline_order_and_next_due(net: Net) -> None:
    worker = net.worker(b"w1", capacity=4)
    client = net.client(b"c1")
    net.lane.serve(True, 100.0, 10, PREFIX, MAX_QUEUED, False)
    late = net.dispatch(client, worker)
    net.lane.serve(True, 10.0, 10, PREFIX, MAX_QUEUED, False)
    early = net.dispatch(client, worker)
    net.lane.serve(True, 50.0, 10, PREFIX, MAX_QUEUED, False)
    middle = net.dispatch(client, worker)
    with locked(net.lane):
        due = net.lane.next_due()
        assert due is not None
        assert net.lane.adopt_due(due - 0.001) == []
        got = net.lane.adopt_due(due + 45.0)
        assert [r[0] for r in got] == [early, middle]
        remaining = net.lane.next_due()
        assert remaining is not None and remaining > got[1][8]
        [last] = net.lane.adopt_due(remaining)
        assert last[0] == late and last[8] == remaining
        assert net.lane.next_due() is None
    assert net.lane.stats()["handed"] == 3


def test_records_stay_adoptable_after_stop(net: Net) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    ticket = net.dispatch(client, worker)
    net.lane.stop()
    with locked(net.lane):
        assert [r[0] for r in net.lane.adopt_all()] == [ticket]


def test_drain_lists_what_changed_and_the_latencies_sorted(net: Net) -> None:
    a = net.worker(b"wa", service="alpha")
    b = net.worker(b"wb", service="beta")
    client = net.client(b"c1")
    tb = net.dispatch(client, b, service="beta")
    ta = net.dispatch(client, a, service="alpha")
    assert net.lane.drain() == (2, 0, [], ["alpha", "beta"], 0, 0)
    net.answered(b, client, tb, service="beta")
    requests, replies, histograms, changed, _forwards, _forwarded = net.lane.drain()
    assert (requests, replies, changed) == (0, 1, ["beta"])
    assert [h[:2] for h in histograms] == [("beta", 200)]
    net.answered(a, client, ta, service="alpha")
    ticket = net.dispatch(client, b, service="beta")
    with locked(net.lane):
        assert net.lane.adopt(ticket) is not None
    requests, replies, histograms, changed, _forwards, _forwarded = net.lane.drain()
    assert (requests, replies, changed) == (1, 1, ["alpha", "beta"])
    assert [h[:2] for h in histograms] == [("alpha", 200)]


# ---- the lock and the pool's guard ------------------------------------------------------------


def test_the_pool_refuses_calls_outside_the_lock_while_shared(rig: Rig) -> None:
    lane = rig.lane
    pool = Pool()
    pool.add(b"w", ("s",), 1)  # not shared yet: no guard
    lane.attach_pool(pool)
    calls: list[Callable[[], object]] = [
        lambda: pool.add(b"w", ("s",), 1),
        lambda: pool.remove(b"x"),
        lambda: pool.offers("s"),
        lambda: pool.offered_count("s"),
        pool.services,
        lambda: pool.ready_count("s"),
        lambda: pool.queue("s"),
        lambda: pool.take("s"),
        lambda: pool.hold(b"w", b"t"),
        lambda: pool.release(b"w", b"t"),
        lambda: pool.list_ready(b"w"),
        lambda: pool.tickets(b"w"),
        lambda: pool.spare(b"w"),
        lambda: pool.used(b"w"),
        pool.worker_count,
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match=r"call it under lane\.lock\(\)"):
            call()
    with locked(lane):
        for call in calls:
            call()
        lane.lock()  # recursive
        assert pool.worker_count() == 1
        lane.unlock()
        assert pool.worker_count() == 1
    lane.attach_pool(None)  # detached: no guard
    assert pool.worker_count() == 1
    lane.attach_pool(pool)
    with pytest.raises(RuntimeError):
        pool.worker_count()
    with pytest.raises(TypeError, match="attach_pool: pool must be"):
        lane.attach_pool(object())


def test_a_lane_s_dealloc_clears_the_guard() -> None:
    rig = Rig()
    pool = Pool()
    rig.lane.attach_pool(pool)
    with pytest.raises(RuntimeError):
        pool.worker_count()
    rig.close()
    rig.lane = None  # type: ignore[assignment]
    assert pool.worker_count() == 0


def test_stop_while_python_holds_the_lock_raises(rig: Rig) -> None:
    rig.lane.lock()
    with pytest.raises(RuntimeError, match="holds the lane's lock"):
        rig.lane.stop()
    rig.lane.unlock()
    rig.lane.stop()
    with pytest.raises(RuntimeError, match="without a matching lock"):
        rig.lane.unlock()


def test_the_thread_waits_for_python_s_lock(net: Net) -> None:
    """While Python holds the lock, the lane reads nothing into its tables; after, it does."""
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    with locked(net.lane):
        client.dealer.send_multipart(request("echo", (b"hi",), client.reading))
        time.sleep(0.05)  # (no assertion on time: only gives the thread a chance to be wrong)
        assert net.lane.in_flight() == 0
        assert not worker.dealer.poll(0)
    got = recv(worker.dealer)
    assert got[:3] == [b"", MDPW02, b"\x02"]


def test_another_python_thread_waits_for_the_lock_without_holding_the_gil(rig: Rig) -> None:
    lane = rig.lane
    done = threading.Event()

    def other() -> None:
        lane.note(FRONT, b"x", 0, 0.0, 0.0)  # waits for the lock, the GIL released
        done.set()

    errors: list[RuntimeError] = []

    def unlock_elsewhere() -> None:
        try:
            lane.unlock()
        except RuntimeError as e:
            errors.append(e)

    lane.lock()
    thread = threading.Thread(target=other)
    thread.start()
    assert not done.wait(0.05)  # (this thread runs on meanwhile: it has the GIL back)
    stranger = threading.Thread(target=unlock_elsewhere)
    stranger.start()
    stranger.join(10.0)
    assert len(errors) == 1 and "does not hold the lock" in str(errors[0])
    lane.unlock()
    assert done.wait(10.0)
    thread.join(10.0)
    assert lane.last_seen(FRONT, b"x") == 0.0


# ---- arguments --------------------------------------------------------------------------------


def test_bad_arguments_are_named(rig: Rig) -> None:
    lane = rig.lane
    with pytest.raises(ValueError, match="majordomo must be 0"):
        lane.note(FRONT, b"x", 0, 0.0, 0.0, 16)
    with pytest.raises(ValueError, match="majordomo must be 0"):
        lane.note(FRONT, b"x", 0, 0.0, 0.0, -1)
    with pytest.raises(ValueError, match="timeout_s"):
        lane.serve(True, float("nan"), 1, b"", 1, True)
    with pytest.raises(ValueError, match="max_per_client"):
        lane.serve(True, 1.0, -1, b"", 1, True)
    with pytest.raises(ValueError, match="ticket_prefix"):
        lane.serve(True, 1.0, 1, b"x" * 248, 1, True)
    with pytest.raises(ValueError, match="max_queued"):
        lane.serve(True, 1.0, 1, b"", -1, True)
    with pytest.raises(TypeError):
        lane.serve(True, 1.0, 1, b"")  # (the two arguments of step 2 are not optional)
    with pytest.raises(TypeError):
        lane.python_waits(b"echo", 1)
    with pytest.raises(TypeError):
        lane.python_holds("id", 1)
    with pytest.raises(ValueError, match="count must be >= 0"):
        lane.python_waits("echo", -1)
    with pytest.raises(ValueError, match="count must be >= 0"):
        lane.python_holds(b"id", -1)
    with pytest.raises(TypeError, match="service must be str"):
        lane.waiting(b"echo")
    with pytest.raises(KeyError, match="no request of 'echo' waits"):
        lane.dispatch_head("echo", b"t", b"w")
    with pytest.raises(ValueError, match=r"worker_rid must be 1\.\.255"):
        lane.dispatch_head("echo", b"t", b"")
    with pytest.raises(ValueError, match="seq_from"):
        lane.seq_from(-1)
    with pytest.raises(TypeError, match="ticket must be bytes"):
        lane.adopt("t")
    with pytest.raises(ValueError, match="NaN"):
        lane.adopt_due(float("nan"))
    lane.note(FRONT, b"x", 0, 0.0, 0.0, majordomo=6, client_id=b"id", open=False)  # keywords


# ---- step 2: the lane's own queue, one numbering, exact counts ------------------------------


def _queueing(net: Net, *, max_queued: int = MAX_QUEUED, may_queue: bool = True) -> None:
    net.lane.serve(True, TIMEOUT_S, 10, PREFIX, max_queued, may_queue)


def queue_up(
    net: Net, client: Peer, body: tuple[bytes, ...] = (b"hi",), service: str = "echo"
) -> None:
    """A REQUEST the lane must queue: nothing reaches the pipe, the queue grows by one."""
    before = net.lane.waiting(service)
    assert net.send(client, request(service, body, client.reading), FRONT) == []
    assert net.lane.waiting(service) == before + 1


def busy_worker(net: Net, rid: bytes, client: Peer, **kw: Any) -> tuple[Peer, bytes]:
    """A capacity-1 worker kept busy by one of ``client``'s requests: (worker, its ticket)."""
    worker = net.worker(rid, **kw)
    return worker, net.dispatch(client, worker, service=kw.get("service", "echo"))


def test_a_request_with_no_ready_worker_queues_only_if_may_queue(net: Net) -> None:
    client = net.client(b"c1")
    busy_worker(net, b"w1", client)
    assert net.lane.drain()[3] == ["echo"]  # (a dispatch marks its service changed)
    net.ask(client)  # may_queue False (a peer in the family): Python's
    _queueing(net)
    queue_up(net, client)
    assert net.lane.waiting_total() == 1 and net.lane.in_flight() == 1
    stats = net.lane.stats()
    assert stats["queued"] == 1 and stats["waiting"] == 1 and stats["requests"] == 2
    assert net.lane.drain() == (1, 0, [], [], 0, 0)  # (queueing: a request taken, nothing changed)


def test_a_service_nobody_offers_is_not_queued(net: Net) -> None:
    _queueing(net)
    client = net.client(b"c1")
    net.ask(client, service="nobody")
    net.worker(b"w1", service="nobody")  # (offered: the next one queues... once busy)
    with locked(net.lane):
        assert net.pool.take("nobody") == b"w1"
    queue_up(net, client, service="nobody")


def test_python_s_waiting_and_the_lane_s_count_together_against_max_queued(net: Net) -> None:
    client = net.client(b"c1")
    busy_worker(net, b"w1", client)
    _queueing(net, max_queued=3)
    net.lane.python_waits("echo", 2)
    queue_up(net, client)  # 2 + 0 < 3
    net.ask(client)  # 2 + 1 = 3: Python 503s it
    net.lane.python_waits("echo", 1)
    queue_up(net, client)  # 1 + 1 < 3
    net.ask(client)  # 1 + 2 = 3
    net.lane.python_waits("echo", 0)
    queue_up(net, client)  # 0 + 2 < 3
    net.ask(client)  # 0 + 3 = 3


def test_a_ready_worker_is_not_taken_while_python_has_one_waiting(net: Net) -> None:
    worker = net.worker(b"w1")
    client = net.client(b"c1")
    _queueing(net)
    net.lane.python_waits("echo", 2)
    net.ask(client)  # Python's waiting go first: the ready worker is Python's to give
    assert net.lane.waiting("echo") == 0
    net.lane.python_waits("echo", 0)
    net.dispatch(client, worker)


def test_a_worker_whose_ready_lowered_its_capacity_gets_no_head(net: Net) -> None:
    """A worker of capacity 2 runs two of the lane's requests and a third waits in the lane's
    queue; a READY lowers its capacity to 1. Its first REPLY is answered by the lane, but the
    worker, full even once that one is out (1 held, capacity 1), is given no head: the head
    still waits, and the pool lists the worker in no queue (Python's worker_free decides the
    same). Its second REPLY frees a slot: now it gets the head."""
    _queueing(net)
    c1 = net.client(b"c1")
    worker = net.worker(b"w1", capacity=2)
    first = net.dispatch(c1, worker, (b"one",))
    second = net.dispatch(c1, worker, (b"two",))
    queue_up(net, c1, (b"three",))
    with locked(net.lane):
        net.pool.add(b"w1", ("echo",), 1)  # the READY (Python's) that lowers the capacity
        assert net.pool.spare(b"w1") == -1
    net.answered(worker, c1, first)
    assert worker.dealer.poll(200) == 0  # no head for a full worker
    assert net.lane.waiting("echo") == 1 and net.lane.in_flight() == 1
    with locked(net.lane):
        assert net.pool.queue("echo") == [] and net.pool.tickets(b"w1") == [second]
    net.answered(worker, c1, second)
    got = recv(worker.dealer)
    assert got[-1] == b"three" and net.lane.waiting("echo") == 0


def test_a_reply_gives_the_worker_the_head_of_the_queue(net: Net) -> None:
    _queueing(net)
    c1, c2, c3 = net.client(b"c1"), net.client(b"c2", CLIENT_READINGS[4]), net.client(b"c3")
    worker, first = busy_worker(net, b"w1", c1, reading=WORKER_READINGS[2])  # seq 1, ticket 2
    assert first == ticket_of(2)
    queue_up(net, c2, (b"two",))  # seq 3
    queue_up(net, c3, (b"three",))  # seq 4
    net.answered(worker, c1, first)
    got = recv(worker.dealer)  # at once, to the worker that replied, c2's first: ticket 5
    assert (
        got
        == MdpWorkerRequest(ticket_of(5), (b"two",), protocol=MDPW02, delimited=False).to_frames()
    )
    assert net.lane.waiting("echo") == 1 and net.lane.in_flight() == 1
    with locked(net.lane):
        assert net.pool.tickets(b"w1") == [ticket_of(5)] and net.pool.queue("echo") == []
    assert net.lane.drain()[3] == ["echo"]
    net.answered(worker, c2, ticket_of(5))
    assert recv(worker.dealer)[2] == ticket_of(6)
    net.answered(worker, c3, ticket_of(6))
    assert net.lane.next_seq() == 7  # (nothing else took a number)
    with locked(net.lane):  # the queue empty: the worker ready again
        assert net.pool.tickets(b"w1") == [] and net.pool.queue("echo") == [b"w1"]


def test_the_reply_rule_reads_the_worker_s_services_now(net: Net) -> None:
    _queueing(net)
    c1, c2 = net.client(b"c1"), net.client(b"c2")
    worker, first = busy_worker(net, b"w1", c1)  # seq 1, ticket 2
    busy_worker(net, b"w2", c2, service="other")  # (offers "other", busy; seq 3, ticket 4)
    queue_up(net, c2, (b"for other",), service="other")  # seq 5
    with locked(net.lane):  # w1's READY while busy: now it serves "other" (its ticket kept)
        net.pool.add(b"w1", ("other",), 1)
    net.lane.python_waits("other", 1)  # Python's "other" go first: its to give
    net.passed_reply(worker, net.reply_frames(worker, first))
    assert net.lane.in_flight() == 2  # (passed: nothing changed, no number taken)
    net.lane.python_waits("other", 0)
    net.lane.python_waits("echo", 1)  # w1 serves "echo" no more: no matter
    net.answered(worker, c1, first)
    got = recv(worker.dealer)
    assert got == MdpWorkerRequest(ticket_of(6), (b"for other",)).to_frames()
    assert net.lane.waiting("other") == 0


def test_a_worker_that_speaks_no_majordomo_now_gets_no_head(net: Net) -> None:
    _queueing(net)
    c1 = net.client(b"c1")
    worker, first = busy_worker(net, b"w1", c1)  # seq 1, ticket 2
    queue_up(net, c1)  # seq 3
    net.lane.note(BACK, b"w1", 0, 0.0, time.monotonic(), 1)  # (True: no reading to write in)
    net.passed_reply(worker, net.reply_frames(worker, first))  # (passed: no number taken)
    net.lane.note(BACK, b"w1", 0, 0.0, time.monotonic(), pack(worker.reading))
    net.answered(worker, c1, first)
    assert recv(worker.dealer)[3] == ticket_of(4)


def test_waiting_head_and_dispatch_head(net: Net) -> None:
    _queueing(net)
    client = net.client(b"c1")
    busy_worker(net, b"w1", client)  # seq 1, ticket 2
    assert net.lane.waiting_head("echo") is None
    queue_up(net, client, (b"a",))  # seq 3
    queue_up(net, client, (b"b",))  # seq 4
    head = net.lane.waiting_head("echo")
    assert head is not None and head[:2] == (b"", b"") and head[6] == (b"a",)
    assert net.lane.waiting("echo") == 2  # (not removed)
    w2 = net.worker(b"w2")
    with locked(net.lane):  # Python frees w2 and takes it for the lane's head
        assert net.pool.take("echo") == b"w2"
        net.pool.hold(b"w2", b"py-7")
        net.lane.dispatch_head("echo", b"py-7", b"w2")  # (Python's ticket: no number taken)
    assert net.lane.waiting("echo") == 1 and net.lane.in_flight() == 2
    assert net.lane.stats()["lent"] == 1
    assert net.lane.waiting_head("echo")[6] == (b"b",)  # type: ignore[index]
    net.answered(w2, client, b"py-7")  # the lane's to answer: w2 then gets the next head
    assert recv(w2.dealer)[3] == ticket_of(5)
    with locked(net.lane):
        assert net.pool.tickets(b"w2") == [ticket_of(5)]
    with pytest.raises(KeyError):
        net.lane.dispatch_head("echo", b"py-8", b"w2")
    queue_up(net, client, (b"c",))  # seq 6
    with pytest.raises(ValueError, match="already one of the lane's"):
        net.lane.dispatch_head("echo", ticket_of(5), b"w2")
    assert net.lane.waiting("echo") == 1  # (refused: nothing changed)


def test_adopting_waiting_records_in_order(net: Net) -> None:
    _queueing(net)
    client = net.client(b"c1")
    busy_worker(net, b"w1", client)  # seq 1, its ticket 2
    for body in (b"a", b"b", b"c"):
        queue_up(net, client, (body,))
    with locked(net.lane):
        first = net.lane.adopt_next_waiting("echo")
        rest = net.lane.adopt_waiting("echo")
        assert net.lane.adopt_next_waiting("echo") is None and net.lane.adopt_waiting("echo") == []
    assert first is not None and first[6] == (b"a",) and first[:2] == (b"", b"")
    assert [r[6] for r in rest] == [(b"b",), (b"c",)]
    assert [first[10]] + [r[10] for r in rest] == [3, 4, 5]
    assert net.lane.waiting_total() == 0 and net.lane.held(b"b.c1") == 1
    assert net.lane.stats()["handed"] == 3


def test_adopt_all_gives_in_flight_then_waiting_by_seq(net: Net) -> None:
    _queueing(net)
    client = net.client(b"c1")
    _w, t1 = busy_worker(net, b"w1", client)
    queue_up(net, client, (b"q1",))
    _w, t2 = busy_worker(net, b"w0", client)  # (a new ready worker: Python's to give the head,
    # the lane takes the next request for it: the queue is behind Python's, not a gate)
    queue_up(net, client, (b"q2",), service="echo")
    with locked(net.lane):
        records = net.lane.adopt_all()
    assert [r[0] for r in records[:2]] == sorted([t1, t2])
    assert [r[6] for r in records[2:]] == [(b"q1",), (b"q2",)]
    assert [r[10] for r in records[2:]] == sorted(r[10] for r in records[2:])


def test_adopt_due_takes_a_waiting_one_out_of_its_queue(net: Net) -> None:
    _queueing(net)
    client = net.client(b"c1")
    busy_worker(net, b"w1", client)
    net.lane.serve(True, 0.0, 10, PREFIX, MAX_QUEUED, True)
    queue_up(net, client)
    due = net.lane.next_due()
    assert due is not None
    with locked(net.lane):
        records = net.lane.adopt_due(due)
    assert [r[:2] for r in records] == [(b"", b"")]
    assert net.lane.waiting("echo") == 0 and net.lane.in_flight() == 1


def test_one_numbering_for_the_lane_and_python(net: Net) -> None:
    _queueing(net)
    client = net.client(b"c1")
    _w, ticket = busy_worker(net, b"w1", client)  # seq 1, and its ticket 2
    assert ticket == ticket_of(2)
    assert net.lane.next_seq() == 3  # Python's own
    queue_up(net, client)  # 4
    net.lane.seq_from(10)
    net.lane.seq_from(5)  # (only raises)
    queue_up(net, client)  # 11
    assert net.lane.next_seq() == 12
    with locked(net.lane):
        records = net.lane.adopt_all()
    assert [r[10] for r in records] == [1, 4, 11]
    assert [r[9] for r in records] == [b"mdp.L1", b"mdp.L2", b"mdp.L3"]


def test_python_s_and_the_lane_s_tickets_sort_in_issue_order_on_one_worker(net: Net) -> None:
    """One numbering: a real Core numbers its tickets from the lane's counter once it shares
    it (Core.share_seq, Core.next_ticket), so on one worker Python's tickets and the lane's
    (at take, and a freed worker's head) sort in the order they were issued, whoever issued
    them: the order R8 retries a lost worker's requests in."""
    network = NetworkConfig(family="f", config_version=0, brokers=())
    core = Core(
        "b1",
        network,
        None,
        state=BrokerState.ACTIVE,
        wanted=BrokerState.ACTIVE,
        boot_id=PREFIX,
        now=0.0,
    )
    worker = net.worker(b"w1", capacity=6)
    client = net.client(b"c1")
    issued: list[bytes] = []

    def python_dispatches() -> None:
        """The core frees and takes w1 for one of its own requests, under the lock."""
        with locked(net.lane):
            assert net.pool.take("echo") == b"w1"
            ticket = core.next_ticket()
            net.pool.hold(b"w1", ticket)
            net.pool.list_ready(b"w1")  # (room left: ready again)
        issued.append(ticket)

    python_dispatches()  # before the lane numbers: the core's own counter, 1
    core.share_seq(net.lane)  # the lane's counter from now on, past the core's numbers
    issued.append(net.dispatch(client, worker))  # the lane's: numbered 2, its ticket 3
    python_dispatches()  # 4
    assert core.next_seq() == 5  # a request the core numbers (not dispatched)
    issued.append(net.dispatch(client, worker))  # 6, ticket 7
    python_dispatches()  # 8
    issued.append(net.dispatch(client, worker))  # 9, ticket 10
    assert issued == [ticket_of(n) for n in (1, 3, 4, 7, 8, 10)]
    with locked(net.lane):
        assert sorted(net.pool.tickets(b"w1")) == issued and net.pool.spare(b"w1") == 0
    # full: the next request waits in the lane's queue; a REPLY to one of the lane's tickets
    # gives w1 that head under the next number
    _queueing(net)
    queue_up(net, client, (b"queued",))  # 11
    net.answered(worker, client, ticket_of(7))
    issued.remove(ticket_of(7))
    got = recv(worker.dealer)
    assert got == MdpWorkerRequest(ticket_of(12), (b"queued",)).to_frames()
    issued.append(ticket_of(12))
    with locked(net.lane):  # the core answers one of its own: the slot free, w1 ready
        assert net.pool.release(b"w1", ticket_of(4))
        net.pool.list_ready(b"w1")
    issued.remove(ticket_of(4))
    python_dispatches()  # 13: after the head's, though the core issues it
    assert issued[-1] == ticket_of(13)
    with locked(net.lane):
        assert sorted(net.pool.tickets(b"w1")) == issued


def test_note_sets_the_reading_the_client_spoke_last(net: Net) -> None:
    _queueing(net)
    c1, c2 = net.client(b"c1"), net.client(b"c2")
    worker, first = busy_worker(net, b"w1", c2)
    queue_up(net, c1)
    c1.reading = CLIENT_READINGS[3]  # majortomo's now: the answer in it
    net.note_client(b"c1", c1.reading)
    net.lane.note(FRONT, b"c1", 0, 0.0, time.monotonic(), 0)  # (S0P: 0 leaves the reading)
    net.lane.note(FRONT, b"c1", 0, 0.0, time.monotonic(), pack(c1.reading), client_id=b"b.c1")
    net.answered(worker, c2, first)
    second = recv(worker.dealer)[3]
    net.answered(worker, c1, second)


def test_open_by_connection_and_held_by_client_count_waiting_too(net: Net) -> None:
    _queueing(net)
    c1, c2 = net.client(b"c1"), net.client(b"c2")
    busy_worker(net, b"w1", c1)
    queue_up(net, c1)
    queue_up(net, c2)
    assert net.lane.open_by_connection() == {b"c1": 2, b"c2": 1}
    assert net.lane.held_by_client() == {b"b.c1": 2, b"b.c2": 1}
    assert net.lane.busy(b"c2") and net.lane.held(b"b.c2") == 1 and net.lane.in_flight() == 1


def test_the_cap_counts_python_s_and_the_lane_s_waiting(net: Net) -> None:
    net.lane.serve(True, TIMEOUT_S, 3, PREFIX, MAX_QUEUED, True)
    client = net.client(b"c1")
    busy_worker(net, b"w1", client)
    queue_up(net, client)
    net.lane.python_holds(b"b.c1", 1)
    net.ask(client)  # 2 + 1 = 3
    net.lane.python_holds(b"b.c1", 0)
    queue_up(net, client)  # 2 + 0 < 3


# ---- sequences --------------------------------------------------------------------------------


class LaneMachine(RuleBasedStateMachine):
    """Random sequences of requests, replies, gates, queueing and adoptions on real sockets,
    against a model of the take rules (tests/core/test_lane_requests.py's RequestLane, cut to
    what a socket shows): each message goes where the model says, and after every step the
    lane's counts, queues and the pool's tickets are the model's. The shared counter is
    tracked exactly: a request that reaches the numbering point (serving, its session open,
    under the cap) takes the next number, taken or not; each dispatch by the lane (at take, or
    a freed worker's head) the next; Python's own (next_seq, its tickets for dispatch_head as
    Core.next_ticket gives them) the next; seq_from only raises it."""

    SERVICES = ("echo", "other")

    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig()
        self.net = Net(self.rig, cap=2)
        self.cap = 2
        self.serving = True
        self.max_queued = 3
        self.may_queue = True
        self.net.lane.serve(True, TIMEOUT_S, self.cap, PREFIX, self.max_queued, True)
        self.waits: dict[str, int] = {}
        self.holds: dict[bytes, int] = {}
        self.workers = [
            self.net.worker(b"w0", WORKER_READINGS[0], "echo", 2),
            self.net.worker(b"w1", WORKER_READINGS[1], "echo", 1),
            self.net.worker(b"w2", WORKER_READINGS[2], "other", 1),
        ]
        self.service_of = {b"w0": "echo", b"w1": "echo", b"w2": "other"}
        self.clients = [self.net.client(b"c%d" % n, CLIENT_READINGS[n]) for n in range(5)]
        self.client_id = {c.rid: b"id-%d" % (n % 3) for n, c in enumerate(self.clients)}
        self.open = {c.rid: True for c in self.clients}
        for c in self.clients:
            self.net.note_client(c.rid, c.reading, client_id=self.client_id[c.rid])
        # The lane's in flight: ticket -> (worker, client, service, body)
        self.records: dict[bytes, tuple[Peer, Peer, str, tuple[bytes, ...]]] = {}
        # The lane's waiting, per service: (client, body), first in first out
        self.queues: dict[str, list[tuple[Peer, tuple[bytes, ...]]]] = {
            s: [] for s in self.SERVICES
        }
        self.python: dict[bytes, bytes] = {}  # adopted (Python's): ticket -> worker rid
        self.seq = 0  # the shared counter's last number given
        self.issue = itertools.count()
        self.issued: dict[bytes, int] = {}  # every ticket given -> the order it was issued in
        self.bodies = itertools.count()

    def teardown(self) -> None:
        self.rig.close()

    def mine(self) -> list[Peer]:
        """The client of every request the lane holds, in flight and waiting."""
        return [r[1] for r in self.records.values()] + [
            c for q in self.queues.values() for c, _b in q
        ]

    def held(self, cid: bytes) -> int:
        return sum(1 for c in self.mine() if self.client_id[c.rid] == cid)

    @initialize(busy=st.booleans())
    def start(self, busy: bool) -> None:
        """Half the runs start with every worker's slots taken and one request waiting per
        service, so a REPLY gives its worker the head (rare from random steps alone)."""
        if busy:
            for n, service in ((0, "echo"), (1, "echo"), (2, "echo"), (4, "other")):
                self.request(n, service)
            assert len(self.records) == 4 and self.seq == 8  # (each numbered, then its ticket)
            self.request(3, "echo")
            self.request(2, "other")
            assert [len(q) for q in self.queues.values()] == [1, 1] and self.seq == 10

    @rule(n=st.integers(0, 4), service=st.sampled_from(SERVICES))
    def request(self, n: int, service: str) -> None:
        client = self.clients[n]
        cid = self.client_id[client.rid]
        body = (b"body-%d" % next(self.bodies),)
        with locked(self.net.lane):
            ready = self.net.pool.queue(service)
            offered = self.net.pool.offered_count(service)
        if not (
            self.serving
            and self.open[client.rid]
            and self.held(cid) + self.holds.get(cid, 0) < self.cap
        ):
            self.net.ask(client, body, service=service)
            return
        self.seq += 1  # the numbering point: numbered, taken or not
        waits = self.waits.get(service, 0)
        if ready:
            if waits:
                self.net.ask(client, body, service=service)
                return
            worker = next(w for w in self.workers if w.rid == ready[0])
            ticket = self.net.dispatch(client, worker, body, service=service)
            self.seq += 1  # the dispatch's own number
            assert ticket == ticket_of(self.seq)
            self.issued[ticket] = next(self.issue)
            self.records[ticket] = (worker, client, service, body)
        elif self.may_queue and offered and waits + len(self.queues[service]) < self.max_queued:
            queue_up(self.net, client, body, service)
            self.queues[service].append((client, body))
        else:
            self.net.ask(client, body, service=service)

    @rule(data=st.data(), w=st.integers(0, 2))
    def reply(self, data: st.DataObject, w: int) -> None:
        known = sorted([*self.records, *self.python])
        ticket = data.draw(st.sampled_from([*known, ticket_of(2**64 - 1)]))  # (never given)
        self.reply_from(self.workers[w], ticket)

    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        """The worker of one of the lane's tickets answers it (reply's any worker rarely is)."""
        if self.records:
            ticket = data.draw(st.sampled_from(sorted(self.records)))
            self.reply_from(self.records[ticket][0], ticket)

    def reply_from(self, worker: Peer, ticket: bytes) -> None:
        record = self.records.get(ticket)
        service = self.service_of[worker.rid]
        queue = self.queues[service]
        if (
            record is not None
            and record[0] is worker
            and self.serving
            and not self.waits.get(service, 0)
        ):
            self.net.answered(worker, record[1], ticket, service=record[2])
            del self.records[ticket]
            if queue:  # the head of the worker's service's queue, to it at once
                client, body = queue.pop(0)
                self.seq += 1  # the dispatch's number
                expect = MdpWorkerRequest(
                    ticket_of(self.seq),
                    body,
                    protocol=worker.reading.protocol,
                    delimited=worker.reading.delimited,
                ).to_frames()
                assert recv(worker.dealer) == expect
                self.issued[ticket_of(self.seq)] = next(self.issue)
                self.records[ticket_of(self.seq)] = (worker, client, service, body)
            return
        self.net.passed_reply(worker, self.net.reply_frames(worker, ticket))
        if self.python.get(ticket) == worker.rid:  # Python answers its own: the slot is free
            del self.python[ticket]
            with locked(self.net.lane):
                assert self.net.pool.release(worker.rid, ticket)
                self.net.pool.list_ready(worker.rid)

    @rule(data=st.data())
    def adopt(self, data: st.DataObject) -> None:
        if not self.records:
            return
        ticket = data.draw(st.sampled_from(sorted(self.records)))
        worker, client, _service, body = self.records.pop(ticket)
        with locked(self.net.lane):
            record = self.net.lane.adopt(ticket)
        assert record is not None and record[:3] == (ticket, worker.rid, client.rid)
        assert record[6] == body
        self.python[ticket] = worker.rid

    @rule(service=st.sampled_from(SERVICES), every=st.booleans())
    def adopt_waiting(self, service: str, every: bool) -> None:
        queue = self.queues[service]
        with locked(self.net.lane):
            if every:
                got = self.net.lane.adopt_waiting(service)
            else:
                one = self.net.lane.adopt_next_waiting(service)
                got = [] if one is None else [one]
        expect = queue if every else queue[:1]
        assert [(r[:3], r[6]) for r in got] == [((b"", b"", c.rid), b) for c, b in expect]
        assert [r[10] for r in got] == sorted(r[10] for r in got)
        del queue[: len(expect)]

    @rule(service=st.sampled_from(SERVICES))
    def dispatch_head(self, service: str) -> None:
        """Python lends a ready worker to the lane's head (as the core does when it frees one)."""
        with locked(self.net.lane):
            ready = self.net.pool.queue(service)
            if not ready or not self.queues[service]:
                with pytest.raises(KeyError) if not self.queues[service] else _nothing():
                    if not self.queues[service]:
                        self.net.lane.dispatch_head(service, b"py-none", b"w0")
                return
            rid = self.net.pool.take(service)
            ticket = PREFIX + self.net.lane.next_seq().to_bytes(8, "big")  # (Core.next_ticket)
            self.seq += 1
            assert ticket == ticket_of(self.seq)
            self.issued[ticket] = next(self.issue)
            self.net.pool.hold(rid, ticket)
            self.net.lane.dispatch_head(service, ticket, rid)
        client, body = self.queues[service].pop(0)
        worker = next(w for w in self.workers if w.rid == rid)
        self.records[ticket] = (worker, client, service, body)

    @rule()
    def next_seq(self) -> None:
        """Python numbers one of its own requests (or a ticket it gives elsewhere)."""
        self.seq += 1
        assert self.net.lane.next_seq() == self.seq

    @rule(delta=st.integers(-2, 3))
    def seq_from(self, delta: int) -> None:
        """Python's counter handed over (Core.share_seq): only ever raises the lane's."""
        target = max(0, self.seq + delta)
        self.net.lane.seq_from(target)
        self.seq = max(self.seq, target)

    @rule(on=st.booleans(), may_queue=st.booleans(), max_queued=st.integers(0, 3))
    def serve(self, on: bool, may_queue: bool, max_queued: int) -> None:
        self.serving, self.may_queue, self.max_queued = on, may_queue, max_queued
        self.net.lane.serve(on, TIMEOUT_S, self.cap, PREFIX, max_queued, may_queue)

    @rule(service=st.sampled_from(SERVICES), count=st.integers(0, 2))
    def python_waits(self, service: str, count: int) -> None:
        self.net.lane.python_waits(service, count)
        self.waits[service] = count

    @rule(n=st.integers(0, 2), count=st.integers(0, 2))
    def python_holds(self, n: int, count: int) -> None:
        cid = b"id-%d" % n
        self.net.lane.python_holds(cid, count)
        self.holds[cid] = count

    @rule(n=st.integers(0, 4), on=st.booleans())
    def open_(self, n: int, on: bool) -> None:
        client = self.clients[n]
        self.open[client.rid] = on
        self.net.note_client(
            client.rid, client.reading, client_id=self.client_id[client.rid], open=on
        )

    @invariant()
    def counts_are_the_model_s(self) -> None:
        lane = self.net.lane
        assert lane.in_flight() == len(self.records)
        for service, queue in self.queues.items():
            assert lane.waiting(service) == len(queue)
        assert lane.waiting_total() == sum(map(len, self.queues.values()))
        for n in range(3):
            assert lane.held(b"id-%d" % n) == self.held(b"id-%d" % n)
        mine = self.mine()
        for c in self.clients:
            assert lane.busy(c.rid) == (c in mine)
        assert lane.open_by_connection() == {
            c.rid: mine.count(c) for c in self.clients if c in mine
        }
        by_id: dict[bytes, int] = {}
        for c in mine:
            by_id[self.client_id[c.rid]] = by_id.get(self.client_id[c.rid], 0) + 1
        assert lane.held_by_client() == by_id
        with locked(lane):
            for w in self.workers:
                lanes = [t for t, r in self.records.items() if r[0] is w]
                python = [t for t, rid in self.python.items() if rid == w.rid]
                assert self.net.pool.tickets(w.rid) == sorted(lanes + python)
                # one numbering: byte order is issue order, whoever issued them
                assert sorted(lanes + python) == sorted(lanes + python, key=self.issued.__getitem__)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def test_random_sequences_keep_the_lane_and_its_model_equal() -> None:
    run_state_machine_as_test(
        LaneMachine,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None),
    )


DROPPED_INSIDE_LOCK = """
import sys, time, zmq
from tests.net.test_lane import BACK, Rig
from scale0.core._pool import Pool
rig = Rig()
pool = Pool()
rig.lane.attach_pool(pool)
dealer, _fd = rig.dealer(BACK, b"w")
rig.lane.lock()
rig.lane.lock()
dealer.send(b"read while Python holds the lock")
deadline = time.monotonic() + 10.0
while rig.lane.stats()["received"] == 0 and time.monotonic() < deadline:
    time.sleep(0.01)  # (stats need no lock: the thread now waits for it)
assert rig.lane.stats()["received"] == 1
lane, rig.lane = rig.lane, None
del lane  # dealloc: joins the thread, which waits for this thread's lock
assert pool.worker_count() == 0  # (the guard went with the lane)
print("freed")
"""


def test_a_lane_dropped_inside_lock_is_freed_without_a_deadlock() -> None:
    """In a process of its own, bounded: a deadlock shows as a timeout, not a hung suite."""
    done = subprocess.run(
        [sys.executable, "-c", DROPPED_INSIDE_LOCK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "freed"
