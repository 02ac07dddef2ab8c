"""The C lane's S0P half (issue 14, phase 3b, the rest): the pool's ``ids``, R10's keys, the reply
cache in C, and S0P client REQUESTs for S0P workers and their final REPLYs.

Real sockets on 127.0.0.1 (tests/net/test_lane.py's Rig) and a real scale0.core._pool.Pool
shared with the lane, as tests/net/test_lane_requests.py. Every frame a peer sends is built by
scale0.wire's classes and every frame the lane sends is compared byte for byte with what they
write. Each take condition is shown both ways. The reply cache is held to
scale0.core.requests.ReplyCache by a Hypothesis state machine.
"""

from __future__ import annotations

import itertools
import shutil
import struct
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from scale0.core.majordomo import Reading
from scale0.core.requests import ReplyCache
from scale0.wire.client import ClientReply, ClientRequest
from scale0.wire.mdp import MDPW02, MdpWorkerReply
from scale0.wire.worker import WorkerIdRequest, WorkerReply, WorkerRequest
from tests.net.test_lane import BACK, FRONT, MAX_FRAME, Lane, Rig, header, recv, rig
from tests.net.test_lane_requests import (
    ALL_DONE,
    CLIENT_READINGS,
    MAX_QUEUED,
    PREFIX,
    TIMEOUT_S,
    WORKER_READINGS,
    Net,
    Peer,
    Pool,
    locked,
    pack,
    request,
    ticket_of,
)

__all__ = ["rig"]  # (a fixture: tests/net/test_lane.py's, used by name)

pytestmark = pytest.mark.skipif(
    Lane is None or Pool is None, reason="scale0.net._zmqio or scale0.core._pool not built here"
)


@pytest.fixture
def net(rig: Rig) -> Net:
    return Net(rig)


# ---- the pool's ids -------------------------------------------------------------------------


def test_the_pool_keeps_each_worker_s_ids_and_a_new_add_replaces_it() -> None:
    pool = Pool()
    assert pool.add(b"w", ("s",), 1) is False
    assert pool.ids_of(b"w") is False
    assert pool.add(b"w", ("s",), 1, True) is True
    assert pool.ids_of(b"w") is True
    pool.add(b"w", ("s",), 2)  # a new READY without the option
    assert pool.ids_of(b"w") is False
    pool.add(b"v", ("s",), 1, ids=True)
    assert pool.ids_of(b"v") is True
    assert pool.ids_of(b"unknown") is False
    pool.remove(b"v")
    assert pool.ids_of(b"v") is False


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda p: p.add(b"w", ("s",), 1, 1), "ids must be bool, not int"),
        (lambda p: p.add(b"w", ("s",), 1, True, ids=True), "multiple values for argument 'ids'"),
        (lambda p: p.add(b"w", ("s",), 1, idz=True), "unexpected keyword argument 'idz'"),
        (lambda p: p.add(b"w", ("s",), 1, True, False), "Pool.add takes 3 arguments (5 given)"),
        (lambda p: p.ids_of("w"), "routing_id must be bytes, not str"),
    ],
)
def test_the_pool_s_ids_arguments_are_checked(call: Any, named: str) -> None:
    pool = Pool()
    pool.add(b"w", ("s",), 1, True)
    with pytest.raises(TypeError) as raised:
        call(pool)
    assert named in str(raised.value)
    assert pool.ids_of(b"w") is True  # unchanged


def test_ids_of_is_guarded_while_a_lane_shares_the_pool(rig: Rig) -> None:
    pool = Pool()
    rig.lane.attach_pool(pool)
    with pytest.raises(RuntimeError, match=r"under lane\.lock"):
        pool.ids_of(b"w")
    with pytest.raises(RuntimeError, match=r"under lane\.lock"):
        pool.add(b"w", ("s",), 1, ids=True)
    with locked(rig.lane):
        pool.add(b"w", ("s",), 1, ids=True)
        assert pool.ids_of(b"w") is True


# ---- Python's keys --------------------------------------------------------------------------


def test_python_keys_are_a_set(rig: Rig) -> None:
    lane = rig.lane
    assert lane.python_keys() == 0
    lane.python_key(b"c", b"1", True)
    lane.python_key(b"c", b"1", True)  # idempotent
    lane.python_key(b"c", b"2", True)
    lane.python_key(b"c1", b"", True)  # (client_id, request_id) is not their concatenation
    lane.python_key(b"c", b"11", True)
    assert lane.python_keys() == 4
    lane.python_key(b"c", b"1", False)
    lane.python_key(b"c", b"1", False)  # absent: not an error
    lane.python_key(b"nobody", b"1", False)
    assert lane.python_keys() == 3
    with locked(lane):  # under Python's hold too (the lock is recursive)
        lane.python_key(b"c", b"2", False)
    assert lane.python_keys() == 2


def test_adopt_key_of_an_unknown_key_is_none(rig: Rig) -> None:
    assert rig.lane.adopt_key(b"c", b"1") is None


# ---- the reply cache ------------------------------------------------------------------------


def test_the_cache_s_defaults_are_the_ledger_s(rig: Rig) -> None:
    from scale0.core import ledger

    lane = rig.lane
    body = (b"x" * 100,)
    for i in range(3):
        lane.cache_put(b"c", b"%d" % i, "s", 200, body, 10.0)
    assert lane.cache_count() == 3 and lane.cache_bytes() == 300
    # the age: cache_put takes expires, the lane's own puts use max_age_s (step 2's tests)
    assert ledger.REPLY_CACHE_ENTRIES == 10_000
    assert ledger.REPLY_CACHE_BYTES == 64 << 20
    assert ledger.REPLY_CACHE_AGE_S == 60.0


