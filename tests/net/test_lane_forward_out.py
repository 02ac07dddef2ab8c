"""The C lane's links (issue 14, phase 4b): channel 3, and a client's REQUEST forwarded out in C.

Real sockets on 127.0.0.1: the frontend, backend and peer ROUTERs of one lane and its link pipe,
a real scale0.core._pool.Pool shared with it, S0P client DEALERs, and a ROUTER playing the peer
brokers' peer ROUTERs: each link is a DEALER the test makes, connects to it, greets once (so the
connection is up) and then gives to the lane (add_link), which is its only user from then on.
Every frame the lane sends is compared byte for byte with what scale0.wire's classes write
(Forward, ClientReply). Each take condition is shown both ways: spoiled, the REQUEST (or the
FORWARDREPLY) reaches Python's pipe intact; restored, the lane takes it. Absence is never waited
for: a marker from the same sender follows, and its reaching the pipe shows what came before was
read.
"""

from __future__ import annotations

import itertools
import math
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from scale0.wire.client import ClientReply, ClientRequest
from scale0.wire.peer import Forward, ForwardPartial, ForwardReply
from tests.net.test_lane import FRONT, MAX_FRAME, WAIT_S, Lane, header, recv
from tests.net.test_lane_forward import PeerRig
from tests.net.test_lane_requests import (
    CLIENT_READINGS,
    MAX_QUEUED,
    PREFIX,
    TIMEOUT_S,
    Peer,
    Pool,
    locked,
    pack,
    request,
    ticket_of,
)

pytestmark = pytest.mark.skipif(
    Lane is None or Pool is None, reason="scale0.net._zmqio or scale0.core._pool not built here"
)

LINKS = 3  # the lane's channel of the links
ME = b"broker-a"  # this broker's id (identity): FORWARD's origin_broker
B2 = b"broker-b"


