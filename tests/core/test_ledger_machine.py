"""Hypothesis drives a ledger through its operations at random, as the rooms call them, and
checks it after every step against a model written here from scale0/core/ledger.py's
docstring alone (plain lists and dicts, slow and obvious).

The ledger is reached only through :class:`~scale0.core.ports.LedgerPort`'s operations, so any
implementation plugs in: :data:`LEDGERS` names each one with a factory (phase 2 of the C lane,
docs/architecture.md: the ledger on the C worker pool is there; the C ledger will be), and
every one runs the same machine.

Invariants: every ticket in flight names a request that is open; a worker's used slots are the
tickets it holds, within its capacity; a request waits in at most one queue, in the order the
rules put it there, and never both waits and runs; the per-client counts (R20) are the open
requests of our own clients; ``take_worker`` gives the least recently used worker with a free
slot (R5), which the model predicts at every take.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from scale0.core.ledger import C_POOL, Ledger
from scale0.core.ports import LedgerPort
from scale0.core.requests import Pending
from scale0.core.workers import Worker
from scale0.wire.client import ClientReply

#: Every ledger implementation, by name: the same machine runs over each. The C pool's only
#: where it is built (tools/test-fallback runs without it; test_pool_parity.py says so).
LEDGERS: dict[str, Callable[[], LedgerPort]] = {"python": lambda: Ledger(pool="python")}
if C_POOL:
    LEDGERS["c-pool"] = lambda: Ledger(pool="c")

SERVICES = ("a", "b")
WORKER_IDS = (b"W0", b"W1", b"W2")
CLIENTS = (b"c0", b"c1")
PEER = "b2"


@pytest.fixture(autouse=True)
def ledger_pool() -> str:
    """Once, not once per pool (tests/core/conftest.py): it makes each of LEDGERS itself."""
    return "-"


class Model:
    """What the ledger must hold, by its docstring: the oracle of :class:`LedgerLife`."""

    def __init__(self) -> None:
        self.open: dict[int, Pending] = {}  # seq -> request not answered
        self.inflight: dict[bytes, Pending] = {}  # ticket -> request at a worker or a peer
        self.workers: dict[bytes, Worker] = {}  # the registered record per routing id
        self.slots: dict[bytes, set[bytes]] = {}  # routing id -> tickets holding its slots
        self.ready: dict[str, list[bytes]] = {s: [] for s in SERVICES}  # LRU first
        self.queues: dict[str, list[Pending]] = {s: [] for s in SERVICES}  # really waiting

    def spare(self, routing_id: bytes) -> int:
        return self.workers[routing_id].capacity - len(self.slots[routing_id])

    def unlist(self, routing_id: bytes) -> None:
        for queue in self.ready.values():
            if routing_id in queue:
                queue.remove(routing_id)

    def take(self, service: str) -> bytes | None:
        queue = self.ready[service]
        if not queue:
            return None
        routing_id = queue.pop(0)
        if self.spare(routing_id) > 1:
            queue.append(routing_id)  # still room: to the back of this service's queue
        else:
            self.unlist(routing_id)  # full after this dispatch: out of every queue
        return routing_id

    def list_ready(self, worker: Worker) -> None:
        routing_id = worker.routing_id
        if self.workers.get(routing_id) is not worker:
            return
        if self.spare(routing_id) <= 0:
            self.unlist(routing_id)  # filled while listed (given what waited): not ready
            return
        for service in worker.services:
            queue = self.ready[service]
            if routing_id in queue:
                queue.remove(routing_id)
            queue.append(routing_id)

    def held(self) -> dict[bytes, int]:
        counts: dict[bytes, int] = {}
        for pending in self.open.values():
            if pending.origin is None:
                counts[pending.key[0]] = counts.get(pending.key[0], 0) + 1
        return counts


class LedgerLife(RuleBasedStateMachine):
    """Random lives of one ledger, each step as a room takes it (scale0/core/dispatch.py,
    forwarding.py, family.py), each answer checked against :class:`Model`."""

    make: Callable[[], LedgerPort] = Ledger

    def __init__(self) -> None:
        super().__init__()
        self.ledger = self.make()
        self.model = Model()
        self.seq = 0
        self.tickets = 0
        self.now = 0.0

    # ---- helpers (each a sequence of operations a room makes) ------------------------------

    def _ticket(self) -> bytes:
        self.tickets += 1
        return b"T" + self.tickets.to_bytes(8, "big")  # sorted = the order issued

    def _dispatch(self, worker: Worker, pending: Pending) -> None:
        """dispatch_to: ``pending`` runs at ``worker`` (one of its free slots)."""
        model = self.model
        assert model.spare(worker.routing_id) > 0, "the rooms dispatch only to a free slot"
        ticket = self._ticket()
        attempt = pending.attempt
        self.ledger.dispatched(worker, ticket, pending)
        assert (pending.ticket, pending.worker, pending.peer) == (ticket, worker.routing_id, None)
        assert pending.attempt == attempt + 1
        model.inflight[ticket] = pending
        model.slots[worker.routing_id].add(ticket)

    def _route(self, pending: Pending, front: bool) -> None:
        """route (R5, R6): the least recently used ready worker, else wait."""
        ledger, model = self.ledger, self.model
        expected = model.take(pending.service)
        worker = ledger.take_worker(pending.service)
        assert (worker.routing_id if worker is not None else None) == expected  # R5: LRU
        if worker is not None:
            assert worker is model.workers[worker.routing_id]
            self._dispatch(worker, pending)
            return
        ledger.wait(pending, front)
        queue = model.queues[pending.service]
        queue.insert(0, pending) if front else queue.append(pending)

    def _retire(self, pending: Pending) -> None:
        self.ledger.retire(pending)
        assert pending.done
        del self.model.open[pending.seq]

    def _worker_free(self, worker: Worker) -> None:
        """worker_free: what waits for its services goes to its free slots, then it is listed."""
        ledger, model = self.ledger, self.model
        for service in worker.services:
            while ledger.waiting_count(service) and ledger.spare(worker) > 0:
                pending = ledger.next_waiting(service)
                assert pending is not None and pending is model.queues[service].pop(0)
                self._dispatch(worker, pending)
        ledger.list_ready(worker)
        model.list_ready(worker)

    def _route_again(self, pending: Pending, retry: bool) -> None:
        """route_again (R8, F3): its run is lost; routed again at the front, or answered."""
        self.ledger.unassign(pending)
        assert (pending.ticket, pending.worker, pending.peer) == (None, None, None)
        if retry:
            self.ledger.reschedule(pending, self.now + 10.0)
            assert pending.deadline == self.now + 10.0
            self._route(pending, front=True)
        else:
            self._retire(pending)

    def _open(self, client: bytes, service: str, origin: bool, ids: bool) -> Pending:
        self.seq += 1
        request_id = b"r%d" % self.seq
        key = (client, request_id) if not origin or ids else (b"\x00" + PEER.encode(), request_id)
        pending = Pending(self.seq, b"conn-" + client, key, service, request_id, (), self.now + 10)
        if origin:
            pending.origin, pending.via, pending.ids = b"F%d" % self.seq, PEER, ids
        assert self.ledger.joinable(key) is None  # a fresh request id: nothing to join
        self.ledger.open(pending)
        self.model.open[pending.seq] = pending
        return pending

    # ---- rules -------------------------------------------------------------------------------

    @rule(
        routing_id=st.sampled_from(WORKER_IDS),
        services=st.lists(st.sampled_from(SERVICES), min_size=1, max_size=2, unique=True),
        capacity=st.integers(1, 3),
    )
    def worker_ready(self, routing_id: bytes, services: list[str], capacity: int) -> None:
        """READY (R4): enrolled (a known worker keeps its slots), then given what waits."""
        model = self.model
        capacity = max(capacity, len(model.slots.get(routing_id, ())))  # (never below used)
        worker = Worker(routing_id, tuple(services), capacity, True, 1.0)
        old = self.ledger.enroll(worker)
        assert old is model.workers.get(routing_id)
        if old is not None:
            model.unlist(routing_id)
        model.workers[routing_id] = worker
        model.slots.setdefault(routing_id, set())
        self._worker_free(worker)

    @rule(routing_id=st.sampled_from(WORKER_IDS), retry=st.booleans())
    def worker_lost(self, routing_id: bytes, retry: bool) -> None:
        """R8: out of the pool; each request it ran is routed again or answered."""
        ledger, model = self.ledger, self.model
        worker = ledger.worker(routing_id)
        assert worker is model.workers.get(routing_id)
        if worker is None:
            assert ledger.dismiss(routing_id) is None
            return
        tickets = ledger.tickets_of(worker)
        assert tickets == sorted(model.slots[routing_id])
        assert ledger.dismiss(routing_id) is worker and ledger.worker(routing_id) is None
        model.unlist(routing_id)
        del model.workers[routing_id], model.slots[routing_id]
        for ticket in tickets:
            pending = ledger.settle(ticket)
            assert pending is model.inflight.pop(ticket, None)
            if pending is not None:
                self._route_again(pending, retry)

    @rule(
        client=st.sampled_from(CLIENTS),
        service=st.sampled_from(SERVICES),
        origin=st.booleans(),
        ids=st.booleans(),
    )
    def request(self, client: bytes, service: str, origin: bool, ids: bool) -> None:
        """A client's REQUEST (or a peer's FORWARD, F7): held, then a worker or the queue."""
        self._route(self._open(client, service, origin, ids), front=False)

    @rule(client=st.sampled_from(CLIENTS), service=st.sampled_from(SERVICES))
    def waits_for_its_peer(self, client: bytes, service: str) -> None:
        """F15: a request lost with a peer that may come back waits at the front for it, no
        worker tried, even while one is ready (a worker that frees a slot then takes it)."""
        pending = self._open(client, service, False, True)
        self.ledger.wait(pending, True)
        self.model.queues[service].insert(0, pending)

    @rule(client=st.sampled_from(CLIENTS), service=st.sampled_from(SERVICES))
    def request_to_peer(self, client: bytes, service: str) -> None:
        """F6: our own client's request goes to a peer instead."""
        pending = self._open(client, service, False, True)
        ticket = self._ticket()
        self.ledger.forwarded(ticket, pending, PEER)
        assert (pending.ticket, pending.peer, pending.worker) == (ticket, PEER, None)
        assert pending.attempt == 1
        self.model.inflight[ticket] = pending

    @rule(data=st.data(), refused=st.booleans())
    def peer_answers(self, data: st.DataObject, refused: bool) -> None:
        """F7, F8: a FORWARDREPLY: answered, or (refused) routed again here."""
        at_peer = sorted(t for t, p in self.model.inflight.items() if p.peer is not None)
        if not at_peer:
            return
        ticket = data.draw(st.sampled_from(at_peer))
        pending = self.ledger.running(ticket)
        assert pending is self.model.inflight.pop(ticket)
        assert self.ledger.settle(ticket) is pending and self.ledger.running(ticket) is None
        if refused:
            self._route_again(pending, True)
        else:
            self._retire(pending)

    @rule(data=st.data(), wrong=st.booleans(), cache=st.booleans())
    def worker_replies(self, data: st.DataObject, wrong: bool, cache: bool) -> None:
        """A worker's final REPLY: answered and its slot free (R14: never from another
        worker); then the worker gets what waits."""
        ledger, model = self.ledger, self.model
        at_workers = sorted(t for t, p in model.inflight.items() if p.worker is not None)
        if not at_workers:
            return
        ticket = data.draw(st.sampled_from(at_workers))
        pending = model.inflight[ticket]
        assert pending.worker is not None
        if wrong:
            others = [w for w in WORKER_IDS if w != pending.worker]
            assert ledger.answer(ticket, data.draw(st.sampled_from(others))) is None
            assert ledger.running(ticket) is pending and not pending.done
            return
        assert ledger.answer(ticket, pending.worker) is pending
        assert pending.done and ledger.running(ticket) is None
        del model.inflight[ticket], model.open[pending.seq]
        model.slots[pending.worker].discard(ticket)
        if cache and pending.origin is None:
            reply = ClientReply(pending.service, pending.request_id, 200, (b"ok",))
            ledger.cache(pending.key, reply, self.now)
            assert ledger.cached(pending.key, self.now) is reply
        worker = ledger.worker(pending.worker)
        if worker is not None:
            self._worker_free(worker)

    @rule(data=st.data())
    def deadline_passes(self, data: st.DataObject) -> None:
        """R6, R9: a request past its deadline is answered: taken off its queue, or its ticket
        settled while the worker keeps the slot (a late REPLY gives it back)."""
        ledger, model = self.ledger, self.model
        if not model.open:
            return
        pending = model.open[data.draw(st.sampled_from(sorted(model.open)))]
        assert ledger.open_at(pending.seq) is pending and ledger.is_open(pending.seq)
        if pending.ticket is None:
            ledger.stop_waiting(pending)
            model.queues[pending.service].remove(pending)
        else:
            assert ledger.settle(pending.ticket) is pending
            del model.inflight[pending.ticket]
        self._retire(pending)

    @rule(data=st.data())
    def late_reply(self, data: st.DataObject) -> None:
        """R14 after R9: the REPLY to a ticket settled: dropped, and the slot is free again."""
        ledger, model = self.ledger, self.model
        late = sorted(
            (t, r) for r, held in model.slots.items() for t in held if t not in model.inflight
        )
        if not late:
            return
        ticket, routing_id = data.draw(st.sampled_from(late))
        assert ledger.answer(ticket, routing_id) is None
        worker = ledger.worker(routing_id)
        assert worker is not None and ledger.release(worker, ticket)
        assert not ledger.release(worker, ticket)
        model.slots[routing_id].discard(ticket)
        self._worker_free(worker)

    @rule(data=st.data())
    def client_resends(self, data: st.DataObject) -> None:
        """R10: our own client asks again from another connection: the request is joined and
        its answer goes there."""
        own = sorted(s for s, p in self.model.open.items() if p.origin is None)
        if not own:
            return
        pending = self.model.open[data.draw(st.sampled_from(own))]
        assert self.ledger.joinable(pending.key) is pending
        self.ledger.redirect(pending, pending.client + b"+")
        assert pending.client.endswith(b"+")

    @rule(data=st.data(), later=st.floats(0.0, 5.0))
    def progress(self, data: st.DataObject, later: float) -> None:
        """R9: a PARTIAL (or a join) moves a running request's deadline on."""
        if not self.model.inflight:
            return
        pending = self.model.inflight[data.draw(st.sampled_from(sorted(self.model.inflight)))]
        self.ledger.reschedule(pending, pending.deadline + later)
        assert self.ledger.running(pending.ticket or b"") is pending

    @rule(data=st.data())
    def preferred_peer_gone(self, data: st.DataObject) -> None:
        """F15: a waiting request's preference expired: taken out of its queue, routed again."""
        waiting = [p for q in self.model.queues.values() for p in q]
        if not waiting:
            return
        pending = data.draw(st.sampled_from(waiting))
        assert self.ledger.take_out(pending) and not self.ledger.take_out(pending)
        self.model.queues[pending.service].remove(pending)
        self._route(pending, front=True)

    @rule(service=st.sampled_from(SERVICES))
    def last_worker_gone(self, service: str) -> None:
        """F7, F9: peers' requests waiting for ``service`` go back to their origin (404)."""
        queue = self.model.queues[service]
        expected = [p for p in queue if p.origin is not None]
        taken = list(self.ledger.forwarded_waiting(service))
        assert taken == expected
        for pending in taken:
            queue.remove(pending)
            self._retire(pending)

    @rule(seconds=st.sampled_from([1.0, 30.0, 61.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.ledger.prune_cache(self.now)

    # ---- invariants ------------------------------------------------------------------------

    @invariant()
    def every_ticket_in_flight_names_an_open_request(self) -> None:
        ledger, model = self.ledger, self.model
        assert ledger.in_flight_count() == len(model.inflight)
        for ticket, pending in model.inflight.items():
            assert ledger.running(ticket) is pending and pending.ticket == ticket
            assert ledger.is_open(pending.seq) and not pending.done
            assert (pending.worker is None) != (pending.peer is None)
        for seq, pending in model.open.items():
            assert ledger.open_at(seq) is pending and not pending.done
        assert not any(ledger.is_open(s) for s in range(1, self.seq + 1) if s not in model.open)

    @invariant()
    def a_workers_used_slots_are_the_tickets_it_holds_within_its_capacity(self) -> None:
        ledger, model = self.ledger, self.model
        assert ledger.worker_count() == len(model.workers)
        assert {w.routing_id: w for w in ledger.workers()} == model.workers
        for routing_id, worker in model.workers.items():
            assert ledger.worker(routing_id) is worker
            held = sorted(model.slots[routing_id])
            assert ledger.tickets_of(worker) == held
            assert ledger.used(worker) == len(held) <= worker.capacity
            assert ledger.spare(worker) == worker.capacity - len(held)
            for ticket in held:  # at this worker, or settled past its deadline (R9)
                pending = model.inflight.get(ticket)
                assert pending is None or pending.worker == routing_id
        for service in SERVICES:
            offering = [w for w in model.workers.values() if service in w.services]
            assert ledger.offers(service) == bool(offering)
            assert ledger.workers_of(service) == len(offering)
            assert ledger.ready_count(service) == len(model.ready[service])
            for routing_id in model.ready[service]:  # listed: a free slot, the registered one
                assert model.spare(routing_id) > 0
        assert ledger.offered() == sorted({s for w in model.workers.values() for s in w.services})

    @invariant()
    def a_request_waits_in_one_queue_in_order_and_never_also_runs(self) -> None:
        ledger, model = self.ledger, self.model
        seen: set[int] = set()
        for service, queue in model.queues.items():
            assert ledger.waiting_count(service) == len(queue)
            # The queue as the ledger holds it: taken out in order and put back at the front
            # (what drain_to_peers does), so the check leaves it as it was.
            taken: list[Pending] = []
            while (pending := ledger.next_waiting(service)) is not None:
                taken.append(pending)
            ledger.put_back(service, taken)
            assert taken == queue
            for pending in queue:
                assert pending.seq not in seen and pending.service == service
                seen.add(pending.seq)
                assert model.open.get(pending.seq) is pending and ledger.is_open(pending.seq)
                assert pending.ticket is None and pending not in model.inflight.values()
        assert ledger.waiting_total() == len(seen)
        assert ledger.waiting_services() == {s for s, q in model.queues.items() if q}

    @invariant()
    def per_client_counts_are_the_open_requests_of_that_client(self) -> None:
        ledger, model = self.ledger, self.model
        held = model.held()
        assert ledger.held_by_client() == held
        for client in CLIENTS:
            assert ledger.held(client) == held.get(client, 0)
        connections: dict[bytes, int] = {}
        for pending in model.open.values():
            connections[pending.client] = connections.get(pending.client, 0) + 1
            joins = pending.origin is None or pending.ids
            assert (ledger.joinable(pending.key) is pending) == joins
        assert ledger.open_by_connection() == connections
        from_peer: dict[str, int] = {}
        for pending in model.open.values():
            if pending.origin is not None:
                from_peer[pending.service] = from_peer.get(pending.service, 0) + 1
        assert ledger.held_from(PEER) == from_peer


@pytest.mark.parametrize("make", list(LEDGERS.values()), ids=list(LEDGERS))
def test_a_ledger_keeps_its_invariants_through_random_lives(make: Callable[[], LedgerPort]) -> None:
    machine = type("LedgerLifeOf", (LedgerLife,), {"make": staticmethod(make)})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=150,
            stateful_step_count=40,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
