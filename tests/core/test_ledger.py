"""The ledger's operations (scale0/core/ledger.py), one request and one worker at a time.

The rules that use them are tested through the broker (tests/core); these hold the Python
ledger to the meaning its docstring gives each operation, which a C ledger must keep too.
"""

from __future__ import annotations

import pytest

from scale0.core.ledger import C_POOL, CPoolLedger, Ledger, default_pool
from scale0.core.ports import LedgerPort
from scale0.core.requests import Pending
from scale0.core.workers import Worker
from scale0.wire.client import ClientReply
from tests.core.harness import Harness


def _pending(seq: int, client: bytes = b"alice", request_id: bytes = b"r1") -> Pending:
    return Pending(seq, b"conn-" + client, (client, request_id), "echo", request_id, (), 10.0)


def test_a_request_is_held_joinable_and_retired_everywhere_but_the_cache() -> None:
    ledger: LedgerPort = Ledger()
    first, second = _pending(1), _pending(2, request_id=b"r2")
    ledger.open(first)
    ledger.open(second)
    assert ledger.held(b"alice") == 2 and ledger.held(b"bob") == 0
    assert ledger.held_by_client() == {b"alice": 2}
    assert ledger.joinable((b"alice", b"r1")) is first
    assert ledger.open_at(1) is first and ledger.is_open(2)
    assert ledger.client_busy(b"conn-alice") and not ledger.client_busy(b"conn-bob")
    assert ledger.open_by_connection() == {b"conn-alice": 2}
    ledger.retire(first)
    assert first.done and not ledger.is_open(1) and ledger.open_at(1) is None
    assert ledger.joinable((b"alice", b"r1")) is None
    assert ledger.held_by_client() == {b"alice": 1}
    reply = ClientReply("echo", b"r1", 200, (b"ok",))
    ledger.cache(first.key, reply, 5.0)
    assert ledger.cached(first.key, 6.0) is reply and ledger.cached_count() == 1
    ledger.prune_cache(1000.0)
    assert ledger.cached(first.key, 1000.0) is None and ledger.cached_count() == 0


def test_a_forwarded_request_counts_against_no_client_and_joins_only_with_ids() -> None:
    ledger = Ledger()
    with_ids, without = _pending(1), _pending(2, client=b"\x00peer", request_id=b"t")
    with_ids.origin, with_ids.via = b"T1", "b2"
    without.origin, without.via, without.ids = b"T2", "b2", False
    ledger.open(with_ids)
    ledger.open(without)
    assert ledger.held_by_client() == {}
    assert ledger.joinable(with_ids.key) is with_ids
    assert ledger.joinable(without.key) is None
    assert ledger.held_from("b2") == {"echo": 2} and ledger.held_from("b3") == {}


def test_the_least_recently_used_worker_is_taken_and_its_slot_given_back() -> None:
    ledger = Ledger()
    w1 = Worker(b"W1", ("echo",), 1, True, 1.0)
    w2 = Worker(b"W2", ("echo", "other"), 1, True, 1.0)
    assert ledger.enroll(w1) is None and ledger.enroll(w2) is None
    ledger.list_ready(w1)
    ledger.list_ready(w2)
    assert ledger.offers("other") and not ledger.offers("nothing")
    assert ledger.offered() == ["echo", "other"] and ledger.workers_of("echo") == 2
    assert ledger.ready_count("echo") == 2 and ledger.worker_count() == 2
    taken = ledger.take_worker("echo")
    assert taken is w1 and ledger.ready_count("echo") == 1  # full: out of every queue
    pending = _pending(1)
    ledger.open(pending)
    ledger.dispatched(w1, b"t1", pending)
    assert (pending.ticket, pending.worker, pending.attempt) == (b"t1", b"W1", 1)
    assert ledger.running(b"t1") is pending and ledger.in_flight_count() == 1
    assert ledger.used(w1) == 1 and ledger.spare(w1) == 0 and ledger.tickets_of(w1) == [b"t1"]
    assert ledger.answer(b"t1", b"W2") is None  # not the worker that runs it (R14)
    assert ledger.running(b"t1") is pending
    assert ledger.answer(b"t1", b"W1") is pending
    assert pending.done and not ledger.is_open(1) and ledger.held(b"alice") == 0
    assert ledger.running(b"t1") is None and ledger.spare(w1) == 1 and not ledger.used(w1)
    assert not ledger.release(w1, b"t1")  # already free
    ledger.list_ready(w1)
    assert ledger.take_worker("echo") is w2  # W1 went to the back
    assert ledger.dismiss(b"W2") is w2 and not ledger.offers("other")
    assert ledger.worker(b"W2") is None and ledger.workers() == [w1]