def test_cache_get_put_take(rig: Rig) -> None:
    lane = rig.lane
    lane.cache_limits(10, 1000, 60.0)
    assert lane.cache_get(b"c", b"1", 0.0) is None
    lane.cache_put(b"c", b"1", "s\u00e9", 200, (b"a", b"bc"), 5.0)
    lane.cache_put(b"c", b"2", "t", 503, (), 7.0)
    assert lane.cache_get(b"c", b"1", 5.0) == ("s\u00e9", 200, (b"a", b"bc"))  # expires == now
    assert lane.cache_get(b"c", b"1", 4.0) == ("s\u00e9", 200, (b"a", b"bc"))  # no refresh
    assert (lane.cache_count(), lane.cache_bytes()) == (2, 3)
    assert lane.cache_get(b"c", b"1", 5.5) is None  # expired: dropped
    assert (lane.cache_count(), lane.cache_bytes()) == (1, 0)
    lane.cache_put(b"d", b"1", "s", 201, (b"xyz",), 9.0)
    assert lane.cache_take() == [
        (b"c", b"2", "t", 503, (), 7.0),
        (b"d", b"1", "s", 201, (b"xyz",), 9.0),
    ]
    assert (lane.cache_count(), lane.cache_bytes(), lane.cache_take()) == (0, 0, [])


def test_a_body_larger_than_the_cache_is_not_stored_and_the_old_entry_stays(rig: Rig) -> None:
    lane = rig.lane
    lane.cache_limits(10, 4, 60.0)
    lane.cache_put(b"c", b"1", "s", 200, (b"ab",), 5.0)
    lane.cache_put(b"c", b"1", "s", 200, (b"abc", b"de"), 6.0)
    assert lane.cache_get(b"c", b"1", 0.0) == ("s", 200, (b"ab",))


@pytest.mark.parametrize(
    ("args", "error", "named"),
    [
        ((-1, 1, 1.0), ValueError, "must be >= 0"),
        ((1, -1, 1.0), ValueError, "must be >= 0"),
        ((1, 1, -0.5), ValueError, "must be >= 0"),
        ((1, 1, float("nan")), ValueError, "must be >= 0"),
    ],
)
def test_cache_limits_refuse_negatives(rig: Rig, args: Any, error: Any, named: str) -> None:
    with pytest.raises(error, match=named):
        rig.lane.cache_limits(*args)


@pytest.mark.parametrize(
    ("args", "error", "named"),
    [
        ((b"c", b"1", "s", 99, (), 1.0), ValueError, "status must be 100..599, not 99"),
        ((b"c", b"1", "s", 600, (), 1.0), ValueError, "status must be 100..599, not 600"),
        ((b"c", b"1", "s", 200, [b"x"], 1.0), TypeError, "body must be a tuple of bytes"),
        ((b"c", b"1", "s", 200, (b"x", "y"), 1.0), TypeError, r"body\[1\] must be bytes"),
        ((b"c", b"1", b"s", 200, (), 1.0), TypeError, "must be str"),
        (("c", b"1", "s", 200, (), 1.0), TypeError, "bytes"),
        ((b"c", b"1", "s", 200, (), float("nan")), ValueError, "expires is NaN"),
    ],
)
def test_cache_put_checks_everything_before_a_change(
    rig: Rig, args: Any, error: Any, named: str
) -> None:
    with pytest.raises(error, match=named):
        rig.lane.cache_put(*args)
    assert rig.lane.cache_count() == 0


CLIENTS = st.sampled_from([b"a", b"b", b"ab"])
IDS = st.sampled_from([b"", b"1", b"b", b"1b"])
BODIES = st.lists(st.binary(max_size=6), max_size=3).map(tuple)
TIMES = st.floats(min_value=0.0, max_value=20.0, allow_nan=False)