class OutRig(PeerRig):
    """PeerRig's three channels plus the link pipe (channel 3), and a ROUTER on 127.0.0.1 that
    plays the peers' peer ROUTERs (every link connects to it)."""

    def __init__(
        self, *, start: bool = True, links: bool = True, curve: tuple[bytes, bytes] | None = None
    ) -> None:
        super().__init__(keyed_front=curve is not None, curve=curve)
        self.lane.stop()  # (PeerRig's lane, without links)
        ours = self.ctx.socket(zmq.PAIR)
        theirs = self.ctx.socket(zmq.PAIR)
        for sock in (ours, theirs):
            sock.linger = 0
        endpoint = f"inproc://lane-{id(self)}-{LINKS}"
        ours.bind(endpoint)
        theirs.connect(endpoint)
        self.pipes.append(ours)
        self.lane_pipes.append(theirs)
        self.peers = self.ctx.socket(zmq.ROUTER)
        self.peers.linger = 0
        self.peers.bind("tcp://127.0.0.1:*")
        self.peers_endpoint = self.peers.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.routers.append(self.peers)
        self.link_fds: dict[bytes, int] = {}
        assert Lane is not None
        self.lane = Lane(
            self.routers[0].underlying,
            self.routers[1].underlying,
            self.lane_pipes[0].underlying,
            self.lane_pipes[1].underlying,
            curve is not None,
            False,
            MAX_FRAME,
            peer=self.routers[2].underlying,
            peer_pipe=self.lane_pipes[2].underlying,
            link_pipe=theirs.underlying if links else None,
        )
        if start:
            self.lane.start()

    def link_dealer(self, rid: bytes) -> zmq.Socket[Any]:
        """A DEALER connected to the peers' ROUTER, the connection shown up by one greeting;
        its connection's fd in self.link_fds."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.setsockopt(zmq.ROUTING_ID, rid)
        monitor = dealer.get_monitor_socket(zmq.EVENT_CONNECTED)
        self.monitors.append(monitor)
        dealer.connect(self.peers_endpoint)
        self.dealers.append(dealer)
        assert monitor.poll(WAIT_S * 1000), "no connection"
        self.link_fds[rid] = int(recv_monitor_message(monitor)["value"])
        dealer.send(b"greeting")
        assert recv(self.peers) == [rid, b"greeting"]
        return dealer


class Out:
    """A started lane with links, serving S0P clients from a shared pool, forwarding out."""

    def __init__(self, rig: OutRig, identity: bool = True) -> None:
        self.rig = rig
        self.lane = rig.lane
        self.pool = Pool()
        self.lane.attach_pool(self.pool)
        self.serve()
        self.lane.serve_forwards(True)
        if identity:
            self.lane.identity(ME)
        self.markers = itertools.count()

    def serve(
        self, on: bool = True, timeout: float = TIMEOUT_S, may_queue: bool = False, cap: int = 10
    ) -> None:
        self.lane.serve(on, timeout, cap, PREFIX, MAX_QUEUED, may_queue)

    def link(self, broker: bytes = B2, add: bool = True, rid: bytes | None = None) -> bytes:
        """A link to ``broker`` given to the lane; its routing id at the peers' ROUTER."""
        rid = rid or b"L-" + broker
        dealer = self.rig.link_dealer(rid)
        if add:
            self.lane.add_link(broker, dealer.underlying)
        return rid

    def worker(self, rid: bytes = b"w1", ready: bool = True) -> zmq.Socket[Any]:
        """An S0P worker of echo on the backend: its session noted, in the pool, listed ready
        or not (busy); its DEALER."""
        dealer, fd = self.rig.dealer(1, rid)
        dealer.send(b"hello")  # (through the lane to Python: the ROUTER knows it now)
        assert self.rig.from_pipe(1) == [header(fd), rid, b"hello"]
        self.lane.negotiated(1, fd)
        self.lane.note(1, rid, 0, 0.0, time.monotonic(), 0)
        with locked(self.lane):
            self.pool.add(rid, ("echo",), 1)
            if ready:
                self.pool.list_ready(rid)
        return dealer

    def client(self, rid: bytes = b"c1", client_id: bytes = b"carol") -> Peer:
        dealer, fd = self.rig.dealer(FRONT, rid)
        self.lane.negotiated(FRONT, fd)
        self.lane.note(FRONT, rid, 0, 0.0, time.monotonic(), 0, client_id=client_id)
        return Peer(dealer, rid, fd, CLIENT_READINGS[0])

    def send(self, peer: Peer, frames: list[bytes]) -> list[list[bytes]]:
        """Send ``frames`` on the frontend then a marker: what reached the pipe before it."""
        marker = b"marker-%d" % next(self.markers)
        peer.dealer.send_multipart(frames)
        peer.dealer.send(marker)
        got = self.rig.until_marker(FRONT, marker)
        assert got[-1] == [header(peer.fd, peer.key), peer.rid, marker]
        return got[:-1]

    def ask(
        self, client: Peer, rq: bytes, body: tuple[bytes, ...] = (b"hi",), service: str = "echo"
    ) -> list[bytes]:
        """A client's REQUEST the lane must take; its frames."""
        frames = ClientRequest(service, rq, body).to_frames()
        assert self.send(client, frames) == []
        return frames

    def passed(self, client: Peer, rq: bytes, service: str = "echo") -> None:
        """A client's REQUEST the lane must pass: it reaches the frontend pipe intact."""
        frames = ClientRequest(service, rq, (b"hi",)).to_frames()
        forwarded = self.lane.stats()["forwarded"]
        assert self.send(client, frames) == [[header(client.fd), client.rid, *frames]]
        assert self.lane.stats()["forwarded"] == forwarded

    def forwarded(self, link: bytes) -> list[bytes]:
        """What the peers' ROUTER got from ``link`` (the routing id frame checked, dropped)."""
        got = recv(self.rig.peers)
        assert got[0] == link
        return got[1:]

    def from_links(self, frames: list[bytes], link: bytes, broker: bytes) -> list[list[bytes]]:
        """The peer ``link`` sends ``frames`` then a marker: what reached the link pipe before
        the marker (each as [header, broker, frames..]; the header's 4 bytes checked)."""
        marker = b"marker-%d" % next(self.markers)
        self.rig.peers.send_multipart([link, *frames])
        self.rig.peers.send_multipart([link, marker])
        got: list[list[bytes]] = []
        while True:
            message = self.rig.from_pipe(LINKS)
            assert message[0] == header(self.rig.link_fds[link])  # its fd, no key
            got.append(message[1:])
            if message[-1] == marker:
                break
        assert got[-1] == [broker, marker]
        return got[:-1]

    def reply_taken(
        self,
        link: bytes,
        broker: bytes,
        client: Peer,
        ticket: bytes,
        rq: bytes,
        status: int = 200,
        body: tuple[bytes, ...] = (b"done",),
    ) -> None:
        frames = ForwardReply(ticket, status, body).to_frames()
        assert self.from_links(frames, link, broker) == []
        assert recv(client.dealer) == ClientReply("echo", rq, status, body).to_frames()

    def reply_passed(self, link: bytes, broker: bytes, frames: list[bytes]) -> None:
        replies = self.lane.stats()["replies"]
        assert self.from_links(frames, link, broker) == [[broker, *frames]]
        assert self.lane.stats()["replies"] == replies


@pytest.fixture
def rig() -> Iterator[OutRig]:
    r = OutRig()
    try:
        yield r
    finally:
        while True:  # a failed test may leave the lock held: stop() would refuse
            try:
                r.lane.unlock()
            except RuntimeError:
                break
        r.close()


