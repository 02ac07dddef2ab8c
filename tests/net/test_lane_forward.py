"""The C lane's peer ROUTER (issue 14, phase 4a): channel 2, and FORWARDs served in C.

Real sockets on 127.0.0.1: the frontend, backend and peer ROUTERs of one lane, a real
scale0.core._pool.Pool shared with it, a DEALER playing a peer broker's link (its routing id
set) and S0P worker DEALERs (with and without ids). Every frame a peer sends is built by
scale0.wire's classes (or written out where the test is about the exact bytes) and every frame
the lane sends is compared byte for byte with what they write. Each take condition is shown
both ways: spoiled, the FORWARD reaches Python's pipe intact (and the lane queues nothing);
restored, the lane takes the same FORWARD.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from zmq.auth.thread import ThreadAuthenticator

from scale0.wire.peer import Forward, ForwardReply
from scale0.wire.worker import WorkerIdRequest, WorkerReply, WorkerRequest
from tests.net.test_lane import BACK, FRONT, MAX_FRAME, Lane, Rig, header, recv
from tests.net.test_lane_requests import (
    ALL_DONE,
    MAX_QUEUED,
    PREFIX,
    TIMEOUT_S,
    Peer,
    Pool,
    locked,
    ticket_of,
)
from tests.net.test_lane_s0p import S0P_READING

pytestmark = pytest.mark.skipif(
    Lane is None or Pool is None, reason="scale0.net._zmqio or scale0.core._pool not built here"
)

PEER = 2  # the lane's channel of the peer ROUTER
BROKER = b"broker-b"  # the peer broker's id, noted as its link's client_id
LINK = b"link-b"  # the routing id of its link DEALER on our peer ROUTER
ORIGIN = "broker-b"  # the FORWARD's origin_broker


class PeerRig(Rig):
    """Rig's two ROUTERs and pipes, plus the peer ROUTER and its pipe: a lane of three channels."""

    def __init__(
        self,
        *,
        keyed_peer: bool = False,
        hwm: int | None = None,
        keyed_front: bool = False,
        curve: tuple[bytes, bytes] | None = None,
    ) -> None:
        super().__init__(start=False, hwm=hwm, keyed_front=keyed_front, curve=curve)
        self.peer_curve: tuple[bytes, bytes] | None = None
        router = self.ctx.socket(zmq.ROUTER)
        router.linger = 0
        if hwm is not None:
            router.rcvhwm = hwm
        if keyed_peer:
            self.auth = ThreadAuthenticator(self.ctx)
            self.auth.start()
            self.auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
            self.peer_curve = zmq.curve_keypair()
            router.curve_server = True
            router.curve_publickey, router.curve_secretkey = self.peer_curve
        self.monitors.append(router.get_monitor_socket(zmq.EVENT_ACCEPTED))
        router.bind("tcp://127.0.0.1:*")
        self.endpoints.append(router.getsockopt(zmq.LAST_ENDPOINT).decode())
        self.routers.append(router)
        ours = self.ctx.socket(zmq.PAIR)
        theirs = self.ctx.socket(zmq.PAIR)
        for sock in (ours, theirs):
            sock.linger = 0
            if hwm is not None:
                sock.sndhwm = sock.rcvhwm = hwm
        endpoint = f"inproc://lane-{id(self)}-{PEER}"
        ours.bind(endpoint)
        theirs.connect(endpoint)
        self.pipes.append(ours)
        self.lane_pipes.append(theirs)
        assert Lane is not None
        self.lane.stop()  # (the two-channel lane Rig made, never started)
        self.lane = Lane(
            self.routers[0].underlying,
            self.routers[1].underlying,
            self.lane_pipes[0].underlying,
            self.lane_pipes[1].underlying,
            False,
            False,
            MAX_FRAME,
            peer=router.underlying,
            peer_pipe=theirs.underlying,
            keyed_peer=keyed_peer,
        )
        self.lane.start()

    def link(self, rid: bytes) -> tuple[zmq.Socket[Any], int, bytes]:
        """A peer's link DEALER on the peer ROUTER: (it, its fd there, its CURVE key or b"")."""
        if self.peer_curve is None:
            dealer, fd = self.dealer(PEER, rid)
            return dealer, fd, b""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.setsockopt(zmq.ROUTING_ID, rid)
        public, secret = zmq.curve_keypair()
        dealer.curve_serverkey = self.peer_curve[0]
        dealer.curve_publickey, dealer.curve_secretkey = public, secret
        dealer.connect(self.endpoints[PEER])
        self.dealers.append(dealer)
        monitor = self.monitors[PEER]
        assert monitor.poll(10_000), "no connection accepted"
        event = zmq.utils.monitor.recv_monitor_message(monitor)
        return dealer, int(event["value"]), public