class CacheTwin(RuleBasedStateMachine):
    """The lane's cache against ReplyCache with small limits (eviction by entries and bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig(start=False)
        self.lane = self.rig.lane
        self.age = 3.0
        self.lane.cache_limits(4, 12, self.age)
        self.model = ReplyCache(max_entries=4, max_bytes=12, max_age_s=self.age)
        self.now = 0.0

    def teardown(self) -> None:
        self.rig.close()

    @rule(client=CLIENTS, request_id=IDS, status=st.sampled_from([200, 404, 503]), body=BODIES)
    def put(self, client: bytes, request_id: bytes, status: int, body: tuple[bytes, ...]) -> None:
        reply = ClientReply("svc", request_id or b"-", status, body)
        self.model.put((client, request_id), reply, self.now)
        self.lane.cache_put(client, request_id, "svc", status, body, self.now + self.age)

    @rule(client=CLIENTS, request_id=IDS, later=TIMES)
    def get(self, client: bytes, request_id: bytes, later: float) -> None:
        now = self.now + later
        want = self.model.get((client, request_id), now)
        got = self.lane.cache_get(client, request_id, now)
        assert got == (None if want is None else ("svc", want.status, want.body))

    @rule(step=st.floats(min_value=0.0, max_value=2.0, allow_nan=False))
    def tick(self, step: float) -> None:
        self.now += step

    @rule(later=TIMES)
    def prune(self, later: float) -> None:
        self.model.prune(self.now + later)
        self.lane.cache_prune(self.now + later)

    @rule()
    def take_and_put_back(self) -> None:
        taken = self.lane.cache_take()
        want = [
            (client, rid, "svc", reply.status, reply.body, expires)
            for (client, rid), (expires, _, reply) in self.model._entries.items()
        ]
        assert taken == want
        assert (self.lane.cache_count(), self.lane.cache_bytes()) == (0, 0)
        for client, rid, service, status, body, expires in taken:  # as the ledger would
            self.lane.cache_put(client, rid, service, status, body, expires)

    @invariant()
    def sizes(self) -> None:
        assert self.lane.cache_count() == len(self.model)
        assert self.lane.cache_bytes() == self.model._bytes


def test_the_cache_is_the_twin_of_reply_cache() -> None:
    run_state_machine_as_test(
        CacheTwin, settings=settings(max_examples=60, stateful_step_count=40, deadline=None)
    )


# ---- S0P REQUEST and REPLY through the lane -------------------------------------------------


class S0P:
    """S0P peers of a Net: the lane's sessions say they speak S0P (majordomo 0)."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.lane = net.lane
        self.ids = itertools.count(1)
        self.client_ids: dict[bytes, bytes] = {}  # routing id -> the client_id last noted

    def worker(
        self, rid: bytes, service: str = "echo", capacity: int = 1, ids: bool = False
    ) -> Peer:
        dealer, fd = self.net.rig.dealer(BACK, rid)
        dealer.send(b"hello")  # through the lane to Python: the ROUTER knows it now
        assert self.net.rig.from_pipe(BACK) == [header(fd), rid, b"hello"]
        self.lane.negotiated(BACK, fd)
        self.lane.note(BACK, rid, 0, 0.0, time.monotonic(), 0)
        with locked(self.lane):
            self.net.pool.add(rid, (service,), capacity, ids)
            self.net.pool.list_ready(rid)
        return Peer(dealer, rid, fd, S0P_READING)

    def client(self, rid: bytes) -> Peer:
        dealer, fd = self.net.rig.dealer(FRONT, rid)
        self.lane.negotiated(FRONT, fd)
        self.note_client(rid)
        return Peer(dealer, rid, fd, S0P_READING)

    def note_client(self, rid: bytes, **kw: Any) -> None:
        kw.setdefault("client_id", b"b." + rid)
        self.client_ids[rid] = kw["client_id"]
        self.lane.note(FRONT, rid, 0, 0.0, time.monotonic(), 0, **kw)

    def request_id(self) -> bytes:
        return b"r%d" % next(self.ids)

    def ask(
        self,
        client: Peer,
        request_id: bytes | None = None,
        body: tuple[bytes, ...] = (b"hi",),
        service: str = "echo",
    ) -> bytes:
        """A REQUEST the lane must pass: it reaches the pipe intact; its request_id."""
        rq = request_id or self.request_id()
        frames = ClientRequest(service, rq, body).to_frames()
        assert self.net.send(client, frames, FRONT) == [[header(client.fd), client.rid, *frames]]
        return rq

    def dispatch(
        self,
        client: Peer,
        worker: Peer,
        request_id: bytes | None = None,
        body: tuple[bytes, ...] = (b"hi",),
        service: str = "echo",
        ids: bool = False,
    ) -> tuple[bytes, bytes]:
        """A REQUEST the lane must take: the worker gets exactly WorkerRequest (WorkerIdRequest
        with ``ids``); (its ticket, the request_id)."""
        rq = request_id or self.request_id()
        assert self.net.send(client, ClientRequest(service, rq, body).to_frames(), FRONT) == []
        return self.received(worker, client, rq, body, service, ids), rq

    def received(
        self,
        worker: Peer,
        client: Peer,
        rq: bytes,
        body: tuple[bytes, ...] = (b"hi",),
        service: str = "echo",
        ids: bool = False,
    ) -> bytes:
        got = recv(worker.dealer)
        ticket = got[3]
        expect: Any = (
            WorkerIdRequest(ticket, service, self.client_ids[client.rid].decode(), rq, body)
            if ids
            else WorkerRequest(ticket, service, body)
        )
        assert got == expect.to_frames()
        return ticket

    def answered(
        self,
        worker: Peer,
        client: Peer,
        ticket: bytes,
        rq: bytes,
        body: tuple[bytes, ...] = (b"done",),
        status: int = 200,
        service: str = "echo",
    ) -> None:
        """A final REPLY the lane must take: the client gets exactly ClientReply."""
        frames = WorkerReply(ticket, status, body).to_frames()
        assert self.net.send(worker, frames, BACK) == []
        assert recv(client.dealer) == ClientReply(service, rq, status, body).to_frames()

    def passed_reply(self, worker: Peer, frames: list[bytes]) -> None:
        assert self.net.send(worker, frames, BACK) == [[header(worker.fd), worker.rid, *frames]]


S0P_READING = Reading(b"S0P", False)


@pytest.fixture
def s0p(net: Net) -> S0P:
    return S0P(net)


def test_an_s0p_request_and_its_reply_go_through_the_lane(s0p: S0P) -> None:
    lane = s0p.lane
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    before = time.monotonic()
    body = (b"a", b"", b"c" * 3000)
    ticket, rq = s0p.dispatch(client, worker, body=body)
    assert ticket == ticket_of(2)  # (the request is numbered 1, its dispatch 2)
    assert lane.in_flight() == 1 and lane.held(b"b.c1") == 1
    with locked(lane):
        assert s0p.net.pool.tickets(b"w1") == [ticket]
    answer = (b"answer", b"", b"y" * 60000)
    s0p.answered(worker, client, ticket, rq, answer, status=203)
    assert lane.in_flight() == 0 and lane.held(b"b.c1") == 0 and not lane.busy(b"c1")
    with locked(lane):
        assert s0p.net.pool.tickets(b"w1") == [] and s0p.net.pool.queue("echo") == [b"w1"]
    # the reply is in the cache, under the client's key, for max_age_s
    assert lane.cache_get(b"b.c1", rq, time.monotonic()) == ("echo", 203, answer)
    assert lane.cache_count() == 1 and lane.cache_bytes() == sum(map(len, answer))
    [(cid, got_rq, service, status, got_body, expires)] = lane.cache_take()
    assert (cid, got_rq, service, status, got_body) == (b"b.c1", rq, "echo", 203, answer)
    assert before + 60.0 <= expires <= time.monotonic() + 60.0
    requests, replies, histograms, changed, _forwards, _forwarded = lane.drain()
    assert (requests, replies, changed) == (1, 1, ["echo"])
    [(service, status, counts, sum_s)] = histograms
    assert (service, status, sum(counts)) == ("echo", 203, 1)
    assert 0.0 <= sum_s <= time.monotonic() - before
    lane.stop()
    stats = lane.stats()
    assert (stats["requests"], stats["replies"], stats["cached"]) == (1, 1, 1)
    assert (
        stats["received"]
        == stats["beats"] + stats["requests"] + stats["replies"] + stats["passed"] + stats["lost"]
    )


def test_a_worker_that_asked_for_ids_gets_idrequest(s0p: S0P) -> None:
    worker = s0p.worker(b"w1", ids=True)
    client = s0p.client(b"c1")
    ticket, rq = s0p.dispatch(client, worker, body=(b"x", b""), ids=True)
    s0p.answered(worker, client, ticket, rq)
    with locked(s0p.lane):  # a new READY without the option: REQUEST again
        s0p.net.pool.add(b"w1", ("echo",), 1)
        s0p.net.pool.list_ready(b"w1")
    ticket, rq = s0p.dispatch(client, worker)
    s0p.answered(worker, client, ticket, rq)