@pytest.fixture
def out(rig: OutRig) -> Out:
    return Out(rig)


def balanced(stats: dict[str, int]) -> bool:
    return stats["received"] == (
        stats["beats"] + stats["requests"] + stats["replies"] + stats["passed"] + stats["lost"]
    )


def plain(ticket: bytes, body: tuple[bytes, ...] = (b"hi",)) -> list[bytes]:
    return Forward(ticket, "echo", ME.decode(), body).to_frames()


# ---- a plain FORWARD and its FORWARDREPLY -----------------------------------------------------


def test_a_request_with_no_ready_worker_is_forwarded_and_its_forwardreply_answered(
    out: Out,
) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 2})
    client = out.client()
    body = (b"a", b"", b"c" * 3000)
    before = time.monotonic()
    out.ask(client, b"r-1", body)
    got = out.forwarded(link)
    ticket = ticket_of(2)  # (the request is numbered 1, its ticket 2: as a dispatch)
    assert got == [b"", b"S0B1", b"FORWARD", ticket, b"echo", ME, *body]
    assert got == plain(ticket, body)
    assert lane.in_flight() == 1 and lane.waiting_total() == 0
    assert lane.forwarded_to(B2) == {"echo": 1} and lane.forwarded_to(b"other") == {}
    # in the client's counts exactly as a dispatched request
    assert lane.held(b"carol") == 1 and lane.busy(b"c1")
    assert lane.held_by_client() == {b"carol": 1} and lane.open_by_connection() == {b"c1": 1}
    assert lane.peer_deltas() == [(B2, "echo", -1)]
    assert lane.peer_deltas() == []  # emptied
    answer = (b"answer", b"", b"y" * 60000)
    out.reply_taken(link, B2, client, ticket, b"r-1", 203, answer)
    assert lane.in_flight() == 0 and lane.forwarded_to(B2) == {}
    assert lane.held(b"carol") == 0 and not lane.busy(b"c1")
    assert lane.peer_deltas() == [(B2, "echo", 1)]
    assert lane.cache_get(b"carol", b"r-1", time.monotonic()) == ("echo", 203, answer)
    requests, replies, histograms, changed, forwards, forwarded = lane.drain()
    assert (requests, replies, changed, forwards, forwarded) == (1, 1, [], 0, 1)
    [(service, status, counts, sum_s)] = histograms
    assert (service, status, sum(counts)) == ("echo", 203, 1)
    assert 0.0 <= sum_s <= time.monotonic() - before
    assert lane.drain() == (0, 0, [], [], 0, 0)
    assert lane.done_drain() == []  # no RequestDone record: that peer's to make
    lane.stop()
    stats = lane.stats()
    assert (stats["requests"], stats["replies"], stats["forwarded"], stats["cached"]) == (
        1,
        1,
        1,
        1,
    )
    assert stats["forwards"] == 0 and stats["send_dropped"] == 0
    assert balanced(stats)


def test_deltas_are_summed_sorted_and_zero_sums_left_out(out: Out) -> None:
    lane = out.lane
    links = {b: out.link(b) for b in (b"b2", b"b1")}
    lane.peer(b"b2", True, False, {"echo": 5, "alpha": 5})
    lane.peer(b"b1", True, False, {"echo": 1})
    client = out.client()
    out.ask(client, b"r-1")  # b2 (5 > 1)
    out.ask(client, b"r-2", service="alpha")  # b2
    out.ask(client, b"r-3")  # b2 (4 > 1)
    tickets = [out.forwarded(links[b"b2"])[3] for _ in range(3)]
    assert lane.peer_deltas() == [(b"b2", "alpha", -1), (b"b2", "echo", -2)]
    out.reply_taken(links[b"b2"], b"b2", client, tickets[0], b"r-1")
    out.ask(client, b"r-4")  # b2 (3 + 1 = 4 > 1)
    assert out.forwarded(links[b"b2"])[3] == ticket_of(8)
    # echo: +1 - 1 = 0, left out
    assert lane.peer_deltas() == []
    assert lane.forwarded_to(b"b2") == {"echo": 2, "alpha": 1}


# ---- FORWARDWITH --------------------------------------------------------------------------------