class Fwd:
    """A started three-channel lane serving from a shared pool, with its peers."""

    def __init__(self, rig: PeerRig) -> None:
        self.rig = rig
        self.lane = rig.lane
        self.pool = Pool()
        self.lane.attach_pool(self.pool)
        self.serve()
        self.lane.serve_forwards(True)
        self.markers = itertools.count()

    def serve(self, on: bool = True, may_queue: bool = False) -> None:
        self.lane.serve(on, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, may_queue)

    def worker(
        self,
        rid: bytes = b"w1",
        service: str = "echo",
        ids: bool = False,
        majordomo: int = 0,
        promise_ms: int = 0,
    ) -> Peer:
        dealer, fd = self.rig.dealer(BACK, rid)
        dealer.send(b"hello")  # through the lane to Python: the ROUTER knows it now
        assert self.rig.from_pipe(BACK) == [header(fd), rid, b"hello"]
        self.lane.negotiated(BACK, fd)
        self.lane.note(BACK, rid, promise_ms, 0.0, time.monotonic(), majordomo)
        with locked(self.lane):
            self.pool.add(rid, (service,), 1, ids)
            self.pool.list_ready(rid)
        return Peer(dealer, rid, fd, S0P_READING)

    def link(self, rid: bytes = LINK, broker: bytes = BROKER, open: bool = True) -> Peer:
        dealer, fd, key = self.rig.link(rid)
        self.lane.note(PEER, rid, 0, 0.0, time.monotonic(), client_id=broker, open=open)
        return Peer(dealer, rid, fd, S0P_READING, key)

    def send(self, peer: Peer, frames: list[bytes], channel: int) -> list[list[bytes]]:
        """Send ``frames`` then a marker: what reached the pipe before the marker."""
        marker = b"marker-%d" % next(self.markers)
        peer.dealer.send_multipart(frames)
        peer.dealer.send(marker)
        got = self.rig.until_marker(channel, marker)
        assert got[-1] == [header(peer.fd, peer.key), peer.rid, marker]
        return got[:-1]

    def ready(self, w: Peer) -> None:
        with locked(self.lane):
            self.pool.list_ready(w.rid)

    def passed(self, link: Peer, frames: list[bytes]) -> None:
        """A FORWARD (or anything) the lane must pass: it reaches the peer pipe intact."""
        before = self.lane.stats()["forwards"]
        got = self.send(link, frames, PEER)
        assert got == [[header(link.fd, link.key), link.rid, *frames]]
        assert self.lane.stats()["forwards"] == before
        assert self.lane.waiting_total() == 0  # (nor queued)

    def taken(self, link: Peer, frames: list[bytes]) -> None:
        before = self.lane.stats()["forwards"]
        assert self.send(link, frames, PEER) == []
        assert self.lane.stats()["forwards"] == before + 1

    def served(
        self,
        link: Peer,
        worker: Peer,
        frames: list[bytes],
        body: tuple[bytes, ...] = (b"hi",),
        service: str = "echo",
        ids: tuple[str, bytes] | None = None,
    ) -> bytes:
        """A FORWARD the lane must take: the worker gets exactly WorkerRequest, or with ``ids``
        (client_id, request_id) WorkerIdRequest; its ticket."""
        self.taken(link, frames)
        got = recv(worker.dealer)
        ticket = got[3]
        expect: Any = (
            WorkerIdRequest(ticket, service, ids[0], ids[1], body)
            if ids is not None
            else WorkerRequest(ticket, service, body)
        )
        assert got == expect.to_frames()
        return ticket

    def answered(
        self,
        worker: Peer,
        link: Peer,
        ticket: bytes,
        origin: bytes,
        status: int = 200,
        body: tuple[bytes, ...] = (b"done",),
    ) -> None:
        """The worker's final REPLY the lane must take: the link gets exactly ForwardReply."""
        assert self.send(worker, WorkerReply(ticket, status, body).to_frames(), BACK) == []
        assert recv(link.dealer) == ForwardReply(origin, status, body).to_frames()


def forward(
    ticket: bytes,
    body: tuple[bytes, ...] = (b"hi",),
    service: str = "echo",
    **kw: Any,
) -> list[bytes]:
    return Forward(ticket, service, ORIGIN, body, **kw).to_frames()


def forward_with(ticket: bytes, options: bytes, body: tuple[bytes, ...] = (b"hi",)) -> list[bytes]:
    """FORWARDWITH with these exact options bytes."""
    return [b"", b"S0B1", b"FORWARDWITH", ticket, b"echo", ORIGIN.encode(), options, *body]


@pytest.fixture
def rig() -> Iterator[PeerRig]:
    r = PeerRig()
    try:
        yield r
    finally:
        r.close()  # (Rig.close lets go of a lock a failed test left held)


@pytest.fixture
def fwd(rig: PeerRig) -> Fwd:
    return Fwd(rig)


def balanced(stats: dict[str, int]) -> bool:
    return stats["received"] == (
        stats["beats"] + stats["requests"] + stats["replies"] + stats["passed"] + stats["lost"]
    )


# ---- a plain FORWARD and its FORWARDREPLY ------------------------------------------------------


def test_a_plain_forward_is_served_and_answered_with_forwardreply(fwd: Fwd) -> None:
    lane = fwd.lane
    worker = fwd.worker()
    link = fwd.link()
    body = (b"a", b"", b"c" * 3000)
    before = time.monotonic()
    ticket = fwd.served(link, worker, forward(b"t-1", body), body)
    assert ticket == ticket_of(2)  # (the request is numbered 1, its dispatch 2)
    assert lane.in_flight() == 1
    with locked(lane):
        assert fwd.pool.tickets(b"w1") == [ticket]
    # in no client's count (by client_id or routing id), but open by its link's routing id
    # (as the ledger counts every request by the routing id it answers), held from its peer
    assert lane.held(b"\x00" + BROKER) == 0 and not lane.busy(LINK)
    assert lane.held_by_client() == {} and lane.open_by_connection() == {LINK: 1}
    assert lane.held_from(BROKER.decode()) == {"echo": 1} and lane.held_from("b9") == {}
    with pytest.raises(TypeError, match="via must be str"):
        lane.held_from(BROKER)  # type: ignore[arg-type]
    [(channel, rid, seen)] = lane.heard()
    assert (channel, rid) == (PEER, LINK) and before <= seen <= time.monotonic()
    assert lane.last_seen(PEER, LINK) == seen
    answer = (b"answer", b"", b"y" * 60000)
    fwd.answered(worker, link, ticket, b"t-1", 203, answer)
    assert lane.in_flight() == 0
    with locked(lane):
        assert fwd.pool.tickets(b"w1") == [] and fwd.pool.queue("echo") == [b"w1"]
    assert lane.cache_count() == 0  # without ids nothing is cached
    requests, replies, histograms, changed, forwards, _forwarded = lane.drain()
    assert (requests, replies, changed, forwards) == (1, 1, ["echo"], 1)
    [(service, status, counts, sum_s)] = histograms
    assert (service, status, sum(counts)) == ("echo", 203, 1)
    assert 0.0 <= sum_s <= time.monotonic() - before
    assert lane.drain() == (0, 0, [], [], 0, 0)
    lane.stop()
    stats = lane.stats()
    assert (stats["requests"], stats["replies"], stats["forwards"], stats["cached"]) == (1, 1, 1, 0)
    assert balanced(stats)


def test_a_worker_that_asked_for_ids_gets_idrequest_with_both_ids_empty(fwd: Fwd) -> None:
    worker = fwd.worker(ids=True)
    link = fwd.link()
    fwd.taken(link, forward(b"t-1", (b"x", b"")))
    got = recv(worker.dealer)
    # dispatch_to: own = origin is None or ids; a forward without ids has neither to give
    assert got == [b"", b"S0W1", b"IDREQUEST", got[3], b"echo", b"", b"", b"x", b""]
    assert got == WorkerIdRequest(got[3], "echo", "", b"", (b"x", b"")).to_frames()
    fwd.answered(worker, link, got[3], b"t-1")