def test_an_expired_ticket_is_settled_and_the_worker_keeps_its_slot_until_release() -> None:
    ledger = Ledger()
    worker = Worker(b"W1", ("echo",), 2, True, 1.0)
    ledger.enroll(worker)
    pending = _pending(1)
    ledger.dispatched(worker, b"t1", pending)
    ledger.dispatched(worker, b"t0", _pending(2, request_id=b"r2"))
    assert ledger.settle(b"t1") is pending and ledger.settle(b"t1") is None
    assert ledger.spare(worker) == 0  # R9: the worker may still be running it
    assert ledger.tickets_of(worker) == [b"t0", b"t1"]  # in the order issued
    assert ledger.release(worker, b"t1") and ledger.spare(worker) == 1
    assert ledger.tickets_of(worker) == [b"t0"] and ledger.used(worker) == 1


def test_what_waits_goes_first_in_first_out_and_a_retry_to_the_front() -> None:
    ledger = Ledger()
    a, b, c = _pending(1), _pending(2, request_id=b"r2"), _pending(3, request_id=b"r3")
    assert ledger.waiting_count("echo") == 0
    ledger.wait(a)
    ledger.wait(b)
    ledger.wait(c, True)
    assert ledger.waiting_count("echo") == 3 and ledger.waiting_total() == 3
    assert ledger.waiting_services() == {"echo"} and ledger.queued_services() == ["echo"]
    assert ledger.next_waiting("echo") is c
    assert ledger.take_out(b) and not ledger.take_out(b)
    ledger.retire(a)
    ledger.stop_waiting(a)  # answered while queued: skipped when reached
    assert ledger.waiting_count("echo") == 0 and ledger.next_waiting("echo") is None
    ledger.put_back("echo", [c])
    assert ledger.next_waiting("echo") is c


def test_peers_requests_waiting_are_taken_out_in_order() -> None:
    ledger = Ledger()
    own, theirs = _pending(1), _pending(2, request_id=b"r2")
    theirs.origin = b"T"
    ledger.wait(own)
    ledger.wait(theirs)
    assert list(ledger.forwarded_waiting("echo")) == [theirs]
    assert ledger.waiting_count("echo") == 1 and ledger.next_waiting("echo") is own


def test_a_request_is_forwarded_rerouted_rescheduled_and_redirected_by_the_ledger() -> None:
    ledger = Ledger()
    pending = _pending(1)
    ledger.open(pending)
    ledger.forwarded(b"t1", pending, "b2")
    assert (pending.ticket, pending.peer, pending.worker, pending.attempt) == (b"t1", "b2", None, 1)
    assert ledger.settle(b"t1") is pending
    ledger.unassign(pending)
    assert (pending.ticket, pending.peer, pending.worker) == (None, None, None)
    ledger.reschedule(pending, 42.0)
    assert pending.deadline == 42.0 and pending.attempt == 1
    ledger.redirect(pending, b"conn-2")
    assert pending.client == b"conn-2" and ledger.open_by_connection() == {b"conn-2": 1}


def test_the_broker_keeps_the_pool_each_core_test_runs_over(ledger_pool: str) -> None:
    """tests/core/conftest.py sets SCALE0_POOL per run; the broker's ledger takes it."""
    ledger = Harness().broker.ledger
    assert isinstance(ledger, Ledger) and ledger.pool == ledger_pool
    assert isinstance(ledger, CPoolLedger) == (ledger_pool == "c")


def test_the_default_pool_is_c_where_built_unless_told_or_pure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SCALE0_POOL")
    monkeypatch.delenv("SCALE0_PURE", raising=False)
    assert default_pool() == ("c" if C_POOL else "python") == Ledger().pool
    monkeypatch.setenv("SCALE0_PURE", "1")  # every pure path, as scale0.net.frames_io reads it
    assert default_pool() == "python" == Ledger().pool
    monkeypatch.setenv("SCALE0_POOL", "python")
    assert Ledger().pool == "python" and Ledger(pool="python").pool == "python"
    if C_POOL:
        monkeypatch.setenv("SCALE0_POOL", "c")  # (told beats SCALE0_PURE)
        assert Ledger().pool == "c" and Ledger(pool="c").pool == "c"


def test_an_unknown_or_unbuilt_pool_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALE0_POOL", "rust")
    with pytest.raises(ValueError, match=r"SCALE0_POOL must be one of c, python, not 'rust'"):
        Ledger()
    with pytest.raises(ValueError, match=r"Ledger's pool must be one of c, python, not 'C'"):
        Ledger(pool="C")
    if not C_POOL:
        with pytest.raises(ValueError, match=r"scale0.core._pool is not built here"):
            Ledger(pool="c")