def test_forwardwith_carries_what_is_left_of_the_deadline_and_the_client_s_ids(out: Out) -> None:
    lane = out.lane
    timeout = 2.0009  # (deadline - now) * 1000 is about 2000.9: int() truncates it
    out.serve(timeout=timeout)
    link = out.link()
    lane.peer(B2, True, True, {"echo": 1})
    client = out.client(client_id=b"carol c")
    rq = bytes(range(256))[1:]  # every byte but 0, in hex
    out.ask(client, rq, (b"q",))
    got = out.forwarded(link)
    ticket = got[3]
    [record] = lane.adopt_peer(B2)
    started, deadline = record[7], record[8]
    n = int((deadline - started) * 1000)
    assert n == 2000
    options = b'{"deadline_ms":2000,"client_id":"carol c","request_id":"%s"}' % rq.hex().encode()
    assert got == [b"", b"S0B1", b"FORWARDWITH", ticket, b"echo", ME, options, b"q"]
    expect = Forward(
        ticket, "echo", ME.decode(), (b"q",), client_id="carol c", request_id=rq, deadline_ms=n
    )
    assert got == expect.to_frames()


def test_a_deadline_below_a_millisecond_is_zero(out: Out) -> None:
    out.serve(timeout=0.0009)  # 0.9 ms: truncated to 0
    link = out.link()
    out.lane.peer(B2, True, True, {"echo": 1})
    client = out.client()
    out.ask(client, b"\x00\xff")
    got = out.forwarded(link)
    assert got[6] == b'{"deadline_ms":0,"client_id":"carol","request_id":"00ff"}'


@pytest.mark.parametrize(
    "client_id", [b'car"ol', b"car\\ol", "caról".encode(), b"car\x7fol", b"car\tol"]
)
def test_a_client_id_json_would_escape_is_not_forwarded_with_but_is_without(
    out: Out, client_id: bytes
) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, True, {"echo": 1})
    client = out.client(client_id=client_id)
    out.passed(client, b"r-1")
    assert lane.peer_deltas() == [] and lane.in_flight() == 0
    lane.peer(B2, True, False, {"echo": 1})  # a peer of an older version: FORWARD
    out.ask(client, b"r-1")
    assert out.forwarded(link)[2] == b"FORWARD"


# ---- the pick -----------------------------------------------------------------------------------


def test_the_pick_most_free_ties_to_the_first_and_each_forward_takes_one(out: Out) -> None:
    lane = out.lane
    brokers = [b"p1", b"p2", b"p3"]
    links = {b: out.link(b) for b in brokers}
    lane.peer(b"p1", True, False, {"echo": 1})
    lane.peer(b"p2", True, False, {"echo": 3})
    lane.peer(b"p3", True, False, {"echo": 3})
    client = out.client()
    chosen = []
    for i in range(7):
        out.ask(client, b"r-%d" % i)
        got = recv(out.rig.peers)
        chosen.append(got[0])
    # 1,3,3 -> p2 (tie: the first); 1,2,3 -> p3; 1,2,2 -> p2; 1,1,2 -> p3; 1,1,1 -> p1;
    # 0,1,1 -> p2; 0,0,1 -> p3
    assert chosen == [links[b] for b in (b"p2", b"p3", b"p2", b"p3", b"p1", b"p2", b"p3")]
    # every free count now 0: with no worker of ours offering echo the lane forwards it anyway,
    # to the most free however few (all 0: the first), as pick_peer(free=False) (F6)
    out.ask(client, b"r-8")
    assert recv(out.rig.peers)[0] == links[b"p1"]
    assert lane.peer_deltas() == [(b"p1", "echo", -2), (b"p2", "echo", -3), (b"p3", "echo", -3)]
    # with a worker of ours offering it (busy), none qualifies: with may_queue off, Python's
    with locked(lane):
        out.pool.add(b"w1", ("echo",), 1)
    out.passed(client, b"r-9")
    with locked(lane):
        out.pool.remove(b"w1")
    # replacing a peer keeps its place in the order
    lane.peer(b"p3", True, False, {"echo": 1})
    lane.peer(b"p1", True, False, {"echo": 1})
    out.ask(client, b"r-10")
    assert recv(out.rig.peers)[0] == links[b"p1"]
    # a peer forgotten and told again goes to the back
    lane.forget_peer(b"p1")
    lane.forget_peer(b"nobody")  # (no error)
    lane.peer(b"p1", True, False, {"echo": 1})
    out.ask(client, b"r-11")
    assert recv(out.rig.peers)[0] == links[b"p3"]


@pytest.mark.parametrize(
    "spoil",
    ["free zero", "free negative", "unusable", "not offering", "no link", "removed link"],
)
def test_a_peer_that_does_not_qualify_is_not_sent_work(out: Out, spoil: str) -> None:
    lane = out.lane
    good = out.link(b"good")
    out.link(b"best", add=spoil not in ("no link",))
    lane.peer(b"good", True, False, {"echo": 1})
    free = {
        "free zero": 0,
        "free negative": -1,
    }.get(spoil, 5)
    lane.peer(
        b"best", spoil != "unusable", False, {} if spoil == "not offering" else {"echo": free}
    )
    if spoil == "removed link":
        lane.remove_link(b"best")
    client = out.client()
    if spoil in ("no link", "removed link"):  # the chosen one has no link: Python's
        out.passed(client, b"r-1")
        lane.forget_peer(b"best")
    out.ask(client, b"r-2")
    assert recv(out.rig.peers)[0] == good


