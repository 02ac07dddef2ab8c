"""The lane's RequestDone ring (scale0/net/_lane.c "The RequestDone ring"; issue 14, phase 3b:
the lane serves while the broker writes an event log): record_done, done_capacity, done_drain,
and the stats done / done_full, against real sockets through a started lane."""

from __future__ import annotations

import time
from typing import Any

import pytest

from scale0.core.majordomo import Reading
from tests.net.test_lane import Lane, Rig, recv, rig
from tests.net.test_lane_requests import (
    CLIENT_READINGS,
    Net,
    Peer,
    Pool,
    _queueing,
    busy_worker,
    locked,
    pack,
    queue_up,
)
from tests.net.test_lane_s0p import S0P

__all__ = ["rig"]  # (a fixture: tests/net/test_lane.py's, used by name)

pytestmark = pytest.mark.skipif(
    Lane is None or Pool is None, reason="scale0.net._zmqio or scale0.core._pool not built here"
)


@pytest.fixture
def net(rig: Rig) -> Net:
    return Net(rig)


@pytest.fixture
def s0p(net: Net) -> S0P:
    return S0P(net)


def balanced(stats: dict[str, int]) -> bool:
    return (
        stats["received"]
        == stats["beats"] + stats["requests"] + stats["replies"] + stats["passed"] + stats["lost"]
    )


def s0p_round(
    s0p: S0P,
    client: Peer,
    worker: Peer,
    body: tuple[bytes, ...] = (b"hi",),
    answer: tuple[bytes, ...] = (b"done",),
    status: int = 200,
) -> None:
    ticket, rq = s0p.dispatch(client, worker, body=body)
    s0p.answered(worker, client, ticket, rq, answer, status=status)


# ---- one record per final REPLY, every field -------------------------------------------------


@pytest.mark.parametrize("status", [203, 500])
def test_an_s0p_reply_the_lane_takes_makes_one_record(s0p: S0P, status: int) -> None:
    lane = s0p.lane
    lane.record_done(True)
    worker = s0p.worker(b"w1")
    client = s0p.client(b"c1")
    body = (b"a", b"", b"c" * 3000)
    answer = (b"answer", b"", b"y" * 60000)
    before = time.monotonic()
    ticket, rq = s0p.dispatch(client, worker, body=body)
    between = time.monotonic()
    s0p.answered(worker, client, ticket, rq, answer, status=status)
    after = time.monotonic()
    [record] = lane.done_drain()
    service, wrid, crid, started, finished, bytes_in, bytes_out, got_status, via = record
    assert (service, wrid, crid, got_status, via) == ("echo", b"w1", b"c1", status, "")
    assert (bytes_in, bytes_out) == (3001, 60006)
    assert before <= started <= between <= finished <= after
    assert isinstance(bytes_in, int) and isinstance(bytes_out, int)
    assert lane.done_drain() == []
    stats = lane.stats()
    assert (stats["replies"], stats["done"], stats["done_full"]) == (1, 1, 0)


@pytest.mark.parametrize("client_reading", CLIENT_READINGS, ids=pack)
def test_a_majordomo_reply_the_lane_takes_makes_one_record_of_status_200(
    net: Net, client_reading: Reading
) -> None:
    lane = net.lane
    lane.record_done(True)
    worker = net.worker(b"w1")
    client = net.client(b"c1", client_reading)
    body = (b"frame one", b"", b"x" * 60000)
    answer = (b"answer", b"yz")
    before = time.monotonic()
    ticket = net.dispatch(client, worker, body)
    between = time.monotonic()
    net.answered(worker, client, ticket, answer)
    after = time.monotonic()
    [(service, wrid, crid, started, finished, bytes_in, bytes_out, status, via)] = lane.done_drain()
    assert (service, wrid, crid, status, via) == ("echo", b"w1", b"c1", 200, "")
    assert (bytes_in, bytes_out) == (60009, 8)
    assert before <= started <= between <= finished <= after
    lane.stop()
    stats = lane.stats()
    assert (stats["replies"], stats["done"], stats["done_full"]) == (1, 1, 0)
    assert balanced(stats)