@pytest.mark.parametrize("worker_ids", [False, True], ids=["REQUEST", "IDREQUEST"])
def test_forwardwith_ids_is_served_cached_and_answered(fwd: Fwd, worker_ids: bool) -> None:
    lane = fwd.lane
    worker = fwd.worker(ids=worker_ids)
    link = fwd.link()
    rq = bytes(range(256))[:200]
    frames = forward(b"t-9", (b"q",), client_id="carol c", request_id=rq, deadline_ms=5000)
    assert frames[6] == b'{"deadline_ms":5000,"client_id":"carol c","request_id":"%s"}' % (
        rq.hex().encode()
    )
    ids = ("carol c", rq) if worker_ids else None
    ticket = fwd.served(link, worker, frames, (b"q",), ids=ids)
    assert lane.held(b"carol c") == 0 and lane.held_by_client() == {}
    fwd.answered(worker, link, ticket, b"t-9", 201, (b"r1", b"r2"))
    assert lane.cache_get(b"carol c", rq, time.monotonic()) == ("echo", 201, (b"r1", b"r2"))
    assert lane.stats()["cached"] == 1
    # the key is answered: the same FORWARD again is Python's (it answers from the cache)
    fwd.passed(link, frames)


def test_forwardwith_a_deadline_only_is_served_and_not_cached(fwd: Fwd) -> None:
    worker = fwd.worker(ids=True)
    link = fwd.link()
    frames = forward(b"t-2", deadline_ms=1)
    assert frames[6] == b'{"deadline_ms":1}'
    fwd.taken(link, frames)
    got = recv(worker.dealer)
    assert got == WorkerIdRequest(got[3], "echo", "", b"", (b"hi",)).to_frames()
    fwd.answered(worker, link, got[3], b"t-2")
    assert fwd.lane.cache_count() == 0


# ---- the record ---------------------------------------------------------------------------------


def test_the_record_of_a_plain_forward(fwd: Fwd) -> None:
    worker = fwd.worker()
    link = fwd.link()
    before = time.monotonic()
    ticket = fwd.served(link, worker, forward(b"t-1", (b"a", b"")), (b"a", b""))
    with locked(fwd.lane):
        record = fwd.lane.adopt(ticket)
        assert fwd.pool.tickets(b"w1") == [ticket]  # its slot stays held, under its ticket
    assert record is not None and len(record) == 16
    (t, wrid, crid, cid, caller, service, body, started, deadline) = record[:9]
    (request_id, seq, ids, origin, via, limit, peer) = record[9:]
    assert peer == ""  # (served here: not forwarded out)
    assert (t, wrid, crid, cid, caller, service, body) == (
        ticket,
        b"w1",
        LINK,
        b"\x00" + BROKER,
        "",
        "echo",
        (b"a", b""),
    )
    assert before <= started <= time.monotonic()
    assert deadline == started + TIMEOUT_S and limit == math.inf
    assert (request_id, seq, ids, origin, via) == (b"", 1, False, b"t-1", "broker-b")
    assert fwd.lane.stats()["handed"] == 1 and fwd.lane.in_flight() == 0
    # its REPLY is Python's now
    frames = WorkerReply(ticket, 200, (b"x",)).to_frames()
    assert fwd.send(worker, frames, BACK) == [[header(worker.fd), b"w1", *frames]]


@pytest.mark.parametrize("deadline_ms", [1, 1234, 45_000, 2**53])
def test_the_record_s_deadline_and_limit_are_forward_in_s_doubles(
    fwd: Fwd, deadline_ms: int
) -> None:
    worker = fwd.worker()
    link = fwd.link()
    rq = b"\x01\x02"
    frames = forward(b"t-1", client_id="c", request_id=rq, deadline_ms=deadline_ms)
    fwd.served(link, worker, frames)
    with locked(fwd.lane):
        assert fwd.lane.adopt_key(b"c", b"\x01") is None
        record = fwd.lane.adopt_key(b"c", rq)
        assert fwd.lane.adopt_key(b"c", rq) is None
    assert record is not None
    started, deadline, limit = record[7], record[8], record[14]
    # bit-equal to Forwarding.forward_in's: limit = now + ms / 1000, min(now + timeout, limit)
    assert limit == started + deadline_ms / 1000
    assert deadline == min(started + TIMEOUT_S, started + deadline_ms / 1000)
    assert record[3] == b"c" and record[9:14] == (rq, 1, True, b"t-1", "broker-b")


def test_adopt_all_hands_forwarded_and_local_records(fwd: Fwd) -> None:
    w1 = fwd.worker(b"w1")
    w2 = fwd.worker(b"w2")
    link = fwd.link()
    t1 = fwd.served(link, w1, forward(b"t-1"))
    t2 = fwd.served(link, w2, forward(b"t-2", client_id="c", request_id=b"k", deadline_ms=9))
    with locked(fwd.lane):
        records = fwd.lane.adopt_all()
    assert [r[0] for r in records] == sorted([t1, t2])
    by_ticket = {r[0]: r for r in records}
    assert by_ticket[t1][3] == b"\x00" + BROKER and by_ticket[t1][11:14] == (False, b"t-1", ORIGIN)
    assert by_ticket[t2][3] == b"c" and by_ticket[t2][9:14] == (b"k", 3, True, b"t-2", ORIGIN)
    assert fwd.lane.in_flight() == 0 and fwd.lane.stats()["handed"] == 2


# ---- FORWARDWITH's options: the exact forms taken, everything else passed ---------------------

TAKEN_OPTIONS = {
    "deadline only": b'{"deadline_ms":7}',
    "2**53": b'{"deadline_ms":9007199254740992}',
    "ids": b'{"deadline_ms":7,"client_id":"C","request_id":"00ff"}',
    "a space in the client_id": b'{"deadline_ms":7,"client_id":"a b~!","request_id":"ab"}',
    "255 bytes of client_id": b'{"deadline_ms":7,"client_id":"%s","request_id":"ab"}'
    % (b"x" * 255),
    "510 hex digits": b'{"deadline_ms":7,"client_id":"C","request_id":"%s"}' % (b"ab" * 255),
}