def test_a_ready_worker_is_used_first_and_majordomo_or_waiting_ones_are_not_forwarded(
    out: Out,
) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 9})
    dealer = out.worker()
    client = out.client()
    out.ask(client, b"r-1")
    assert recv(dealer)[2] == b"REQUEST"  # dispatched here, not forwarded
    assert lane.forwarded_to(B2) == {}
    # python_waits > 0: Python's queue goes first
    lane.python_waits("echo", 1)
    out.passed(client, b"r-2")
    lane.python_waits("echo", 0)
    # the gate off, and serve off
    lane.serve_forwards(False)
    out.passed(client, b"r-3")
    lane.serve_forwards(True)
    # a Majordomo client's REQUEST keeps today's rule (no worker: Python's)
    mdp_dealer, mdp_fd = out.rig.dealer(FRONT, b"m1")
    lane.negotiated(FRONT, mdp_fd)
    reading = CLIENT_READINGS[1]
    lane.note(FRONT, b"m1", 0, 0.0, time.monotonic(), pack(reading), client_id=b"mary")
    mdp = Peer(mdp_dealer, b"m1", mdp_fd, reading)
    frames = request("echo", (b"hi",), reading)
    assert out.send(mdp, frames) == [[header(mdp_fd), b"m1", *frames]]
    out.ask(client, b"r-4")
    assert out.forwarded(link)[3] == lane.adopt_peer(B2)[0][0]


def test_without_an_identity_nothing_is_forwarded() -> None:
    rig = OutRig()
    try:
        out = Out(rig, identity=False)
        out.link()
        rig.lane.peer(B2, True, False, {"echo": 1})
        client = out.client()
        out.passed(client, b"r-1")
        rig.lane.identity(ME)
        out.ask(client, b"r-2")
        assert out.forwarded(b"L-" + B2)[5] == ME
    finally:
        rig.close()


def test_a_refused_send_keeps_the_record_for_its_deadline(out: Out) -> None:
    lane = out.lane
    dealer = out.rig.ctx.socket(zmq.DEALER)  # connected nowhere: libzmq refuses (EAGAIN)
    dealer.linger = 0
    out.rig.dealers.append(dealer)
    lane.add_link(B2, dealer.underlying)
    lane.peer(B2, True, False, {"echo": 1})
    client = out.client()
    dropped = lane.stats()["send_dropped"]
    out.ask(client, b"r-1")
    assert lane.stats()["send_dropped"] == dropped + 1
    assert lane.forwarded_to(B2) == {"echo": 1}
    [record] = lane.adopt_due(time.monotonic() + TIMEOUT_S + 1)
    assert record[15] == B2.decode()


# ---- the FORWARDREPLY passed ------------------------------------------------------------------


def test_a_forwardreply_the_lane_must_not_take_goes_to_python(out: Out) -> None:
    lane = out.lane
    link = out.link()
    other = out.link(b"b3")
    lane.peer(B2, True, False, {"echo": 5})
    client = out.client()
    out.ask(client, b"r-1")
    ticket = out.forwarded(link)[3]
    for status in (404, 503):  # F8: Python adopts it and routes it again
        out.reply_passed(link, B2, ForwardReply(ticket, status, (b"x",)).to_frames())
    out.reply_passed(link, B2, ForwardReply(ticket + b"?", 200, ()).to_frames())  # unknown
    out.reply_passed(other, b"b3", ForwardReply(ticket, 200, ()).to_frames())  # another link
    out.reply_passed(link, B2, ForwardPartial(ticket, (b"part",)).to_frames())
    out.reply_passed(link, B2, [b"", b"S0B1", b"FORWARDREPLY", ticket, b"20"])  # bad status
    out.reply_passed(link, B2, [b"", b"S0B1", b"FORWARDREPLY", ticket, b"600"])
    out.reply_passed(link, B2, [b"", b"S0B1", b"FORWARDREPLY", ticket])  # no status
    out.reply_passed(link, B2, [b"", b"S0B1", b"FORWARDREPLY", ticket, b"200", b"z" * 70000])
    lane.python_waits("echo", 1)  # F9: Python's drain_to_peers goes first
    out.reply_passed(link, B2, ForwardReply(ticket, 200, ()).to_frames())
    lane.python_waits("echo", 0)
    lane.serve(False, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)
    out.reply_passed(link, B2, ForwardReply(ticket, 200, ()).to_frames())
    out.serve()
    assert lane.forwarded_to(B2) == {"echo": 1} and lane.peer_deltas() == [(B2, "echo", -1)]
    out.reply_taken(link, B2, client, ticket, b"r-1", 200, ())  # the record stayed: now taken