def test_an_empty_body_counts_zero_bytes(s0p: S0P) -> None:
    s0p.lane.record_done(True)
    s0p_round(s0p, s0p.client(b"c1"), s0p.worker(b"w1"), body=(), answer=())
    [record] = s0p.lane.done_drain()
    assert record[5:] == (0, 0, 200, "")


def test_off_by_default_and_off_makes_none(s0p: S0P) -> None:
    lane = s0p.lane
    worker, client = s0p.worker(b"w1"), s0p.client(b"c1")
    s0p_round(s0p, client, worker)
    assert lane.done_drain() == []
    lane.record_done(True)
    lane.record_done(False)
    s0p_round(s0p, client, worker)
    assert lane.done_drain() == []
    stats = lane.stats()
    assert (stats["replies"], stats["done"], stats["done_full"]) == (2, 0, 0)


def test_turning_it_off_keeps_what_the_ring_holds(s0p: S0P) -> None:
    lane = s0p.lane
    worker, client = s0p.worker(b"w1"), s0p.client(b"c1")
    lane.record_done(True)
    s0p_round(s0p, client, worker, status=201)
    lane.record_done(False)
    s0p_round(s0p, client, worker, status=202)
    assert [r[7] for r in lane.done_drain()] == [201]
    assert lane.stats()["done"] == 1


def test_records_come_in_the_order_the_replies_were_taken(s0p: S0P, net: Net) -> None:
    lane = s0p.lane
    lane.record_done(True)
    w1, w2 = s0p.worker(b"w1"), s0p.worker(b"w2", service="other")
    c1, c2 = s0p.client(b"c1"), s0p.client(b"c2")
    t1, rq1 = s0p.dispatch(c1, w1)
    t2, rq2 = s0p.dispatch(c2, w2, service="other")
    s0p.answered(w2, c2, t2, rq2, (b"second",), status=202, service="other")
    s0p.answered(w1, c1, t1, rq1, (b"first",), status=201)
    # a Majordomo one after them
    mw, mc = net.worker(b"mw", service="mdp"), net.client(b"mc")
    net.answered(mw, mc, net.dispatch(mc, mw, service="mdp"), service="mdp")
    got = [(r[0], r[1], r[2], r[7]) for r in lane.done_drain()]
    assert got == [
        ("other", b"w2", b"c2", 202),
        ("echo", b"w1", b"c1", 201),
        ("mdp", b"mw", b"mc", 200),
    ]


def test_a_head_lent_to_python_s_worker_and_one_given_at_a_reply_are_recorded(net: Net) -> None:
    """A queued request keeps the started of when the lane took it, whoever dispatches it."""
    lane = net.lane
    lane.record_done(True)
    _queueing(net)
    client = net.client(b"c1")
    before = time.monotonic()
    w1, first = busy_worker(net, b"w1", client)
    queue_up(net, client, (b"lent",))
    queue_up(net, client, (b"given", b"!"))
    queued = time.monotonic()
    w2 = net.worker(b"w2")
    with locked(lane):  # Python frees w2 and lends it the lane's head under its own ticket
        assert net.pool.take("echo") == b"w2"
        net.pool.hold(b"w2", b"py-7")
        lane.dispatch_head("echo", b"py-7", b"w2")
    answered = time.monotonic()
    net.answered(w2, client, b"py-7", (b"one",))  # w2 then gets the next head
    second = recv(w2.dealer)[3]
    net.answered(w2, client, second, (b"two", b"2"))
    net.answered(w1, client, first, (b"three",))
    after = time.monotonic()
    records = lane.done_drain()
    assert [(r[1], r[5], r[6]) for r in records] == [(b"w2", 4, 3), (b"w2", 6, 4), (b"w1", 2, 5)]
    for _service, _w, crid, started, finished, _i, _o, status, via in records:
        assert (crid, status, via) == (b"c1", 200, "")
        assert before <= started <= queued <= answered <= finished <= after


# ---- the bound ------------------------------------------------------------------------------


