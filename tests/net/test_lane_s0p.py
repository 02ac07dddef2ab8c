"""The C lane's S0P half (issue 14, phase 3b, the rest): the pool's ``ids``, R10's keys, the reply
cache in C, and S0P client REQUESTs for S0P workers and their final REPLYs.

Real sockets on 127.0.0.1 (tests/net/test_lane.py's Rig) and a real scale0.core._pool.Pool
shared with the lane, as tests/net/test_lane_requests.py. Every frame a peer sends is built by
scale0.wire's classes and every frame the lane sends is compared byte for byte with what they
write. Each take condition is shown both ways. The reply cache is held to
scale0.core.requests.ReplyCache by a Hypothesis state machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from scale0.core.requests import ReplyCache
from scale0.wire.client import ClientReply
from tests.net.test_lane import Lane, Rig
from tests.net.test_lane_requests import Net, Pool, locked

pytestmark = pytest.mark.skipif(
    Lane is None or Pool is None, reason="scale0.net._zmqio or scale0.core._pool not built here"
)


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
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