def test_order_a_forwardreply_waits_for_python_to_finish_the_link_s_earlier_messages(
    out: Out,
) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 5})
    client = out.client()
    out.ask(client, b"r-1")
    ticket = out.forwarded(link)[3]
    out.reply_passed(link, B2, [b"something", b"else"])  # numbered 1, 2 (its marker)
    out.rig.pipes[LINKS].send(struct.pack("<Q", 1))  # Python finished only the first
    out.reply_passed(link, B2, ForwardReply(ticket, 200, ()).to_frames())  # 3, 4
    out.rig.pipes[LINKS].send(struct.pack("<Q", 4))
    out.reply_taken(link, B2, client, ticket, b"r-1", 200, ())
    assert lane.stats()["marks"] == 2


# ---- the records ------------------------------------------------------------------------------


def test_adopt_peer_hands_the_16_field_records_in_ticket_order(out: Out) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 5})
    client = out.client()
    before = time.monotonic()
    out.ask(client, b"r-1", (b"a",))
    out.ask(client, b"r-2", (b"b", b""))
    t1, t2 = out.forwarded(link)[3], out.forwarded(link)[3]
    assert lane.adopt_worker(b"") == []  # never by a worker
    with locked(lane):
        records = lane.adopt_peer(B2)
    assert [r[0] for r in records] == [t1, t2] == [ticket_of(2), ticket_of(4)]
    r1 = records[0]
    assert len(r1) == 16
    (ticket, wrid, crid, cid, caller, service, body, started, deadline) = r1[:9]
    (request_id, seq, ids, origin, via, limit, peer) = r1[9:]
    assert (ticket, wrid, crid, cid, caller, service, body) == (
        t1,
        b"",
        b"c1",
        b"carol",
        "",
        "echo",
        (b"a",),
    )
    assert before <= started <= time.monotonic() and deadline == started + TIMEOUT_S
    assert (request_id, seq, ids, origin, via, limit, peer) == (
        b"r-1",
        1,
        True,
        b"",
        "",
        float("inf"),
        B2.decode(),
    )
    assert lane.adopt_peer(B2) == [] and lane.forwarded_to(B2) == {}
    assert lane.held(b"carol") == 0 and lane.stats()["handed"] == 2
    # its FORWARDREPLY is Python's now
    out.reply_passed(link, B2, ForwardReply(t1, 200, ()).to_frames())


@pytest.mark.parametrize("how", ["adopt", "adopt_all", "adopt_due", "adopt_key"])
def test_the_other_adopts_hand_a_forwarded_out_record(out: Out, how: str) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 5})
    client = out.client()
    out.ask(client, b"r-1")
    ticket = out.forwarded(link)[3]
    got: Any = {
        "adopt": lambda: [lane.adopt(ticket)],
        "adopt_all": lane.adopt_all,
        "adopt_due": lambda: lane.adopt_due(time.monotonic() + TIMEOUT_S + 1),
        "adopt_key": lambda: [lane.adopt_key(b"carol", b"r-1")],
    }[how]()
    assert [(r[0], r[15]) for r in got] == [(ticket, B2.decode())]
    assert lane.in_flight() == 0 and lane.adopt_peer(B2) == []


def test_a_resend_of_a_key_forwarded_out_is_python_s(out: Out) -> None:
    lane = out.lane
    out.link()
    lane.peer(B2, True, False, {"echo": 5})
    client = out.client()
    out.ask(client, b"r-1")
    out.passed(client, b"r-1")  # (R10: the lane holds that key)


# ---- links: add, remove, released, Python's sends, pass-through, stop ---------------------------


def test_link_methods_need_a_link_pipe_and_name_bad_arguments() -> None:
    rig = OutRig(links=False)
    try:
        lane = rig.lane
        for call in (
            lambda: lane.add_link(B2, rig.peers.underlying),
            lambda: lane.remove_link(B2),
            lane.released_links,
        ):
            with pytest.raises(ValueError, match="no links"):
                call()
    finally:
        rig.close()
    assert Lane is not None
    with pytest.raises(ValueError, match="link_pipe given without peer"):
        Lane(1, 2, 3, 4, False, False, MAX_FRAME, link_pipe=5)