PASSED_OPTIONS = {
    "0": b'{"deadline_ms":0}',
    "a leading zero": b'{"deadline_ms":07}',
    "a sign": b'{"deadline_ms":+7}',
    "negative": b'{"deadline_ms":-7}',
    "a fraction": b'{"deadline_ms":7.0}',
    "an exponent": b'{"deadline_ms":7e3}',
    "2**53 + 1": b'{"deadline_ms":9007199254740993}',
    "17 digits": b'{"deadline_ms":10000000000000000}',
    "a string": b'{"deadline_ms":"7"}',
    "a caller": b'{"deadline_ms":7,"caller":"%s"}' % (b"k" * 40),
    "ids and a caller": b'{"deadline_ms":7,"client_id":"C","request_id":"ab","caller":"x"}',
    "a space": b'{"deadline_ms": 7}',
    "spaces": b'{"deadline_ms":7, "client_id":"C", "request_id":"ab"}',
    "a \\u escape": b'{"deadline_ms":7,"client_id":"\\u00e9","request_id":"ab"}',
    "an escaped quote": b'{"deadline_ms":7,"client_id":"a\\"b","request_id":"ab"}',
    "a raw non-ASCII byte": b'{"deadline_ms":7,"client_id":"\xc3\xa9","request_id":"ab"}',
    "a control byte": b'{"deadline_ms":7,"client_id":"a\tb","request_id":"ab"}',
    "odd hex": b'{"deadline_ms":7,"client_id":"C","request_id":"abc"}',
    "upper-case hex": b'{"deadline_ms":7,"client_id":"C","request_id":"AB"}',
    "not hex": b'{"deadline_ms":7,"client_id":"C","request_id":"zz"}',
    "empty request_id": b'{"deadline_ms":7,"client_id":"C","request_id":""}',
    "512 hex digits": b'{"deadline_ms":7,"client_id":"C","request_id":"%s"}' % (b"ab" * 256),
    "empty client_id": b'{"deadline_ms":7,"client_id":"","request_id":"ab"}',
    "256 bytes of client_id": b'{"deadline_ms":7,"client_id":"%s","request_id":"ab"}'
    % (b"x" * 256),
    "client_id alone": b'{"deadline_ms":7,"client_id":"C"}',
    "request_id alone": b'{"deadline_ms":7,"request_id":"ab"}',
    "another order": b'{"client_id":"C","request_id":"ab","deadline_ms":7}',
    "ids swapped": b'{"deadline_ms":7,"request_id":"ab","client_id":"C"}',
    "no deadline": b"{}",
    "empty": b"",
    "a trailing byte": b'{"deadline_ms":7} ',
    "a trailing comma": b'{"deadline_ms":7,}',
    "unterminated": b'{"deadline_ms":7',
    "null": b'{"deadline_ms":null}',
}


@pytest.mark.parametrize("options", TAKEN_OPTIONS.values(), ids=TAKEN_OPTIONS.keys())
def test_the_options_forms_the_lane_takes(fwd: Fwd, options: bytes) -> None:
    worker = fwd.worker()
    link = fwd.link()
    fwd.served(link, worker, forward_with(b"t-1", options))
    with locked(fwd.lane):
        record = fwd.lane.adopt_all()[0]
    opts = json.loads(options)
    assert record[14] == record[7] + opts["deadline_ms"] / 1000
    assert record[3] == (opts["client_id"].encode() if "client_id" in opts else b"\x00" + BROKER)
    assert record[9] == bytes.fromhex(opts.get("request_id", ""))


@pytest.mark.parametrize("options", PASSED_OPTIONS.values(), ids=PASSED_OPTIONS.keys())
def test_any_other_options_bytes_are_passed_intact(fwd: Fwd, options: bytes) -> None:
    worker = fwd.worker()
    link = fwd.link()
    fwd.passed(link, forward_with(b"t-1", options))
    assert fwd.lane.in_flight() == 0
    fwd.served(link, worker, forward_with(b"t-1", b'{"deadline_ms":7}'))  # (the good one: taken)


@pytest.mark.parametrize(
    "frames",
    [
        [b"", b"S0B1", b"FORWARDAS", b"t", b"echo", b"broker-b", b"k" * 40, b"hi"],
        [b"", b"S0B1", b"FORWARD", b"t", b"echo"],  # no origin
        [b"", b"S0B1", b"FORWARDWITH", b"t", b"echo", b"broker-b"],  # no options
        [b"", b"S0B1", b"FORWARD", b"", b"echo", b"broker-b", b"hi"],  # an empty ticket
        [b"", b"S0B1", b"FORWARD", b"t" * 256, b"echo", b"broker-b", b"hi"],
        [b"", b"S0B1", b"FORWARD", b"t", b"mmi.service", b"broker-b", b"hi"],  # reserved
        [b"", b"S0B1", b"FORWARD", b"t", b"scale0.status", b"broker-b", b"hi"],
        [b"", b"S0B1", b"FORWARD", b"t", b"ec\x01ho", b"broker-b", b"hi"],
        [b"", b"S0B1", b"FORWARD", b"t", b"", b"broker-b", b"hi"],
        [b"", b"S0B1", b"FORWARD", b"t", b"echo", b"", b"hi"],  # an empty origin
        [b"", b"S0B1", b"FORWARD", b"t", b"echo", b"o" * 256, b"hi"],
        [b"", b"S0B1", b"FORWARD", b"t", b"echo", b"br\xc3\xa9", b"hi"],  # non-ASCII origin
        [b"", b"S0B1", b"FORWARD", b"t", b"echo", b"br\x7fb", b"hi"],
        [b"", b"S0B1", b"FORWARD", b"t", b"echo", b"broker-b", b"x" * (MAX_FRAME + 1)],
        [b"S0B1", b"FORWARD", b"t", b"echo", b"broker-b", b"hi"],  # no empty frame
        [b"", b"S0B2", b"FORWARD", b"t", b"echo", b"broker-b", b"hi"],
        [b"", b"S0C1", b"FORWARD", b"t", b"echo", b"broker-b", b"hi"],
        [b"", b"S0B1", b"FORWARDREPLY", b"t", b"200", b"hi"],
        [b"", b"S0B1", b"HEARTBEAT", b'{"time":1.0,"config_version":1}'],  # never taken here
        [b"", b"S0B1", b"forward", b"t", b"echo", b"broker-b", b"hi"],
    ],
)
def test_what_is_not_exactly_a_forward_is_passed_intact(fwd: Fwd, frames: list[bytes]) -> None:
    fwd.lane.configure(0, 1e9)  # (beats could be taken elsewhere: never on the peer ROUTER)
    worker = fwd.worker()
    link = fwd.link()
    fwd.passed(link, frames)
    assert fwd.lane.in_flight() == 0 and fwd.lane.stats()["beats"] == 0
    fwd.served(link, worker, forward(b"t"))