def test_a_full_ring_passes_the_reply_to_python_unchanged(s0p: S0P) -> None:
    lane = s0p.lane
    lane.record_done(True)
    lane.done_capacity(2)
    w1, client = s0p.worker(b"w1"), s0p.client(b"c1")
    s0p_round(s0p, client, w1, status=201)
    s0p_round(s0p, client, w1, status=202)
    ticket, rq = s0p.dispatch(client, w1)
    frames = [b"", b"S0W1", b"REPLY", ticket, b"203", b"third"]
    s0p.passed_reply(w1, frames)  # (the lane answers nothing: the pipe has it intact)
    stats = lane.stats()
    assert (stats["replies"], stats["done"], stats["done_full"]) == (2, 2, 1)
    with locked(lane):  # Python adopts the record by its ticket, answers and logs it
        record = lane.adopt(ticket)
        assert record is not None and record[0] == ticket and record[9] == rq
        assert s0p.net.pool.release(b"w1", ticket)
        s0p.net.pool.list_ready(b"w1")
    assert [r[7] for r in lane.done_drain()] == [201, 202]
    # drained, there is room again: the next REPLY is the lane's
    s0p_round(s0p, client, w1, status=204)
    assert [r[7] for r in lane.done_drain()] == [204]
    lane.stop()
    stats = lane.stats()
    assert (stats["replies"], stats["done"], stats["done_full"], stats["handed"]) == (3, 3, 1, 1)
    assert balanced(stats)


def test_a_full_ring_passes_a_majordomo_reply_too(net: Net) -> None:
    lane = net.lane
    lane.record_done(True)
    lane.done_capacity(1)
    worker, client = net.worker(b"w1"), net.client(b"c1")
    net.answered(worker, client, net.dispatch(client, worker))
    ticket = net.dispatch(client, worker)
    net.passed_reply(worker, net.reply_frames(worker, ticket))
    assert lane.stats()["done_full"] == 1
    assert len(lane.done_drain()) == 1


def test_the_ring_grows_past_its_first_slots_and_keeps_order(s0p: S0P) -> None:
    lane = s0p.lane
    lane.record_done(True)
    worker, client = s0p.worker(b"w1"), s0p.client(b"c1")
    statuses = [200 + i % 300 for i in range(150)]  # past the ring's first 64 slots, twice
    for status in statuses:
        s0p_round(s0p, client, worker, status=status)
    assert [r[7] for r in lane.done_drain()] == statuses
    assert lane.stats()["done"] == 150


def test_a_capacity_may_be_raised_and_lowered_while_empty(rig: Rig) -> None:
    lane = rig.lane
    lane.done_capacity(1)
    lane.done_capacity(65536)
    lane.done_capacity(2**40)  # (slots grow on demand: nothing is allocated for the bound)
    assert lane.done_drain() == []


@pytest.mark.parametrize(
    ("n", "error", "named"),
    [
        (0, ValueError, "must be >= 1, not 0"),
        (-5, ValueError, "must be >= 1, not -5"),
        ("2", TypeError, "cannot be interpreted as an integer"),
        (2.0, TypeError, "cannot be interpreted as an integer"),
    ],
)
def test_bad_capacities_are_refused(rig: Rig, n: Any, error: type[Exception], named: str) -> None:
    with pytest.raises(error, match=named):
        rig.lane.done_capacity(n)


def test_a_capacity_below_what_the_ring_holds_is_refused(s0p: S0P) -> None:
    lane = s0p.lane
    lane.record_done(True)
    worker, client = s0p.worker(b"w1"), s0p.client(b"c1")
    s0p_round(s0p, client, worker, status=201)
    s0p_round(s0p, client, worker, status=202)
    with pytest.raises(ValueError, match=r"n \(1\) is smaller than the 2 records"):
        lane.done_capacity(1)
    lane.done_capacity(2)  # as many as it holds: fine, and it is full now
    ticket, _rq = s0p.dispatch(client, worker)
    s0p.passed_reply(worker, [b"", b"S0W1", b"REPLY", ticket, b"200", b"x"])
    assert lane.stats()["done_full"] == 1
    assert [r[7] for r in lane.done_drain()] == [201, 202]  # (what it held, untouched)


def test_records_are_freed_at_dealloc(rig: Rig) -> None:
    """A lane dropped with records in its ring frees them (ASan's leak check, when built so)."""
    net = Net(rig)
    s0p = S0P(net)
    rig.lane.record_done(True)
    s0p_round(s0p, s0p.client(b"c1"), s0p.worker(b"w1"))
    assert rig.lane.stats()["done"] == 1