def test_add_and_remove_link_arguments(out: Out) -> None:
    lane = out.lane
    dealer = out.rig.link_dealer(b"L-x")
    with pytest.raises(ValueError, match=r"link_id must be 1\.\.255 bytes, not 0"):
        lane.add_link(b"", dealer.underlying)
    with pytest.raises(ValueError, match=r"1\.\.255 bytes, not 256"):
        lane.add_link(b"x" * 256, dealer.underlying)
    with pytest.raises(TypeError, match="handle must be a libzmq socket handle"):
        lane.add_link(B2, "socket")  # type: ignore[arg-type]
    lane.add_link(B2, dealer.underlying)
    with pytest.raises(ValueError, match="holds a link b'broker-b' already"):
        lane.add_link(B2, dealer.underlying)
    with pytest.raises(KeyError, match="no link b'nobody'"):
        lane.remove_link(b"nobody")
    with pytest.raises(TypeError, match="link_id must be bytes"):
        lane.remove_link("x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"broker_id must be 1\.\.255 bytes"):
        lane.peer(b"", True, True, {})
    with pytest.raises(TypeError, match="free must be a dict of str"):
        lane.peer(B2, True, True, {b"echo": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="free must be a dict of str"):
        lane.peer(B2, True, True, {"echo": 1.5})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"name must be 1\.\.255 bytes"):
        lane.identity(b"")


def released(lane: Any) -> list[bytes]:
    """released_links() once it lists something (bounded)."""
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        got: list[bytes] = lane.released_links()
        if got:
            return got
        time.sleep(0.005)
    raise AssertionError("no link released")


def test_python_sends_through_the_link_pipe_and_a_send_before_remove_goes_out(out: Out) -> None:
    lane = out.lane
    link = out.link()
    pipe = out.rig.pipes[LINKS]
    pipe.send_multipart([B2, b"x", b"", b"y"])
    assert recv(out.rig.peers) == [link, b"x", b"", b"y"]
    sent, dropped = lane.stats()["sent"], lane.stats()["send_dropped"]
    pipe.send_multipart([b"nobody", b"x"])  # an unknown link: dropped
    for i in range(300):  # more than one wake-up's budget, then remove at once
        pipe.send_multipart([B2, b"n-%d" % i])
    lane.remove_link(B2)
    with pytest.raises(KeyError):
        lane.remove_link(B2)  # (being removed: not held)
    for i in range(300):
        assert recv(out.rig.peers) == [link, b"n-%d" % i]
    assert released(lane) == [B2]
    assert lane.released_links() == []  # once each
    pipe.send_multipart([B2, b"late"])
    end = time.monotonic() + WAIT_S
    while lane.stats()["send_dropped"] < dropped + 2 and time.monotonic() < end:
        time.sleep(0.005)
    stats = lane.stats()
    assert (stats["sent"], stats["send_dropped"]) == (sent + 300, dropped + 2)
    # released, it may be added again (the same socket: Python still holds it)
    dealer = out.rig.dealers[-1]
    lane.add_link(B2, dealer.underlying)
    pipe.send_multipart([B2, b"again"])
    assert recv(out.rig.peers) == [link, b"again"]


def test_records_forwarded_on_a_removed_link_stay_for_adopt_peer(out: Out) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 5})
    client = out.client()
    out.ask(client, b"r-1")
    ticket = out.forwarded(link)[3]
    lane.remove_link(B2)
    assert released(lane) == [B2]
    assert lane.forwarded_to(B2) == {"echo": 1}
    assert [r[0] for r in lane.adopt_peer(B2)] == [ticket]


def test_what_a_link_receives_goes_to_python_with_the_header_and_the_link_id(out: Out) -> None:
    link = out.link()
    got = out.from_links([b"", b"S0B1", b"HELLO", b"{}"], link, B2)
    assert got == [[B2, b"", b"S0B1", b"HELLO", b"{}"]]
    long_id = b"z" * 255
    long_link = out.link(long_id, rid=b"L-long")  # (longer than the header's inline room)
    assert out.from_links([b"x"], long_link, long_id) == [[long_id, b"x"]]


def test_stop_sends_what_the_link_pipe_holds_and_the_stats_balance(out: Out) -> None:
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 5})
    client = out.client()
    out.ask(client, b"r-1")
    ticket = out.forwarded(link)[3]
    out.reply_taken(link, B2, client, ticket, b"r-1")
    out.from_links([b"passed"], link, B2)
    for i in range(5):  # written just before stop(): sent before the thread ends
        out.rig.pipes[LINKS].send_multipart([B2, b"last-%d" % i])
    lane.stop()
    for i in range(5):
        assert recv(out.rig.peers) == [link, b"last-%d" % i]
    stats = lane.stats()
    assert balanced(stats)
    assert (stats["requests"], stats["replies"], stats["forwarded"]) == (1, 1, 1)
    assert stats["sent"] >= 5 and stats["send_dropped"] == 0