S0pSpoil = Callable[[S0P, Peer, Peer, bytes], Callable[[], None]]


def _s_serve_off(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.serve(False, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)
    return lambda: s.lane.serve(True, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)


def _s_no_pool(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.attach_pool(None)
    return lambda: s.lane.attach_pool(s.net.pool)


def _s_speaks_majordomo(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.note(FRONT, c.rid, 0, 0.0, 0.0, pack(CLIENT_READINGS[1]), client_id=b"b." + c.rid)
    return lambda: s.note_client(c.rid)


def _s_promise(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.note(FRONT, c.rid, 5000, 0.0, 0.0, 0, client_id=b"b." + c.rid)
    return lambda: s.note_client(c.rid)


def _s_not_open(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.note_client(c.rid, open=False)
    return lambda: s.note_client(c.rid)


def _s_no_session(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.forget(FRONT, c.rid)
    return lambda: s.note_client(c.rid)


def _s_not_negotiated(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.gone(FRONT, c.fd)
    return lambda: s.lane.negotiated(FRONT, c.fd)


def _s_python_holds(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.python_holds(b"b." + c.rid, 10)
    return lambda: s.lane.python_holds(b"b." + c.rid, 9)


def _s_python_waits(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.python_waits("echo", 1)
    return lambda: s.lane.python_waits("echo", 0)


def _s_cap_zero(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.serve(True, TIMEOUT_S, 0, PREFIX, MAX_QUEUED, False)
    return lambda: s.lane.serve(True, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, False)


def _s_python_key(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.python_key(b"b." + c.rid, rq, True)
    s.lane.python_key(b"b." + c.rid, rq + b"-other", True)  # (another key: no matter)
    return lambda: s.lane.python_key(b"b." + c.rid, rq, False)


def _s_cached(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.cache_put(b"b." + c.rid, rq, "echo", 200, (b"old",), time.monotonic() + 600)

    def restore() -> None:  # expired: dropped by the next lookup, and the request taken
        s.lane.cache_put(b"b." + c.rid, rq, "echo", 200, (b"old",), time.monotonic() - 1)
        assert s.lane.cache_count() == 1

    return restore


def _s_worker_majordomo(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.note(BACK, w.rid, 0, 0.0, 0.0, pack(WORKER_READINGS[1]))
    return lambda: s.lane.note(BACK, w.rid, 0, 0.0, 0.0, 0)


def _s_worker_promise(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.note(BACK, w.rid, 5000, 0.0, 0.0, 0)
    return lambda: s.lane.note(BACK, w.rid, 0, 0.0, 0.0, 0)


def _s_worker_no_session(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    s.lane.forget(BACK, w.rid)
    return lambda: s.lane.note(BACK, w.rid, 0, 0.0, 0.0, 0)


def _s_worker_not_ready(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    with locked(s.lane):
        s.net.pool.hold(w.rid, b"python's")
        s.net.pool.list_ready(w.rid)

    def restore() -> None:
        with locked(s.lane):
            s.net.pool.release(w.rid, b"python's")
            s.net.pool.list_ready(w.rid)

    return restore


def _s_order(s: S0P, c: Peer, w: Peer, rq: bytes) -> Callable[[], None]:
    pipe = s.net.rig.pipes[FRONT]
    pipe.send(struct.pack("<Q", 0))
    c.dealer.send(b"python's")
    assert s.net.rig.from_pipe(FRONT) == [header(c.fd), c.rid, b"python's"]
    return lambda: pipe.send(struct.pack("<Q", ALL_DONE))


S0P_SPOILS: dict[str, S0pSpoil] = {
    "serve off": _s_serve_off,
    "no pool attached": _s_no_pool,
    "client speaks Majordomo": _s_speaks_majordomo,
    "promise": _s_promise,
    "not open": _s_not_open,
    "no session": _s_no_session,
    "fd not negotiated": _s_not_negotiated,
    "python holds": _s_python_holds,
    "python waits": _s_python_waits,
    "cap": _s_cap_zero,
    "python's key": _s_python_key,
    "cached": _s_cached,
    "worker speaks Majordomo": _s_worker_majordomo,
    "worker promise": _s_worker_promise,
    "worker without session": _s_worker_no_session,
    "no ready worker": _s_worker_not_ready,
    "order": _s_order,
}


@pytest.mark.parametrize("spoil", S0P_SPOILS.values(), ids=S0P_SPOILS.keys())
def test_each_s0p_request_condition_both_ways(s0p: S0P, spoil: S0pSpoil) -> None:
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    rq = b"the-one"
    restore = spoil(s0p, client, worker, rq)
    s0p.ask(client, rq)
    assert s0p.lane.in_flight() == 0 and s0p.lane.stats()["requests"] == 0
    restore()
    ticket, _ = s0p.dispatch(client, worker, rq)
    s0p.answered(worker, client, ticket, rq)


@pytest.mark.parametrize(
    "frames",
    [
        [b"", b"S0C1", b"REQUEST", b"echo"],  # no request_id
        [b"", b"S0C1", b"REQUEST", b"echo", b""],  # an empty request_id
        [b"", b"S0C1", b"REQUEST", b"echo", b"r" * 256],  # too long
        [b"", b"S0C1", b"REQUEST", b"echo", b"r1", b"x" * (MAX_FRAME + 1)],
        [b"", b"S0C1", b"REQUEST", b"mmi.service", b"r1"],  # reserved
        [b"", b"S0C1", b"REQUEST", b"scale0.status", b"r1"],
        [b"", b"S0C1", b"REQUEST", b"ec\x01ho", b"r1"],  # a control character
        [b"", b"S0C1", b"REQUEST", b"\xff", b"r1"],  # not UTF-8
        [b"", b"S0C1", b"REQUEST", b"", b"r1"],  # no service
        [b"S0C1", b"REQUEST", b"echo", b"r1"],  # no empty frame
        [b"", b"S0C2", b"REQUEST", b"echo", b"r1"],
        [b"", b"S0C1", b"PARTIAL", b"echo", b"r1"],
        [b"", b"S0W1", b"REQUEST", b"echo", b"r1"],
    ],
)
def test_what_is_not_exactly_an_s0p_request_is_passed_intact(s0p: S0P, frames: list[bytes]) -> None:
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    assert s0p.net.send(client, frames, FRONT) == [[header(client.fd), client.rid, *frames]]
    assert s0p.lane.in_flight() == 0
    ticket, rq = s0p.dispatch(client, worker, b"r1")  # (and the same one, well formed, is taken)
    s0p.answered(worker, client, ticket, rq)


def test_a_resend_of_a_key_in_flight_is_passed_and_adopt_key_finds_it(s0p: S0P) -> None:
    worker = s0p.worker(b"w1", capacity=2)
    client = s0p.client(b"c1")
    before = time.monotonic()
    ticket, _ = s0p.dispatch(client, worker, b"again", body=(b"p", b""))  # seq 1, ticket 2
    assert ticket == ticket_of(2)
    s0p.ask(client, b"again")  # R10: Python joins it (passed before the numbering point)
    with locked(s0p.lane):
        assert s0p.lane.adopt_key(b"b.c1", b"other") is None
        record = s0p.lane.adopt_key(b"b.c1", b"again")
        assert s0p.lane.adopt_key(b"b.c1", b"again") is None
        assert s0p.net.pool.tickets(b"w1") == [ticket]  # its slot stays held
    assert record is not None
    t, wrid, crid, cid, caller, service, body, started, deadline, request_id, seq, ids = record[:12]
    assert record[12:] == (b"", "", float("inf"), "")  # (not forwarded either way)
    assert (t, wrid, crid, cid, caller, service, body) == (
        ticket,
        b"w1",
        b"c1",
        b"b.c1",
        "",
        "echo",
        (b"p", b""),
    )
    assert before <= started <= time.monotonic() and deadline == started + TIMEOUT_S
    assert request_id == b"again" and seq == 1 and ids is True
    assert s0p.lane.in_flight() == 0 and s0p.lane.stats()["handed"] == 1
    # its REPLY is Python's now (the ticket is no record of the lane's)
    s0p.passed_reply(worker, WorkerReply(ticket, 200, (b"x",)).to_frames())
    # and the key is free in the lane again
    ticket2, _ = s0p.dispatch(client, worker, b"again")
    assert ticket2 == ticket_of(4)
    with locked(s0p.lane):
        # (seq 3: the first took 1 and its ticket 2; a request passed for its key is numbered
        # by Python, not the lane)
        assert s0p.lane.adopt(ticket2)[9:12] == (b"again", 3, True)


def test_a_key_answered_by_the_lane_is_passed_while_cached(s0p: S0P) -> None:
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    ticket, rq = s0p.dispatch(client, worker, b"k")
    s0p.answered(worker, client, ticket, rq)
    s0p.ask(client, b"k")  # the cache answers it (Python's cache_get)
    s0p.lane.cache_limits(10, 1000, 0.0)
    assert s0p.lane.cache_take() != []
    ticket, rq = s0p.dispatch(client, worker, b"k")
    s0p.answered(worker, client, ticket, rq)  # cached for 0 s: the next batch finds it expired
    time.sleep(0.001)
    ticket, rq = s0p.dispatch(client, worker, b"k")
    s0p.answered(worker, client, ticket, rq)


def test_the_same_request_id_of_another_client_is_another_key(s0p: S0P) -> None:
    worker = s0p.worker(b"w1", capacity=2)
    a = s0p.client(b"ca")
    b = s0p.client(b"cb")
    ta, _ = s0p.dispatch(a, worker, b"same")
    tb, _ = s0p.dispatch(b, worker, b"same")
    s0p.answered(worker, b, tb, b"same")
    s0p.answered(worker, a, ta, b"same")


@pytest.mark.parametrize(
    "status",
    [b"099", b"600", b"20", b"2000", b"2x0", b" 200", b"\xd9\xa0\xd9\xa0\xd9\xa0"],
)
def test_a_reply_whose_status_is_not_status_frame_s_is_passed(s0p: S0P, status: bytes) -> None:
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    ticket, rq = s0p.dispatch(client, worker)
    s0p.passed_reply(worker, [b"", b"S0W1", b"REPLY", ticket, status, b"x"])
    s0p.answered(worker, client, ticket, rq, status=599)


@pytest.mark.parametrize(
    "make",
    [
        lambda t: [b"", b"S0W1", b"REPLY", t],  # no status
        lambda t: [b"", b"S0W1", b"PARTIAL", t, b"200"],
        lambda t: [b"", b"S0W1", b"REPLY", t + b"?", b"200"],  # not a ticket of the lane's
        lambda t: [b"", b"S0C1", b"REPLY", t, b"200"],
        lambda t: [b"S0W1", b"REPLY", t, b"200"],
        lambda t: [b"", b"S0W1", b"REPLY", t, b"200", b"x" * (MAX_FRAME + 1)],
        lambda t: MdpWorkerReply(t, (b"x",), protocol=MDPW02, delimited=True).to_frames(),
    ],
)
def test_what_is_not_exactly_an_s0p_final_reply_to_an_s0p_record_is_passed(
    s0p: S0P, make: Callable[[bytes], list[bytes]]
) -> None:
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    ticket, rq = s0p.dispatch(client, worker)
    s0p.passed_reply(worker, make(ticket))
    s0p.answered(worker, client, ticket, rq)


def test_another_worker_s_reply_to_an_s0p_ticket_is_passed(s0p: S0P) -> None:
    worker = s0p.worker(b"w1")
    other = s0p.worker(b"w2")
    client = s0p.client(b"c1")
    ticket, rq = s0p.dispatch(client, worker)
    s0p.passed_reply(other, WorkerReply(ticket, 200, ()).to_frames())
    s0p.answered(worker, client, ticket, rq)


def test_an_s0p_reply_to_a_majordomo_record_is_passed(net: Net, s0p: S0P) -> None:
    worker = net.worker(b"w1")  # MDPW02
    client = net.client(b"c1")
    ticket = net.dispatch(client, worker)
    frames = WorkerReply(ticket, 200, (b"x",)).to_frames()
    assert net.send(worker, frames, BACK) == [[header(worker.fd), worker.rid, *frames]]
    net.answered(worker, client, ticket)


def test_mixed_families_are_passed(net: Net, s0p: S0P) -> None:
    net.worker(b"wm")  # offers echo
    s0p_client = s0p.client(b"cs")
    s0p.ask(s0p_client)  # the LRU ready worker speaks Majordomo
    with locked(net.lane):
        net.pool.remove(b"wm")
    s0p_worker = s0p.worker(b"ws")
    mdp_client = net.client(b"cm")
    net.ask(mdp_client)  # the LRU ready worker speaks S0P
    ticket, rq = s0p.dispatch(s0p_client, s0p_worker)
    s0p.answered(s0p_worker, s0p_client, ticket, rq)


def _queueing(net: Net) -> None:
    net.lane.serve(True, TIMEOUT_S, 10, PREFIX, MAX_QUEUED, True)


def test_an_s0p_request_queues_and_a_freed_s0p_worker_gets_the_head(s0p: S0P) -> None:
    _queueing(s0p.net)
    worker = s0p.worker(b"w1", ids=True)
    client = s0p.client(b"c1")
    ticket, rq = s0p.dispatch(client, worker, ids=True)  # seq 1, ticket 2
    assert ticket == ticket_of(2)
    queued = s0p.request_id()
    frames = ClientRequest("echo", queued, (b"q",)).to_frames()
    assert s0p.net.send(client, frames, FRONT) == []
    assert s0p.lane.waiting("echo") == 1
    head = s0p.lane.waiting_head("echo")
    assert head is not None and head[:2] == (b"", b"") and head[9:12] == (queued, 3, True)
    s0p.answered(worker, client, ticket, rq)
    next_ticket = s0p.received(worker, client, queued, (b"q",), ids=True)
    assert next_ticket == ticket_of(4) and s0p.lane.waiting("echo") == 0
    s0p.answered(worker, client, next_ticket, queued)


def test_adopt_key_takes_a_waiting_record_out_of_its_queue(s0p: S0P) -> None:
    _queueing(s0p.net)
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    s0p.dispatch(client, worker)
    frames = ClientRequest("echo", b"w", ()).to_frames()
    assert s0p.net.send(client, frames, FRONT) == []
    with locked(s0p.lane):
        record = s0p.lane.adopt_key(b"b.c1", b"w")
    assert record is not None and record[:2] == (b"", b"") and record[9] == b"w"
    assert s0p.lane.waiting_total() == 0 and s0p.lane.held(b"b.c1") == 1


@pytest.mark.parametrize("head_family", ["majordomo", "s0p"])
def test_a_queue_head_of_the_other_family_makes_the_reply_pass(
    net: Net, s0p: S0P, head_family: str
) -> None:
    _queueing(net)
    mdp_client = net.client(b"cm")
    s0p_client = s0p.client(b"cs")
    if head_family == "majordomo":  # an S0P worker busy, a Majordomo request queued
        worker = s0p.worker(b"w1")
        ticket, _ = s0p.dispatch(s0p_client, worker)
        assert net.send(mdp_client, request("echo", (b"q",), mdp_client.reading), FRONT) == []
        frames = WorkerReply(ticket, 200, (b"x",)).to_frames()
    else:  # a Majordomo worker busy, an S0P request queued
        worker = net.worker(b"w1")
        ticket = net.dispatch(mdp_client, worker)
        queued = ClientRequest("echo", b"q1", (b"q",)).to_frames()
        assert net.send(s0p_client, queued, FRONT) == []
        frames = net.reply_frames(worker, ticket)
    assert net.lane.waiting("echo") == 1
    assert net.send(worker, frames, BACK) == [[header(worker.fd), worker.rid, *frames]]
    assert net.lane.in_flight() == 1 and net.lane.waiting("echo") == 1


def test_a_majordomo_note_leaves_an_s0p_record_s0p(s0p: S0P) -> None:
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    ticket, rq = s0p.dispatch(client, worker)
    s0p.lane.note(FRONT, b"c1", 0, 0.0, 0.0, pack(CLIENT_READINGS[0]), client_id=b"b.c1")
    s0p.answered(worker, client, ticket, rq)  # still ClientReply


def test_drain_has_one_histogram_per_service_and_status(net: Net, s0p: S0P) -> None:
    a = s0p.worker(b"wa", service="alpha", capacity=3)
    b = net.worker(b"wb", service="beta")
    sc = s0p.client(b"cs")
    mc = net.client(b"cm")
    t1, r1 = s0p.dispatch(sc, a, service="alpha")
    t2, r2 = s0p.dispatch(sc, a, service="alpha")
    t3, r3 = s0p.dispatch(sc, a, service="alpha")
    tb = net.dispatch(mc, b, service="beta")
    net.lane.drain()
    s0p.answered(a, sc, t1, r1, status=503, service="alpha")
    s0p.answered(a, sc, t2, r2, status=200, service="alpha")
    s0p.answered(a, sc, t3, r3, status=503, service="alpha")
    net.answered(b, mc, tb, service="beta")
    requests, replies, histograms, changed, _forwards, _forwarded = net.lane.drain()
    assert (requests, replies, changed) == (0, 4, ["alpha", "beta"])
    assert [(s, st_, sum(c)) for s, st_, c, _ in histograms] == [
        ("alpha", 200, 1),
        ("alpha", 503, 2),
        ("beta", 200, 1),
    ]
    assert net.lane.stats()["cached"] == 3  # (Majordomo replies are not cached)


# ---- a state machine: S0P clients sharing client_ids, S0P workers, R10 and the cache ---------


class S0pLaneMachine(RuleBasedStateMachine):
    """Random S0P requests (request_ids from a small set, clients sharing client_ids, so keys
    collide), replies, adoptions, Python's keys and the cache, against a model of the rule.
    The shared counter is tracked exactly: a request that reaches the numbering point
    (serving, under the cap, its key neither Python's, the lane's nor cached) takes the next
    number, taken or not; each dispatch by the lane (at take, or a freed worker's head) the
    next; Python's own (next_seq) the next."""

    SERVICES = ("echo", "other")
    REQUEST_IDS = (b"a", b"b", b"c")

    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig()
        self.net = Net(self.rig)
        self.s = S0P(self.net)
        self.lane = self.net.lane
        self.cap = 3
        self.serving = True
        self.max_queued = 2
        self.lane.serve(True, TIMEOUT_S, self.cap, PREFIX, self.max_queued, True)
        self.waits: dict[str, int] = {}
        self.workers = [
            self.s.worker(b"w0", "echo", 2, ids=True),
            self.s.worker(b"w1", "echo", 1),
            self.s.worker(b"w2", "other", 1, ids=True),
        ]
        self.ids = {b"w0": True, b"w1": False, b"w2": True}
        self.service_of = {b"w0": "echo", b"w1": "echo", b"w2": "other"}
        self.clients = [self.s.client(b"c%d" % n) for n in range(4)]
        self.client_id = {c.rid: b"id-%d" % (n % 3) for n, c in enumerate(self.clients)}
        for c in self.clients:
            self.s.note_client(c.rid, client_id=self.client_id[c.rid])
        # in flight: ticket -> (worker, client, service, request_id, body)
        self.records: dict[bytes, tuple[Peer, Peer, str, bytes, tuple[bytes, ...]]] = {}
        # waiting, per service: (client, request_id, body), first in first out
        self.queues: dict[str, list[tuple[Peer, bytes, tuple[bytes, ...]]]] = {
            s: [] for s in self.SERVICES
        }
        self.python: dict[bytes, bytes] = {}  # adopted in flight: ticket -> worker rid
        self.python_keys: set[tuple[bytes, bytes]] = set()
        self.cache: dict[tuple[bytes, bytes], tuple[str, int, tuple[bytes, ...]]] = {}
        self.seq = 0  # the shared counter's last number given
        self.bodies = itertools.count()

    def teardown(self) -> None:
        self.rig.close()

    def key(self, client: Peer, rq: bytes) -> tuple[bytes, bytes]:
        return (self.client_id[client.rid], rq)

    def lane_keys(self) -> set[tuple[bytes, bytes]]:
        held = [(r[1], r[3]) for r in self.records.values()]
        held += [(c, rq) for q in self.queues.values() for c, rq, _b in q]
        return {self.key(c, rq) for c, rq in held}

    def held(self, cid: bytes) -> int:
        clients = [r[1] for r in self.records.values()]
        clients += [c for q in self.queues.values() for c, _rq, _b in q]
        return sum(1 for c in clients if self.client_id[c.rid] == cid)

    @initialize(busy=st.booleans())
    def start(self, busy: bool) -> None:
        """Half the runs start with every worker's slots taken and one request waiting per
        service, so a REPLY gives its worker the head (rare from random steps alone)."""
        if busy:
            for n, rq, service in ((0, b"a", "echo"), (1, b"a", "echo"), (2, b"a", "echo")):
                self.request(n, rq, service)
            self.request(3, b"b", "other")
            assert len(self.records) == 4 and self.seq == 8  # (each numbered, then its ticket)
            self.request(0, b"c", "echo")
            self.request(1, b"b", "other")
            assert [len(q) for q in self.queues.values()] == [1, 1] and self.seq == 10

    @rule(
        n=st.integers(0, 3),
        rq=st.sampled_from(REQUEST_IDS),
        service=st.sampled_from(SERVICES),
    )
    def request(self, n: int, rq: bytes, service: str) -> None:
        client = self.clients[n]
        key = self.key(client, rq)
        body = (b"body-%d" % next(self.bodies),)
        with locked(self.lane):
            ready = self.net.pool.queue(service)
        waits = self.waits.get(service, 0)
        if not (
            self.serving
            and self.held(key[0]) < self.cap
            and key not in self.python_keys
            and key not in self.lane_keys()
            and key not in self.cache
        ):
            self.s.ask(client, rq, body, service)
            return
        self.seq += 1  # the numbering point: numbered, taken or not
        if ready:
            if waits:
                self.s.ask(client, rq, body, service)
                return
            worker = next(w for w in self.workers if w.rid == ready[0])
            ticket, _ = self.s.dispatch(client, worker, rq, body, service, self.ids[worker.rid])
            self.seq += 1  # the dispatch's own number
            assert ticket == ticket_of(self.seq)
            self.records[ticket] = (worker, client, service, rq, body)
        elif waits + len(self.queues[service]) < self.max_queued:
            frames = ClientRequest(service, rq, body).to_frames()
            assert self.net.send(client, frames, FRONT) == []
            self.queues[service].append((client, rq, body))
        else:
            self.s.ask(client, rq, body, service)

    @rule(data=st.data(), w=st.integers(0, 2), status=st.sampled_from([200, 404, 599]))
    def reply(self, data: st.DataObject, w: int, status: int) -> None:
        ticket = data.draw(st.sampled_from([*sorted([*self.records, *self.python]), b"nope"]))
        self.reply_from(self.workers[w], ticket, status)

    @rule(data=st.data(), status=st.sampled_from([200, 404, 599]))
    def answer(self, data: st.DataObject, status: int) -> None:
        """The worker of one of the lane's tickets answers it (reply's any worker rarely is)."""
        if self.records:
            ticket = data.draw(st.sampled_from(sorted(self.records)))
            self.reply_from(self.records[ticket][0], ticket, status)

    def reply_from(self, worker: Peer, ticket: bytes, status: int) -> None:
        record = self.records.get(ticket)
        service = self.service_of[worker.rid]
        body = (b"answer-%d" % next(self.bodies),)
        if (
            record is not None
            and record[0] is worker
            and self.serving
            and not self.waits.get(service, 0)
        ):
            _, client, rservice, rq, _body = self.records.pop(ticket)
            self.s.answered(worker, client, ticket, rq, body, status, rservice)
            key = self.key(client, rq)
            self.cache.pop(key, None)
            self.cache[key] = (rservice, status, body)
            queue = self.queues[service]
            if queue:
                client, rq, qbody = queue.pop(0)
                self.seq += 1  # the dispatch's number
                got = self.s.received(worker, client, rq, qbody, service, self.ids[worker.rid])
                assert got == ticket_of(self.seq)
                self.records[got] = (worker, client, service, rq, qbody)
            return
        self.s.passed_reply(worker, WorkerReply(ticket, status, body).to_frames())
        if self.python.get(ticket) == worker.rid:
            del self.python[ticket]
            with locked(self.lane):
                assert self.net.pool.release(worker.rid, ticket)
                self.net.pool.list_ready(worker.rid)

    @rule(n=st.integers(0, 3), rq=st.sampled_from(REQUEST_IDS))
    def adopt_key(self, n: int, rq: bytes) -> None:
        client = self.clients[n]
        key = self.key(client, rq)
        with locked(self.lane):
            record = self.lane.adopt_key(*key)
        ticket = next((t for t, r in self.records.items() if self.key(r[1], r[3]) == key), None)
        if ticket is not None:
            worker, owner, service, _, body = self.records.pop(ticket)
            assert record is not None
            assert record[:3] == (ticket, worker.rid, owner.rid)
            assert (record[3], record[5], record[6], record[9], record[11]) == (
                key[0],
                service,
                body,
                rq,
                True,
            )
            self.python[ticket] = worker.rid
            return
        for service, queue in self.queues.items():
            for i, (owner, qrq, body) in enumerate(queue):
                if self.key(owner, qrq) == key:
                    del queue[i]
                    assert record is not None
                    assert record[:3] == (b"", b"", owner.rid) and record[5:7] == (service, body)
                    return
        assert record is None

    @rule(n=st.integers(0, 2), rq=st.sampled_from(REQUEST_IDS), live=st.booleans())
    def python_key(self, n: int, rq: bytes, live: bool) -> None:
        key = (b"id-%d" % n, rq)
        self.lane.python_key(*key, live)
        if live:
            self.python_keys.add(key)
        else:
            self.python_keys.discard(key)

    @rule()
    def cache_take(self) -> None:
        taken = self.lane.cache_take()
        assert [t[:5] for t in taken] == [(*k, *v) for k, v in self.cache.items()]
        self.cache.clear()

    @rule()
    def next_seq(self) -> None:
        """Python numbers one of its own requests, or a ticket (Core.next_ticket)."""
        self.seq += 1
        assert self.lane.next_seq() == self.seq

    @rule(on=st.booleans(), max_queued=st.integers(0, 2))
    def serve(self, on: bool, max_queued: int) -> None:
        self.serving, self.max_queued = on, max_queued
        self.lane.serve(on, TIMEOUT_S, self.cap, PREFIX, max_queued, True)

    @rule(service=st.sampled_from(SERVICES), count=st.integers(0, 1))
    def python_waits(self, service: str, count: int) -> None:
        self.lane.python_waits(service, count)
        self.waits[service] = count

    @invariant()
    def counts(self) -> None:
        assert self.lane.in_flight() == len(self.records)
        assert self.lane.waiting_total() == sum(map(len, self.queues.values()))
        assert self.lane.python_keys() == len(self.python_keys)
        assert self.lane.cache_count() == len(self.cache)


def test_the_s0p_rule_holds_over_random_runs() -> None:
    run_state_machine_as_test(
        S0pLaneMachine, settings=settings(max_examples=30, stateful_step_count=30, deadline=None)
    )


# ---- the C API's version and bad arguments --------------------------------------------------

OLD_POOL = """
import sys
from tests.extensions import load_extension
load_extension("scale0.core._pool", sys.argv[1])
import zmq
from scale0.core._pool import Pool
from scale0.net._zmqio import Lane
ctx = zmq.Context()
socks = [ctx.socket(zmq.PAIR) for _ in range(4)]
lane = Lane(*(s.underlying for s in socks), False, False, 1024)
try:
    lane.attach_pool(Pool())
except ImportError as e:
    print(e)
else:
    print("attached")
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc here to build the old pool")
def test_the_lane_refuses_a_pool_of_api_version_2(tmp_path: Path) -> None:
    """A pool built before ids_of (S0_POOL_API_VERSION 2) has no ids_of: the lane refuses it."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "core").mkdir()
    shutil.copy(root / "scale0" / "_table.h", tmp_path / "_table.h")
    shutil.copy(root / "scale0" / "core" / "_pool.c", tmp_path / "core" / "_pool.c")
    header_text = (root / "scale0" / "core" / "_pool_api.h").read_text()
    assert "#define S0_POOL_API_VERSION 3" in header_text
    old = header_text.replace("#define S0_POOL_API_VERSION 3", "#define S0_POOL_API_VERSION 2")
    (tmp_path / "core" / "_pool_api.h").write_text(old)
    out = tmp_path / "_pool.so"
    include = sysconfig.get_paths()["include"]
    source = str(tmp_path / "core" / "_pool.c")
    subprocess.run(
        ["gcc", "-O0", "-shared", "-fPIC", f"-I{include}", "-o", str(out), source],
        check=True,
        capture_output=True,
        timeout=300,
    )
    done = subprocess.run(
        [sys.executable, "-c", OLD_POOL, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        check=True,
    )
    assert done.stdout.strip() == (
        "Lane.attach_pool: scale0.core._pool's C API is version 2, this lane speaks 3 "
        "(rebuild both)"
    )


def test_the_new_methods_name_bad_arguments(rig: Rig) -> None:
    lane = rig.lane
    with pytest.raises(TypeError):
        lane.python_key("c", b"1", True)
    with pytest.raises(TypeError):
        lane.python_key(b"c", b"1")  # (live is not optional)
    with pytest.raises(TypeError):
        lane.adopt_key(b"c", "1")
    with pytest.raises(ValueError, match="now is NaN"):
        lane.cache_get(b"c", b"1", float("nan"))
    with pytest.raises(ValueError, match="now is NaN"):
        lane.cache_prune(float("nan"))
    with pytest.raises(TypeError):
        lane.cache_prune("now")
    assert lane.python_keys() == 0 and lane.cache_count() == 0