# ---- each condition, both ways ------------------------------------------------------------------

Spoil = Callable[[Fwd, Peer, Peer], Callable[[], None]]


def _serve_forwards_off(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.serve_forwards(False)
    return lambda: f.lane.serve_forwards(True)


def _serve_off(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.serve(False)
    return f.serve


def _serve_off_and_on_keeps_serve_forwards(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.serve(False)
    return f.serve  # (serve_forwards stays on through serve's changes)


def _no_pool(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.attach_pool(None)
    return lambda: f.lane.attach_pool(f.pool)


def _closed(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.note(PEER, link.rid, 0, 0.0, 0.0, client_id=BROKER, open=False)
    return lambda: f.lane.note(PEER, link.rid, 0, 0.0, 0.0, client_id=BROKER)


def _unknown(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.forget(PEER, link.rid)
    return lambda: f.lane.note(PEER, link.rid, 0, 0.0, 0.0, client_id=BROKER)


def _python_waits(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.python_waits("echo", 1)
    return lambda: f.lane.python_waits("echo", 0)


def _no_ready_worker_and_r6_full(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    """None ready (busy), and as many wait in Python as R6 allows (the lane would queue a
    FORWARD with room: "a FORWARD no worker is ready for waits in the lane")."""
    with locked(f.lane):
        assert f.pool.take("echo") == w.rid
    f.lane.python_waits("echo", MAX_QUEUED)

    def restore() -> None:
        f.lane.python_waits("echo", 0)
        f.ready(w)

    return restore


def _no_worker_offers_it(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    """No worker of the service at all: Python's 404 (F7), never queued."""
    with locked(f.lane):
        assert f.pool.remove(w.rid) == []

    def restore() -> None:
        with locked(f.lane):
            f.pool.add(w.rid, ("echo",), 1, False)
            f.pool.list_ready(w.rid)

    return restore


def _worker_majordomo(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.note(BACK, w.rid, 0, 0.0, 0.0, 2 | 4)  # MDPW02, delimited
    return lambda: f.lane.note(BACK, w.rid, 0, 0.0, 0.0, 0)


def _worker_promise(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.note(BACK, w.rid, 5000, 0.0, 0.0, 0)
    return lambda: f.lane.note(BACK, w.rid, 0, 0.0, 0.0, 0)


def _worker_without_session(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    f.lane.forget(BACK, w.rid)
    return lambda: f.lane.note(BACK, w.rid, 0, 0.0, 0.0, 0)


def _order(f: Fwd, link: Peer, w: Peer) -> Callable[[], None]:
    pipe = f.rig.pipes[PEER]
    pipe.send(struct.pack("<Q", 0))
    link.dealer.send(b"python's")
    assert f.rig.from_pipe(PEER) == [header(link.fd), link.rid, b"python's"]
    return lambda: pipe.send(struct.pack("<Q", ALL_DONE))


SPOILS: dict[str, Spoil] = {
    "serve_forwards off": _serve_forwards_off,
    "serve off": _serve_off,
    "serve off and on": _serve_off_and_on_keeps_serve_forwards,
    "no pool attached": _no_pool,
    "peer closed": _closed,
    "peer unknown": _unknown,
    "python waits": _python_waits,
    "no ready worker, R6's cap": _no_ready_worker_and_r6_full,
    "no worker offers it": _no_worker_offers_it,
    "worker speaks Majordomo": _worker_majordomo,
    "worker promise": _worker_promise,
    "worker without session": _worker_without_session,
    "order": _order,
}


@pytest.mark.parametrize("with_ids", [False, True], ids=["FORWARD", "FORWARDWITH ids"])
@pytest.mark.parametrize("spoil", SPOILS.values(), ids=SPOILS.keys())
def test_each_forward_condition_both_ways(fwd: Fwd, spoil: Spoil, with_ids: bool) -> None:
    worker = fwd.worker()
    link = fwd.link()
    kw: dict[str, Any] = {"client_id": "c", "request_id": b"r", "deadline_ms": 60_000}
    frames = forward(b"t-1", **(kw if with_ids else {}))
    restore = spoil(fwd, link, worker)
    fwd.passed(link, frames)
    assert fwd.lane.in_flight() == 0 and fwd.lane.stats()["requests"] == 0
    restore()
    ticket = fwd.served(link, worker, frames)
    fwd.answered(worker, link, ticket, b"t-1")


def _python_key(f: Fwd) -> Callable[[], None]:
    f.lane.python_key(b"c", b"r", True)
    return lambda: f.lane.python_key(b"c", b"r", False)


def _cached(f: Fwd) -> Callable[[], None]:
    f.lane.cache_put(b"c", b"r", "echo", 200, (b"old",), time.monotonic() + 60)

    def restore() -> None:
        assert (b"c", b"r") in [entry[:2] for entry in f.lane.cache_take()]

    return restore


KEY_SPOILS: dict[str, Callable[[Fwd], Callable[[], None]]] = {
    "python's key": _python_key,
    "cached": _cached,
}


@pytest.mark.parametrize("spoil", KEY_SPOILS.values(), ids=KEY_SPOILS.keys())
def test_each_key_condition_both_ways(fwd: Fwd, spoil: Callable[[Fwd], Any]) -> None:
    worker = fwd.worker()
    link = fwd.link()
    frames = forward(b"t-1", client_id="c", request_id=b"r", deadline_ms=60_000)
    restore = spoil(fwd)
    fwd.passed(link, frames)
    # another key of the same client, or the same request_id of another client, is taken
    other = fwd.served(link, worker, forward(b"t-2", client_id="c", request_id=b"s", deadline_ms=9))
    fwd.answered(worker, link, other, b"t-2")
    other = fwd.served(link, worker, forward(b"t-3", client_id="d", request_id=b"r", deadline_ms=9))
    fwd.answered(worker, link, other, b"t-3")
    restore()
    ticket = fwd.served(link, worker, frames)
    fwd.answered(worker, link, ticket, b"t-1")


def test_an_expired_cache_entry_does_not_stop_it(fwd: Fwd) -> None:
    worker = fwd.worker()
    link = fwd.link()
    fwd.lane.cache_put(b"c", b"r", "echo", 200, (b"old",), time.monotonic() - 1.0)
    assert fwd.lane.cache_count() == 1
    frames = forward(b"t-1", client_id="c", request_id=b"r", deadline_ms=60_000)
    ticket = fwd.served(link, worker, frames)
    assert fwd.lane.cache_count() == 0  # (cache_get's rule: dropped)
    fwd.answered(worker, link, ticket, b"t-1")
    assert fwd.lane.cache_count() == 1


def test_a_key_the_lane_holds_is_passed_either_way(fwd: Fwd) -> None:
    """A forwarded record's key and a local S0P client's are one key space (R10)."""
    w1 = fwd.worker(b"w1")
    fwd.worker(b"w2")
    link = fwd.link()
    frames = forward(b"t-1", client_id="b.c1", request_id=b"r", deadline_ms=60_000)
    fwd.served(link, w1, frames)
    fwd.passed(link, forward(b"t-2", client_id="b.c1", request_id=b"r", deadline_ms=60_000))
    # a local S0P client with the same key: passed too (Python joins it)
    client, cfd = fwd.rig.dealer(FRONT, b"c1")
    fwd.lane.negotiated(FRONT, cfd)
    fwd.lane.note(FRONT, b"c1", 0, 0.0, time.monotonic(), 0, client_id=b"b.c1")
    frames_c = [b"", b"S0C1", b"REQUEST", b"echo", b"r", b"hi"]
    c = Peer(client, b"c1", cfd, S0P_READING)
    assert fwd.send(c, frames_c, FRONT) == [[header(cfd), b"c1", *frames_c]]
    with locked(fwd.lane):
        record = fwd.lane.adopt_key(b"b.c1", b"r")
    assert record is not None and record[12] == b"t-1"
    # and the reverse: a local S0P record's key makes a FORWARD of that key pass
    assert fwd.send(c, frames_c, FRONT) == []
    fwd.passed(link, forward(b"t-3", client_id="b.c1", request_id=b"r", deadline_ms=60_000))


def test_the_numbering_point(fwd: Fwd) -> None:
    """The request counter and seq give a FORWARD their numbers once it passed every check but
    the worker's (as an S0P REQUEST's): one passed for no ready worker takes one, one passed
    for a closed peer none."""
    worker = fwd.worker()
    link = fwd.link()
    _closed(fwd, link, worker)
    fwd.passed(link, forward(b"t-1"))
    _closed(fwd, link, worker)  # (still closed)
    fwd.lane.note(PEER, link.rid, 0, 0.0, 0.0, client_id=BROKER)
    fwd.lane.python_waits("echo", 1)
    fwd.passed(link, forward(b"t-2"))  # numbered 1
    fwd.lane.python_waits("echo", 0)
    ticket = fwd.served(link, worker, forward(b"t-3"))  # numbered 2, its ticket 3
    assert ticket == ticket_of(3)
    assert fwd.lane.next_seq() == 4


def test_with_record_done_on_a_forward_is_served_and_recorded_as_the_peers(fwd: Fwd) -> None:
    """The event log's record of a FORWARD the lane answered names the peer it came from (the
    node writes it with no client: scale0.core.records.request_done); one answered 404 or 503
    goes back to its origin, which routes it again and records it: answered, not recorded."""
    lane = fwd.lane
    worker = fwd.worker()
    link = fwd.link()
    lane.record_done(True)
    before = time.monotonic()
    ticket = fwd.served(link, worker, forward(b"t-1", body=(b"abc",)), (b"abc",))
    fwd.answered(worker, link, ticket, b"t-1", 201, (b"four",))
    [record] = lane.done_drain()
    service, wrid, crid, started, finished, size_in, size_out, status, via = record
    assert (service, wrid, crid, size_in, size_out, status) == ("echo", b"w1", LINK, 3, 4, 201)
    assert via == BROKER.decode() and before <= started <= finished <= time.monotonic()
    for refused in (503, 404, 200):
        ticket = fwd.served(link, worker, forward(b"t-%d" % refused))
        fwd.answered(worker, link, ticket, b"t-%d" % refused, refused)
    assert [(r[7], r[8]) for r in lane.done_drain()] == [(200, BROKER.decode())]
    stats = lane.stats()
    assert (stats["forwards"], stats["replies"], stats["done"]) == (4, 4, 2)


def test_a_partial_or_another_worker_s_reply_to_a_forwarded_record_is_passed(fwd: Fwd) -> None:
    worker = fwd.worker(b"w1")
    other = fwd.worker(b"w2", service="other")
    link = fwd.link()
    ticket = fwd.served(link, worker, forward(b"t-1"))
    for peer, frames in [
        (worker, [b"", b"S0W1", b"PARTIAL", ticket, b"part"]),
        (other, WorkerReply(ticket, 200, (b"x",)).to_frames()),
        (worker, [b"", b"MDPW02", b"\x04", ticket, b"", b"x"]),
    ]:
        assert fwd.send(peer, frames, BACK) == [[header(peer.fd), peer.rid, *frames]]
    assert fwd.lane.in_flight() == 1
    fwd.answered(worker, link, ticket, b"t-1")


def test_a_freed_worker_of_a_forward_gets_a_local_queue_s_head(fwd: Fwd) -> None:
    """A forwarded record's worker may be given the head of a client's lane queue."""
    lane = fwd.lane
    fwd.serve(True, may_queue=True)
    worker = fwd.worker()
    link = fwd.link()
    ticket = fwd.served(link, worker, forward(b"t-1"))
    client, cfd = fwd.rig.dealer(FRONT, b"c1")
    lane.negotiated(FRONT, cfd)
    lane.note(FRONT, b"c1", 0, 0.0, time.monotonic(), 0, client_id=b"b.c1")
    c = Peer(client, b"c1", cfd, S0P_READING)
    assert fwd.send(c, [b"", b"S0C1", b"REQUEST", b"echo", b"q1", b"x"], FRONT) == []
    assert lane.waiting_total() == 1
    fwd.answered(worker, link, ticket, b"t-1")
    got = recv(worker.dealer)
    assert got == WorkerRequest(got[3], "echo", (b"x",)).to_frames()
    assert lane.waiting_total() == 0 and lane.held(b"b.c1") == 1


def test_a_forward_no_worker_is_ready_for_waits_in_the_lane_and_goes_at_the_next_reply(
    fwd: Fwd,
) -> None:
    """F6: a FORWARD is never forwarded again, so the lane queues it in a family too
    (may_queue off): behind Python's queue, given to the worker its REPLY frees (IDREQUEST with
    the FORWARD's ids), answered FORWARDREPLY; one Python frees is lent as any head; held from
    its peer while it waits; R6's cap counts it."""
    lane = fwd.lane
    worker = fwd.worker(ids=True)
    link = fwd.link()
    first = fwd.served(link, worker, forward(b"t-1"), ids=("", b""))
    kw: dict[str, Any] = {"client_id": "c", "request_id": b"r2", "deadline_ms": 60_000}
    fwd.taken(link, forward(b"t-2", body=(b"two",), **kw))
    fwd.taken(link, forward(b"t-3", body=(b"three",)))
    assert lane.waiting_total() == 2 and lane.waiting("echo") == 2
    assert lane.held_from(BROKER.decode()) == {"echo": 3}
    assert lane.open_by_connection() == {LINK: 3} and lane.held_by_client() == {}
    head = lane.waiting_head("echo")
    assert head is not None and head[:2] == (b"", b"") and head[12] == b"t-2"
    assert (head[3], head[9], head[11]) == (b"c", b"r2", True)
    stats = lane.stats()
    assert (stats["forwards"], stats["queued"]) == (3, 2)
    # the worker's REPLY: FORWARDREPLY to the first, and the next head at once
    fwd.answered(worker, link, first, b"t-1")
    got = recv(worker.dealer)
    assert got == WorkerIdRequest(got[3], "echo", "c", b"r2", (b"two",)).to_frames()
    assert lane.waiting_total() == 1
    # Python frees it (say a READY raised its capacity): the head is lent, the lane's still
    with locked(lane):
        fwd.pool.hold(worker.rid, b"py-1")
        head = lane.waiting_head("echo")
        assert head is not None and head[12] == b"t-3"
        lane.dispatch_head("echo", b"py-1", worker.rid)
    assert lane.waiting_total() == 0 and lane.in_flight() == 2
    fwd.answered(worker, link, got[3], b"t-2")
    assert lane.cache_get(b"c", b"r2", time.monotonic()) == ("echo", 200, (b"done",))
    fwd.answered(worker, link, b"py-1", b"t-3")
    assert lane.in_flight() == 0 and lane.held_from(BROKER.decode()) == {}
    # R6: the lane's queue counts against max_queued with Python's
    with locked(lane):
        assert fwd.pool.take("echo") == worker.rid
    lane.python_waits("echo", MAX_QUEUED - 1)
    fwd.taken(link, forward(b"t-4"))
    before = lane.stats()["forwards"]  # (the next passed: 99 in Python and 1 in the lane)
    got_pipe = fwd.send(link, forward(b"t-5"), PEER)
    assert got_pipe == [[header(link.fd, link.key), link.rid, *forward(b"t-5")]]
    assert lane.stats()["forwards"] == before and lane.waiting("echo") == 1


def test_two_peers_and_their_broker_ids(fwd: Fwd) -> None:
    w1 = fwd.worker(b"w1")
    w2 = fwd.worker(b"w2")
    b = fwd.link(b"link-b", b"broker-b")
    c = fwd.link(b"link-c", "broker-\u00e7".encode())
    t1 = fwd.served(b, w1, forward(b"same"))
    t2 = fwd.served(c, w2, forward(b"same"))
    with locked(fwd.lane):
        r1, r2 = fwd.lane.adopt(t1), fwd.lane.adopt(t2)
    assert r1 is not None and r2 is not None
    assert (r1[2], r1[3], r1[13]) == (b"link-b", b"\x00broker-b", "broker-b")
    assert (r2[2], r2[3], r2[13]) == (b"link-c", "\x00broker-\u00e7".encode(), "broker-\u00e7")
    assert sorted(ch for ch, _, _ in fwd.lane.heard()) == [PEER, PEER]


# ---- channel 2 as a channel ----------------------------------------------------------------------


def test_pass_through_both_ways_on_the_peer_router(fwd: Fwd) -> None:
    link = fwd.link()
    link.dealer.send_multipart([b"", b"S0B1", b"HELLO", b"x"])
    assert fwd.rig.from_pipe(PEER) == [header(link.fd), LINK, b"", b"S0B1", b"HELLO", b"x"]
    fwd.rig.pipes[PEER].send_multipart([LINK, b"", b"S0B1", b"FORWARDREPLY", b"t", b"200"])
    assert recv(link.dealer) == [b"", b"S0B1", b"FORWARDREPLY", b"t", b"200"]
    before = fwd.lane.last_seen(PEER, LINK)
    assert before is not None
    link.dealer.send(b"seen")
    fwd.rig.from_pipe(PEER)
    seen = fwd.lane.last_seen(PEER, LINK)
    assert seen is not None and seen >= before
    assert fwd.lane.heard() == []  # (a passed message is not "heard": only a taken FORWARD)
    fwd.lane.negotiated(PEER, link.fd)  # accepted, no rule reads it
    fwd.lane.gone(PEER, link.fd)
    stats = fwd.lane.stats()
    assert (stats["passed"], stats["sent"]) == (2, 1)


def test_the_keyed_peer_router_s_header_carries_the_key() -> None:
    rig = PeerRig(keyed_peer=True)
    try:
        dealer, fd, public = rig.link(b"curvy")
        dealer.send_multipart([b"", b"S0B1", b"HELLO"])
        assert rig.from_pipe(PEER) == [header(fd, public), b"curvy", b"", b"S0B1", b"HELLO"]
    finally:
        rig.close()


def test_stop_forwards_what_the_peer_pipe_holds(rig: PeerRig) -> None:
    link, _ = rig.dealer(PEER, LINK)
    link.send(b"hello")
    rig.from_pipe(PEER)
    for i in range(50):
        rig.pipes[PEER].send_multipart([LINK, b"bye-%d" % i])
    rig.lane.stop()
    got = [recv(link) for _ in range(50)]
    assert got == [[b"bye-%d" % i] for i in range(50)]
    assert rig.lane.stats()["sent"] == 50 and balanced(rig.lane.stats())


def test_a_full_peer_pipe_stalls_the_peer_router_and_loses_nothing() -> None:
    rig = PeerRig(hwm=4)
    try:
        link, fd = rig.dealer(PEER, LINK)
        count = 400
        for n in range(count):
            link.send(b"%d" % n)
        deadline = time.monotonic() + 10.0
        while rig.lane.stats()["stalled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rig.lane.stats()["stalled"] > 0
        got = [rig.from_pipe(PEER) for _ in range(count)]
        assert got == [[header(fd), LINK, b"%d" % n] for n in range(count)]
        rig.lane.stop()
        stats = rig.lane.stats()
        assert stats["passed"] == stats["received"] == count and stats["lost"] == 0
    finally:
        rig.close()


def test_the_peer_channel_s_arguments(rig: PeerRig) -> None:
    lane = rig.lane
    with pytest.raises(ValueError, match=r"channel must be 0 \(frontend\), 1 \(backend\) or 2"):
        lane.note(3, b"x", 0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"a peer's client_id .* not 0 bytes"):
        lane.note(PEER, b"x", 0, 0.0, 0.0)
    with pytest.raises(ValueError, match="not 256 bytes"):
        lane.note(PEER, b"x", 0, 0.0, 0.0, client_id=b"b" * 256)
    with pytest.raises(ValueError, match="not UTF-8"):
        lane.note(PEER, b"x", 0, 0.0, 0.0, client_id=b"\xff")
    assert lane.last_seen(PEER, b"x") is None
    lane.note(PEER, b"x", 5, 1.0, 3.0, 7, client_id=b"b")  # promise, gap, majordomo: stored
    assert lane.last_seen(PEER, b"x") == 3.0
    lane.forget(PEER, b"x")
    assert lane.last_seen(PEER, b"x") is None
    with pytest.raises(TypeError):
        lane.serve_forwards()  # type: ignore[call-arg]


def test_without_a_peer_socket_channel_2_is_refused(rig: PeerRig) -> None:
    plain = Rig()
    try:
        for call in (
            lambda: plain.lane.note(PEER, b"x", 0, 0.0, 0.0, client_id=b"b"),
            lambda: plain.lane.forget(PEER, b"x"),
            lambda: plain.lane.last_seen(PEER, b"x"),
            lambda: plain.lane.negotiated(PEER, 5),
            lambda: plain.lane.gone(PEER, 5),
        ):
            with pytest.raises(ValueError, match="only for a lane made with peer and peer_pipe"):
                call()
        plain.lane.serve_forwards(True)  # (a gate with nothing to gate)
        assert plain.lane.drain() == (0, 0, [], [], 0, 0) and plain.lane.stats()["forwards"] == 0
    finally:
        plain.close()


def test_the_constructor_wants_peer_and_peer_pipe_together(rig: PeerRig) -> None:
    assert Lane is not None
    handles = [rig.routers[0].underlying, rig.routers[1].underlying]
    pipes = [rig.lane_pipes[0].underlying, rig.lane_pipes[1].underlying]
    args = (*handles, *pipes, False, False, MAX_FRAME)
    with pytest.raises(ValueError, match="peer given without peer_pipe"):
        Lane(*args, peer=rig.routers[2].underlying)
    with pytest.raises(ValueError, match="peer_pipe given without peer"):
        Lane(*args, peer_pipe=rig.lane_pipes[2].underlying)
    with pytest.raises(TypeError, match="peer must be a libzmq socket handle"):
        Lane(*args, peer="x", peer_pipe=rig.lane_pipes[2].underlying)
    with pytest.raises(TypeError, match="peer_pipe must be a libzmq socket handle"):
        Lane(*args, peer=rig.routers[2].underlying, peer_pipe=0)
    explicit = Lane(*args, peer=None, peer_pipe=None, keyed_peer=False)  # (as without them)
    with pytest.raises(ValueError, match="only for a lane made with peer"):
        explicit.last_seen(PEER, b"x")


def test_a_forwarded_record_leaves_a_local_client_s_counts_alone(fwd: Fwd) -> None:
    """The same client_id (and routing id) on the frontend: its counts are its own requests'."""
    lane = fwd.lane
    w1 = fwd.worker(b"w1")
    w2 = fwd.worker(b"w2")
    client, cfd = fwd.rig.dealer(FRONT, LINK)  # (a frontend client whose routing id is the link's)
    lane.negotiated(FRONT, cfd)
    lane.note(FRONT, LINK, 0, 0.0, time.monotonic(), 0, client_id=b"c")
    c = Peer(client, LINK, cfd, S0P_READING)
    assert fwd.send(c, [b"", b"S0C1", b"REQUEST", b"echo", b"mine", b"x"], FRONT) == []
    got = recv(w1.dealer)
    assert lane.held(b"c") == 1 and lane.busy(LINK)
    link = fwd.link()
    frames = forward(b"t-1", client_id="c", request_id=b"theirs", deadline_ms=60_000)
    ticket = fwd.served(link, w2, frames)
    # (the client's request and the link's forward, by the routing id they share)
    assert lane.held_by_client() == {b"c": 1} and lane.open_by_connection() == {LINK: 2}
    fwd.answered(w2, link, ticket, b"t-1")
    assert lane.held(b"c") == 1 and lane.busy(LINK)  # (untouched by the forward's answer)
    ticket = fwd.served(link, w2, forward(b"t-2"))
    with locked(lane):
        assert lane.adopt(ticket) is not None
    assert lane.held_by_client() == {b"c": 1} and lane.open_by_connection() == {LINK: 1}
    assert fwd.send(w1, WorkerReply(got[3], 200, (b"y",)).to_frames(), BACK) == []
    assert recv(client)[2] == b"REPLY"
    assert lane.held_by_client() == {} and lane.open_by_connection() == {}


def test_max_per_client_and_python_holds_do_not_apply_to_a_forward(fwd: Fwd) -> None:
    fwd.lane.serve(True, TIMEOUT_S, 0, PREFIX, MAX_QUEUED, False)  # max_per_client 0
    fwd.lane.python_holds(b"c", 5)
    fwd.lane.python_holds(b"\x00" + BROKER, 5)
    worker = fwd.worker()
    link = fwd.link()
    ticket = fwd.served(link, worker, forward(b"t-1"))
    fwd.answered(worker, link, ticket, b"t-1")
    frames = forward(b"t-2", client_id="c", request_id=b"r", deadline_ms=60_000)
    ticket = fwd.served(link, worker, frames)
    fwd.answered(worker, link, ticket, b"t-2")


def test_a_non_ascii_service_is_taken_when_the_pool_offers_it(fwd: Fwd) -> None:
    service = "\u00e9cho"
    worker = fwd.worker(service=service)
    link = fwd.link()
    fwd.passed(link, forward(b"t-0", service="\u00e9ch\u00f6"))  # (not offered: no worker)
    ticket = fwd.served(link, worker, forward(b"t-1", service=service), service=service)
    fwd.answered(worker, link, ticket, b"t-1")