def test_r20_s_cap_counts_the_requests_forwarded_out(out: Out) -> None:
    lane = out.lane
    out.serve(cap=3)
    link = out.link()
    lane.peer(B2, True, False, {"echo": 9})
    client = out.client()
    out.ask(client, b"r-1")
    out.ask(client, b"r-2")
    lane.python_holds(b"carol", 1)
    out.passed(client, b"r-3")  # 2 forwarded out + 1 Python holds = the cap
    lane.python_holds(b"carol", 0)
    out.ask(client, b"r-3")
    assert [out.forwarded(link)[3] for _ in range(3)] == [ticket_of(n) for n in (2, 4, 6)]
    # (a request R20 passes is not numbered: the cap comes before the numbering point)


def test_a_flood_of_requests_forwarded_and_answered(out: Out) -> None:
    """Many clients' requests to two peers, every FORWARDREPLY taken: each client gets exactly
    its answers, the free counts and the stats balance."""
    lane = out.lane
    out.serve(cap=1000)
    links = {b: out.link(b) for b in (b"b1", b"b2")}
    lane.peer(b"b1", True, True, {"echo": 10_000})
    lane.peer(b"b2", True, False, {"echo": 10_000})
    clients = [out.client(b"c%d" % i, b"client-%d" % i) for i in range(8)]
    per_client = 40
    for i in range(per_client):
        for c in clients:
            c.dealer.send_multipart(ClientRequest("echo", b"%d" % i, (c.rid,)).to_frames())
    n = per_client * len(clients)
    by_rid = {rid: b for b, rid in links.items()}
    for _ in range(n):  # the peers answer each FORWARD at once, echoing the client's body
        got = recv(out.rig.peers)
        ticket, body = got[4], got[-1]
        out.rig.peers.send_multipart([got[0], *ForwardReply(ticket, 200, (body,)).to_frames()])
        assert by_rid[got[0]] in (b"b1", b"b2")
    for c in clients:
        answers = sorted(recv(c.dealer)[4] for _ in range(per_client))
        assert answers == sorted(b"%d" % i for i in range(per_client))
    assert lane.in_flight() == 0 and lane.peer_deltas() == []
    lane.stop()
    stats = lane.stats()
    assert (stats["requests"], stats["replies"], stats["forwarded"]) == (n, n, n)
    assert stats["passed"] == 0 and balanced(stats)


def test_a_taken_forwardreply_hears_its_link_and_one_waits_while_the_lane_s_queue_holds_one(
    out: Out,
) -> None:
    """heard() lists the link a FORWARDREPLY came on (the family hears that peer then, F3);
    while a request of the service waits in the lane's own queue, the FORWARDREPLY is
    Python's (F9: drain_to_peers goes first), whoever queued it."""
    lane = out.lane
    link = out.link()
    lane.peer(B2, True, False, {"echo": 1})
    out.worker(ready=False)  # a worker of echo, busy: r-2 waits in the lane
    lane.serve(True, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, True)  # (may queue: no peer rule here)
    client = out.client()
    out.ask(client, b"r-1")
    first = out.forwarded(link)[3]
    lane.heard()
    out.ask(client, b"r-2")  # b2 has no free slot left: queued
    assert lane.waiting("echo") == 1 and lane.forwarded_to(B2) == {"echo": 1}
    out.reply_passed(link, B2, ForwardReply(first, 200, (b"x",)).to_frames())
    assert lane.heard() == [(FRONT, b"c1", lane.last_seen(FRONT, b"c1"))]
    with locked(lane):
        assert [r[12:] for r in lane.adopt_waiting("echo")] == [(b"", "", math.inf, "")]
    before = time.monotonic()
    out.reply_taken(link, B2, client, first, b"r-1", 200, (b"x",))
    [(channel, rid, seen)] = [h for h in lane.heard() if h[0] == 3]
    assert (channel, rid) == (3, B2) and before <= seen <= time.monotonic()
    assert lane.heard() == []  # once


def test_a_curve_client_s_request_is_not_forwarded_by_the_lane() -> None:
    """Python's FORWARD carries a CURVE client's key (FORWARDAS, or FORWARDWITH's caller) for
    the peer to judge by the same grants (T1-T4); the lane writes none, so it forwards only a
    request whose header names no key: a CURVE client's is Python's."""
    rig = OutRig(curve=zmq.curve_keypair())
    try:
        out = Out(rig)
        out.link()
        out.lane.peer(B2, True, False, {"echo": 3})
        plain_client = out.client()
        client = Peer(plain_client.dealer, b"c1", plain_client.fd, CLIENT_READINGS[0], rig.public)
        frames = ClientRequest("echo", b"r-1", (b"hi",)).to_frames()
        assert out.send(client, frames) == [[header(client.fd, rig.public), client.rid, *frames]]
        assert out.lane.stats()["forwarded"] == 0 and out.lane.peer_deltas() == []
    finally:
        rig.close()
