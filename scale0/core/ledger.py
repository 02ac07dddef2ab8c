"""The ledger: the state the hot path reads and writes, behind one set of operations.

Requests not answered yet (by their deadline's timer key, by their identity across retries
(R10), by the ticket they run under), the per-client counts (R20), the reply cache, the worker
pool (least recently used first per service, capacity, tickets in flight) and what waits for a
worker (R6). The rooms (scale0/core/dispatch.py, forwarding.py, lifecycle.py, family.py,
sessions.py, views.py) reach it only by these operations, typed as
:class:`scale0.core.ports.LedgerPort`, never by its dicts; each operation is one step a C
implementation shared with a C lane thread can serve without calling back into Python
(docs/architecture.md, "Decided, being built", phase 1). :class:`Ledger` is the Python one:
today's structures, kept as the model and the pure fallback.

Its worker pool comes in two implementations with the same answers, chosen per ledger at
construction (phase 2): ``Ledger(pool="python")`` keeps it in
:class:`~scale0.core.workers.WorkerPool`; ``Ledger(pool="c")`` in the C
:class:`scale0.core._pool.Pool` (slots, tickets, the LRU queues and the offered counts in C
memory a lane thread can share; the :class:`~scale0.core.workers.Worker` records, what the
control plane reads of a worker, stay Python objects, found by routing id). ``Ledger()``
takes :func:`default_pool`: ``SCALE0_POOL`` (``c`` or ``python``) when set, else Python when
``SCALE0_PURE=1`` (as scale0.net.frames_io forces its fallback) or the extension is not
built (``tools/test-fallback``), else C. tests/core runs over both (its conftest), and
tests/core/test_ledger_machine.py holds both to one model.

Requests (a :class:`~scale0.core.requests.Pending` is the record passed in and out):

- ``open(pending)``: hold a new request: by its timer key; by its key (R10) if it is our own
  client's or a forward with the client's ids; our own client's counts against its cap (R20).
- ``held(client)``: how many of our own client ``client_id``'s requests are not answered (R20).
- ``held_by_client()``: the same for every client holding some, a snapshot.
- ``joinable(key)``: the request not answered yet that a resend of ``key`` joins (R10).
- ``open_at(seq)``: the request a deadline timer key watches, if not answered yet (R6, R9).
- ``is_open(seq)``: whether a deadline timer key still watches a request (else dropped unfired).
- ``retire(pending)``: it has its final answer: forgotten everywhere but the reply cache.
- ``client_busy(routing_id)``: whether our own client connection has a request not answered.
- ``open_by_connection()``: per client routing id, its requests not answered (client table).
- ``held_from(broker_id)``: per service, the requests forwarded to us by that peer (F16).
- ``cached(key, now)`` / ``cache(key, reply, now)``: the reply cache's answer to a resend of
  ``key``, and a final reply put in it; ``cached_count()``; ``prune_cache(now)``: drop the old.

A request's own fields: of a :class:`~scale0.core.requests.Pending`, the ledger owns those
that change while it holds the request on the steps a lane thread takes in C: ``ticket``,
``worker``, ``peer`` and ``attempt`` (a dispatch), ``deadline`` (a retry's own, a PARTIAL's
progress, R9: the deadline heap moving behind the ledger reads it), ``client`` (a resend of
our own client's request moves its answer, R10) and ``done`` (an answer). Once a request is
opened the rooms read them but write them only by ledger operations (``dispatched``,
``forwarded``, ``retire``, ``answer`` and these), so a C ledger can hold them under its mutex:

- ``unassign(pending)``: it runs nowhere now (its ticket settled, R8, F3, F8): no ticket,
  worker or peer.
- ``reschedule(pending, deadline)``: its deadline moves (R9: a PARTIAL, a retry, a join);
  the timer key's entry in the deadline heap is the caller's (not behind the ledger yet).
- ``redirect(pending, routing_id)``: our own client asked again from ``routing_id`` (R10):
  the answer goes there.

The other fields are the Python control plane's and stay record fields the rooms write:
what a request is (``seq``, ``key``, ``service``, ``request_id``, ``body``, ``started``,
``origin``, ``ids``, ``caller``, ``via``), set before ``open``; and what only forwarding,
peers' traffic and F15 change, all of which stay in Python (phase 4 moves forwarding):
``prefer`` / ``prefer_until`` (F15), ``also`` (R10 across brokers), ``limit`` (the origin's
deadline). A lane may read those; one that finds ``also`` or ``prefer`` set can hand the
request's next step to Python, so no C step needs to write them.

In flight (a ticket names one dispatch of a request, to a worker or to a peer):

- ``dispatched(worker, ticket, pending)``: ``pending`` runs at ``worker`` under ``ticket``
  (one of the worker's slots is taken; its ``ticket``, ``worker`` set, ``attempt`` + 1).
- ``forwarded(ticket, pending, peer)``: ``pending`` went to the peer broker ``peer`` under
  ``ticket`` (its ``ticket``, ``peer`` set, ``attempt`` + 1).
- ``running(ticket)``: the request a ticket names, while in flight (R14: else None).
- ``answer(ticket, routing_id)``: a worker's final REPLY: the request ``ticket`` names if that
  worker runs it, out of flight, the worker's slot free, and retired as ``retire`` does (one
  call for the hot path); else None, nothing changed (R14).
- ``settle(ticket)``: the ticket is out of flight (answered, expired, lost); its request.
- ``release(worker, ticket)``: the worker's slot held by ``ticket`` is free again (True if it
  was held).
- ``in_flight_count()``: tickets in flight, to workers and peers.

Workers (a :class:`~scale0.core.workers.Worker` is the record passed in and out; what its
READY said is the record's, the slots it has taken are the ledger's, read only by ``used``,
``spare`` and ``tickets_of``, and kept by routing id: a record a new READY replaced answers
as the one that replaced it. The slot operations, ``dispatched`` and ``list_ready`` take a
registered worker, as the rooms always pass; a record dismissed since has no slots in a
C-pool ledger, and ``dispatched`` to one is a KeyError there):

- ``enroll(worker)``: a READY: register it, or replace a known one's services (keeping its
  slots in use); the one it replaces (or None).
- ``dismiss(routing_id)``: the worker is gone: out of the pool; it (or None).
- ``worker(routing_id)``: a registered worker, or None.
- ``workers()``: every registered worker (a snapshot); ``worker_count()``.
- ``offers(service)``: whether a registered worker (ready or busy) offers ``service`` (R7).
- ``offered()``: the services registered workers offer, sorted.
- ``workers_of(service)``: how many registered workers offer ``service``.
- ``tickets_of(worker)``: the tickets holding its slots, in the order they were issued
  (one past its deadline too: R9 keeps the slot until a late REPLY or the worker is lost).
- ``used(worker)``: how many of its slots are taken (0: idle).
- ``spare(worker)``: its free slots, capacity less used (below 0 when a new READY lowered the
  capacity under what it runs).
- ``ready_count(service)``: how many have a free slot for it now.
- ``take_worker(service)``: the least recently used worker with a free slot for ``service``,
  marked used (R5).
- ``list_ready(worker)``: a worker with a free slot goes to the back of its services' queues;
  a full one leaves them (given what waited, it may have filled while listed: R5).

Waiting (first in, first out per service, R6):

- ``wait(pending, front)``: ``pending`` waits for a worker (at the front: a retry).
- ``next_waiting(service, lend=False)``: the first request still waiting for ``service``,
  taken out (``lend``: for a worker this ledger frees, see "The lane").
- ``put_back(service, kept)``: requests taken out of ``service``'s queue go back to its front.
- ``stop_waiting(pending)``: ``pending`` is answered while queued (its entry skipped later).
- ``take_out(pending)``: remove ``pending`` from its queue (True if it was there).
- ``forwarded_waiting(service)``: take out, in order, peers' requests waiting for ``service``.
- ``waiting_count(service)``, ``waiting_total()``, ``waiting_services()`` (some request
  waits), ``queued_services()`` (a queue exists, a snapshot, by name).

The lane (phase 3b; a C-pool ledger only): ``attach_lane(lane, due)`` shares this
ledger's C pool with the lane thread (scale0/net/lane.py), which dispatches a client's
REQUEST (S0P or Majordomo) to a ready worker of its protocol and returns its final REPLY in C,
keeping those requests in its own records (:class:`~scale0.core.ports.LanePort`), and moves
the reply cache into the lane (``cached``, ``cache``, ``prune_cache`` and ``cached_count``
use the lane's until it stops; it puts its own S0P answers in it). From then on the ledger
tells the lane, as they change, which services a request waits for here (R6: the lane takes
none of theirs, and a REPLY that frees a worker of one comes here), which clients hold a
request here (R20, and their order) and the keys of the requests with the client's ids held
here (R10: a resend is the core's); and every operation that must see one of the lane's
requests first adopts it (``adopt*``): a Pending made from its record, opened and in flight
as ``dispatched`` would leave it (the pool's slot is held already), or waiting at the back
of our queue (the lane's queue is behind ours), its deadline given to ``due`` under the
number the lane gave it (the lane and the core number requests from one counter,
``Core.share_seq``). By ticket: ``running``, ``answer``, ``settle``; by worker:
``tickets_of``, ``dismiss``; by key: ``joinable`` (a resend; a waiting one with the rest of
its queue, in order); by service, what waits: ``wait`` (the lane's before a new one
of ours), ``next_waiting`` (the lane's head once ours is empty); all: ``queued_services``
(moving work away), ``adopt_lane()``; by deadline: ``adopt_due(now)``. A worker freed here
while only the lane's queue holds requests of its service is *lent* the lane's head
(``next_waiting(service, lend=True)``, from ``Dispatch.worker_free`` only): the core builds
its REQUEST as for any other, and ``dispatched`` puts it in flight in the lane
(``dispatch_head``), whose REPLY the lane answers: so a broker whose requests all passed
through the core once comes back to the lane alone as its own queue drains. Counts add the lane's
without adopting: ``held``, ``held_by_client``, ``client_busy``, ``open_by_connection``,
``in_flight_count``, ``waiting_count``, ``waiting_total`` (``waiting_services`` is ours: the
lane queues only for a service some worker offers). ``attach_lane(None, ...)`` adopts every
request the lane still holds and stops telling it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

from scale0.core.ports import LanePort, LaneRecord
from scale0.core.requests import Pending, ReplyCache, RequestKey, Tally, WaitQueue
from scale0.core.timers import RequestDue
from scale0.core.workers import Worker, WorkerPool
from scale0.wire.client import ClientReply

try:
    from scale0.core._pool import Pool as CPool  # optional, built by pip install (setup.py)
except ImportError:  # no C compiler at install: the Python pool only
    C_POOL = False
else:
    C_POOL = True

__all__ = [
    "C_POOL",
    "POOLS",
    "REPLY_CACHE_AGE_S",
    "REPLY_CACHE_BYTES",
    "REPLY_CACHE_ENTRIES",
    "Ledger",
    "default_pool",
]

#: The worker pools a ledger can keep (``Ledger(pool=...)``, ``SCALE0_POOL``).
POOLS = ("c", "python")

REPLY_CACHE_ENTRIES = 10_000
REPLY_CACHE_BYTES = 64 << 20
REPLY_CACHE_AGE_S = 60.0


def default_pool() -> str:
    """The pool ``Ledger()`` keeps: ``SCALE0_POOL`` when set (``c`` or ``python``); else
    ``python`` when ``SCALE0_PURE=1`` or scale0.core._pool is not built; else ``c``."""
    asked = os.environ.get("SCALE0_POOL")
    if asked is not None:
        return _checked(asked, "SCALE0_POOL")
    if os.environ.get("SCALE0_PURE") == "1" or not C_POOL:
        return "python"
    return "c"


def _no_due(deadline: float, key: RequestDue) -> None:
    raise RuntimeError("no lane attached: nothing to adopt")


def _no_forwarded(pending: Pending) -> None:
    """(No one to tell: a ledger no broker watches.)"""


def _pending_of(record: LaneRecord, *, lane: bool = False) -> Pending:
    """One of the lane's requests as a Pending, not in flight (an S0P client's keeps its ids,
    R10; a Majordomo one's are the lane's, D1). ``lane``: the head of the lane's queue, lent to
    a worker the core freed (its REQUEST built as for any other); never opened here:
    ``dispatched`` puts it in flight in the lane, which answers it. A peer's FORWARD the lane
    took is keyed as ``Forwarding.forward_in`` keys it: the client's ids, else the peer's
    ticket under b"\x00" + the peer's id."""
    _, _, client, client_id, caller, service, body, started, deadline, rid, seq, ids = record[:12]
    origin, via, limit, peer = record[12], record[13], record[14], record[15]
    if origin:  # a peer's FORWARD (phase 4a): keyed as Forwarding.forward_in keys it
        return Pending(
            RequestDue(seq),
            client,
            (client_id, rid if ids else origin),
            service,
            rid,
            body,
            deadline,
            origin=origin,
            started=started,
            ids=ids,
            via=via,
            limit=limit,
            lane=lane,
        )
    return Pending(
        RequestDue(seq),
        client,
        (client_id, rid),
        service,
        rid,
        body,
        deadline,
        peer=peer or None,  # (forwarded there by the lane, phase 4b: in flight at that peer)
        started=started,
        caller=caller,
        ids=ids,
        lane=lane,
    )


def _checked(pool: str, what: str) -> str:
    if pool not in POOLS:
        raise ValueError(f"{what} must be one of {', '.join(POOLS)}, not {pool!r}")
    if pool == "c" and not C_POOL:
        raise ValueError(
            f"{what} is 'c' but scale0.core._pool is not built here (no C compiler at install)"
        )
    return pool


class Ledger:
    """The Python ledger: requests, tickets in flight, the reply cache, workers, waiting.

    ``Ledger(pool="c")`` (or ``Ledger()`` when :func:`default_pool` says ``c``) makes the
    same ledger with its worker pool in C: a :class:`CPoolLedger`."""

    __slots__ = (
        "_cache",
        "_due",
        "_forwarded",
        "_inflight",
        "_lane",
        "_live",
        "_per_client",
        "_pool",
        "_release",
        "_requests",
        "_told_waits",
        "_waiting",
        "_waiting_counts",
        "_workers",
        "cache",
        "cached",
        "held",
        "is_open",
        "joinable",
        "list_ready",
        "offers",
        "open_at",
        "running",
        "take_worker",
        "waiting_count",
        "worker",
    )

    #: Which worker pool this ledger keeps: "python" or "c".
    pool = "python"

    def __new__(cls, pool: str | None = None) -> Ledger:
        chosen = default_pool() if pool is None else _checked(pool, "Ledger's pool")
        if cls is Ledger and chosen == "c":
            return object.__new__(CPoolLedger)
        return object.__new__(cls)

    def __init__(self, pool: str | None = None) -> None:
        self._attach_pool()
        self._waiting = WaitQueue()
        self._waiting_counts = self._waiting.counts
        self._requests: dict[RequestDue, Pending] = {}  # by seq: every request not answered
        self._inflight: dict[bytes, Pending] = {}  # by ticket: at a worker or a peer
        self._live: dict[RequestKey, Pending] = {}  # by key: joinable by a resend (R10)
        self._per_client: Tally[bytes] = Tally()  # client_id -> requests not answered (R20)
        self._cache = ReplyCache(
            max_entries=REPLY_CACHE_ENTRIES,
            max_bytes=REPLY_CACHE_BYTES,
            max_age_s=REPLY_CACHE_AGE_S,
        )
        # The pure lookups are the structures' own bound methods, not a method of ours around
        # them: no second Python frame per lookup on the hot path (docs/performance.md).
        self.cached = self._cache.get
        self.cache = self._cache.put
        self._forwarded: Callable[[Pending], None] = _no_forwarded
        self.joinable: Callable[[RequestKey], Pending | None] = self._live.get
        self.open_at = self._requests.get
        self.is_open = self._requests.__contains__
        self.running: Callable[[bytes], Pending | None] = self._inflight.get
        self.worker = self._workers.get
        # (a Tally: 0 for a client holding none)
        self.held: Callable[[bytes], int] = self._per_client.__getitem__
        self.waiting_count = self._waiting_counts.__getitem__  # (a Tally too)
        self._lane: LanePort | None = None
        self._told_waits: dict[str, int] = {}  # what the lane was told waits here, by service
        self._due: Callable[[float, RequestDue], None] = _no_due

    def _attach_pool(self) -> None:
        """The worker pool (WorkerPool) and the registered records, by routing id."""
        self._pool = WorkerPool()
        self._workers = self._pool.workers
        # A worker's slot freed by routing id (answer): the pool's own call, as CPoolLedger's.
        self._release: Callable[[bytes, bytes], bool] = self._pool.release
        self.offers: Callable[[str], bool] = self._pool.offers
        self.take_worker: Callable[[str], Worker | None] = self._pool.take
        self.list_ready: Callable[[Worker], None] = self._pool.list_ready

    # ---- requests --------------------------------------------------------------------------

    def open(self, pending: Pending) -> None:
        self._requests[pending.seq] = pending
        if pending.origin is None:
            client = pending.key[0]
            per_client = self._per_client
            held = per_client[client] = per_client.get(client, 0) + 1
            self._live[pending.key] = pending
            lane = self._lane
            if lane is not None:
                lane.python_holds(client, held)
                if pending.ids:  # R10: a resend of it is the core's, not the lane's
                    lane.python_key(client, pending.key[1], True)
        elif pending.ids:
            self._live[pending.key] = pending
            if self._lane is not None:
                self._lane.python_key(pending.key[0], pending.key[1], True)

    def held_by_client(self) -> dict[bytes, int]:
        held = dict(self._per_client)
        if self._lane is not None:
            for client, count in self._lane.held_by_client().items():
                held[client] = held.get(client, 0) + count
        return held

    def retire(self, pending: Pending) -> None:
        pending.done = True
        if self._requests.pop(pending.seq, None) is not None and pending.origin is None:
            client = pending.key[0]
            held = self._per_client.get(client, 0) - 1
            if held > 0:
                self._per_client[client] = held
            else:
                self._per_client.pop(client, None)
            if self._lane is not None:
                self._lane.python_holds(client, max(held, 0))
        live = self._live
        if live.get(pending.key) is pending:
            del live[pending.key]
            if pending.ids and self._lane is not None:
                self._lane.python_key(pending.key[0], pending.key[1], False)

    def client_busy(self, routing_id: bytes) -> bool:
        if self._lane is not None and self._lane.busy(routing_id):
            return True
        return any(p.client == routing_id and p.origin is None for p in self._requests.values())

    def open_by_connection(self) -> dict[bytes, int]:
        counts: dict[bytes, int] = {}
        if self._lane is not None:
            counts.update(self._lane.open_by_connection())
        for pending in self._requests.values():
            if not pending.done:
                counts[pending.client] = counts.get(pending.client, 0) + 1
        return counts

    def held_from(self, broker_id: str) -> dict[str, int]:
        held: dict[str, int] = {}
        if self._lane is not None:  # (the FORWARDs of that peer the lane runs, phase 4a)
            held.update(self._lane.held_from(broker_id))
        for pending in self._requests.values():
            if pending.origin is not None and pending.via == broker_id:
                held[pending.service] = held.get(pending.service, 0) + 1
        return held

    def cached_count(self) -> int:
        lane = self._lane
        return len(self._cache) if lane is None else lane.cache_count()

    def prune_cache(self, now: float) -> None:
        lane = self._lane
        if lane is None:
            self._cache.prune(now)
        else:
            lane.cache_prune(now)

    # ---- in flight -------------------------------------------------------------------------

    def dispatched(self, worker: Worker, ticket: bytes, pending: Pending) -> None:
        pending.ticket = ticket
        pending.worker = worker.routing_id
        pending.attempt += 1
        worker.in_flight.add(ticket)
        self._inflight[ticket] = pending

    def forwarded(self, ticket: bytes, pending: Pending, peer: str) -> None:
        pending.ticket = ticket
        pending.peer = peer
        pending.attempt += 1
        self._inflight[ticket] = pending

    def unassign(self, pending: Pending) -> None:
        pending.ticket = pending.worker = pending.peer = None

    def reschedule(self, pending: Pending, deadline: float) -> None:
        pending.deadline = deadline

    def redirect(self, pending: Pending, routing_id: bytes) -> None:
        pending.client = routing_id

    def answer(self, ticket: bytes, routing_id: bytes) -> Pending | None:
        inflight = self._inflight
        pending = inflight.get(ticket)
        if pending is None and self._lane is not None:
            pending = self._adopt_ticket(ticket)
        if pending is None or pending.worker != routing_id:
            return None
        del inflight[ticket]
        self._release(routing_id, ticket)  # (False, nothing done, when it is gone: R8)
        self.retire(pending)
        return pending

    def settle(self, ticket: bytes) -> Pending | None:
        if self._lane is not None and ticket not in self._inflight:
            self._adopt_ticket(ticket)
        return self._inflight.pop(ticket, None)

    def release(self, worker: Worker, ticket: bytes) -> bool:
        in_flight = worker.in_flight
        if ticket in in_flight:
            in_flight.discard(ticket)
            return True
        return False

    def in_flight_count(self) -> int:
        lane = self._lane
        return len(self._inflight) + (lane.in_flight() if lane is not None else 0)

    # ---- workers ---------------------------------------------------------------------------

    def enroll(self, worker: Worker) -> Worker | None:
        old = self._register(worker)
        counts = self._waiting_counts
        for service in worker.services:
            if service not in counts:
                counts[service] = 0  # so waiting_count, on the hot path, finds it (no __missing__)
        return old

    def _register(self, worker: Worker) -> Worker | None:
        """``worker`` in the pool (a known one's services replaced, its slots kept); the
        record it replaces, or None."""
        old = self._workers.get(worker.routing_id)
        self._pool.add(worker)
        return old

    def dismiss(self, routing_id: bytes) -> Worker | None:
        return self._pool.remove(routing_id)

    def workers(self) -> list[Worker]:
        return list(self._workers.values())

    def worker_count(self) -> int:
        return len(self._workers)

    def offered(self) -> list[str]:
        return self._pool.services()

    def workers_of(self, service: str) -> int:
        return sum(1 for w in self._workers.values() if service in w.services)

    def ready_count(self, service: str) -> int:
        return self._pool.ready_count(service)

    def tickets_of(self, worker: Worker) -> list[bytes]:
        return sorted(worker.in_flight)

    def used(self, worker: Worker) -> int:
        return len(worker.in_flight)

    def spare(self, worker: Worker) -> int:
        return worker.capacity - len(worker.in_flight)

    # ---- waiting ---------------------------------------------------------------------------

    def wait(self, pending: Pending, front: bool = False) -> None:
        lane = self._lane
        if lane is not None:
            service = pending.service
            if not front and lane.waiting(service):  # they came first: before it, in order
                self._adopted(lane.adopt_waiting(service))
            self._waiting.push(pending, front=front)
            self._tell_waits(service)
            return
        self._waiting.push(pending, front=front)

    def next_waiting(self, service: str, lend: bool = False) -> Pending | None:
        pending = self._waiting.pop(service)
        lane = self._lane
        if lane is not None:
            if pending is None:  # the lane's queue is behind ours: its head is next
                if lend:  # for a worker freed here: it stays the lane's (see dispatched)
                    record = lane.waiting_head(service)
                    return None if record is None else _pending_of(record, lane=True)
                record = lane.adopt_next_waiting(service)
                if record is not None:
                    return self._adopt_one(record)
            self._tell_waits(service)
        return pending

    def put_back(self, service: str, kept: list[Pending]) -> None:
        self._waiting.put_back(service, kept)
        if self._lane is not None:
            self._tell_waits(service)

    def stop_waiting(self, pending: Pending) -> None:
        self._waiting.expired(pending)
        if self._lane is not None:
            self._tell_waits(pending.service)

    def take_out(self, pending: Pending) -> bool:
        taken = self._waiting.take_out(pending)
        if self._lane is not None:
            self._tell_waits(pending.service)
        return taken

    def forwarded_waiting(self, service: str) -> Iterator[Pending]:
        lane = self._lane
        if lane is None:
            return self._waiting.forwarded_to_us(service)
        if lane.waiting(service):  # (the FORWARDs the lane queued: behind ours, in order)
            self._adopted(lane.adopt_waiting(service))
        return self._forwarded_waiting_told(service)

    def _forwarded_waiting_told(self, service: str) -> Iterator[Pending]:
        # (The lane may be told a service waits when it no longer does, if the caller stops
        # early: only slower. Never the other way: the counts rise only in wait and put_back.)
        for pending in self._waiting.forwarded_to_us(service):
            self._tell_waits(service)
            yield pending
        self._tell_waits(service)

    def waiting_total(self) -> int:
        lane = self._lane
        return self._waiting.total() + (lane.waiting_total() if lane is not None else 0)

    def waiting_services(self) -> set[str]:
        # (The lane queues only for a service a worker offers: a view adds ``offered()``.)
        return self._waiting.services()

    def queued_services(self) -> list[str]:
        self.adopt_lane()
        # By name: the order of services is no rule's (each keeps its own FIFO), but it must be
        # one order whatever created their queues when (the lane's adoptions recreate them).
        return sorted(self._waiting.queued())

    # ---- the lane (phase 3b) ---------------------------------------------------------------

    def attach_lane(self, lane: LanePort | None, due: Callable[[float, RequestDue], None]) -> None:
        """The lane shares this ledger's C pool from now on (None: it stopped; every request
        it still holds is adopted first). ``due(deadline, key)`` puts an adopted request's
        deadline in the heap (its key is the number the lane gave it)."""
        raise ValueError("the lane shares a C pool: this ledger keeps a Python one")

    def adopt_lane(self) -> None:
        """Every request the lane holds becomes this ledger's (views, a change of state)."""
        if self._lane is not None:
            self._adopted(self._lane.adopt_all())

    def adopt_due(self, now: float) -> None:
        """The lane's requests whose deadline has passed become this ledger's: their deadline
        timers fire at the next Tick (R9)."""
        if self._lane is not None:
            self._adopted(self._lane.adopt_due(now))

    def watch_forwarded(self, forwarded: Callable[[Pending], None]) -> None:
        """``forwarded(pending)`` is called for each request the lane forwarded to a peer
        when this ledger adopts it (phase 4b): the family counts it in flight there."""
        self._forwarded = forwarded

    def adopt_peer(self, broker_id: str) -> None:
        """The requests the lane forwarded to ``broker_id`` become this ledger's (F3: that peer
        is lost, and what it held is routed again)."""
        if self._lane is not None:
            self._adopted(self._lane.adopt_peer(broker_id.encode()))

    def lane_forwarded_to(self, broker_id: str) -> dict[str, int]:
        """Per service, the requests the lane forwarded to ``broker_id`` (F16's in flight)."""
        return {} if self._lane is None else self._lane.forwarded_to(broker_id.encode())

    def lane_due(self) -> float | None:
        """The earliest deadline of a request the lane holds (the loop's timer must wake then)."""
        return None if self._lane is None else self._lane.next_due()

    def _adopt_ticket(self, ticket: bytes) -> Pending | None:
        assert self._lane is not None
        record = self._lane.adopt(ticket)
        return None if record is None else self._adopt_one(record)

    def _adopted(self, records: Iterable[LaneRecord]) -> None:
        """Requests of the lane's, now ours: one it dispatched is in flight at its worker, one
        waiting in its queue waits at the back of ours (the lane's queue is behind ours)."""
        services = set()
        for record in records:
            pending = self._adopt_one(record)
            if pending.ticket is None:
                self._waiting.push(pending)
                services.add(pending.service)
        for service in services:
            self._tell_waits(service)

    def _adopt_one(self, record: LaneRecord) -> Pending:
        """A Pending for one of the lane's requests, opened, its deadline in the heap; in flight
        if the lane dispatched it (the pool's slot is held already), else in no queue yet."""
        pending = _pending_of(record)
        ticket, worker = record[0], record[1]
        self.open(pending)
        if ticket:
            pending.ticket, pending.worker, pending.attempt = ticket, worker or None, 1
            self._inflight[ticket] = pending
            if pending.peer is not None:  # (the family counts it in flight at that peer)
                self._forwarded(pending)
        self._due(pending.deadline, pending.seq)
        return pending

    def _tell_waits(self, service: str) -> None:
        """Tell the lane how many requests of ``service`` wait here, when that changed."""
        waits = self._waiting_counts.get(service, 0)
        told = self._told_waits
        if told.get(service, 0) != waits:
            if waits:
                told[service] = waits
            else:
                del told[service]
            assert self._lane is not None
            self._lane.python_waits(service, waits)


class CPoolLedger(Ledger):
    """The same ledger with its worker pool in C (:class:`scale0.core._pool.Pool`): slots,
    tickets, the LRU queues and the offered counts in C memory; the registered
    :class:`~scale0.core.workers.Worker` records in a dict by routing id, as WorkerPool keeps
    them. Made by ``Ledger(pool="c")``; every answer is the Python pool's (test_ledger_machine).
    """

    __slots__ = ("_cpool", "_hold", "_used")

    pool = "c"

    def _attach_pool(self) -> None:
        cpool = self._cpool = CPool()
        self._workers = {}
        self._hold = cpool.hold
        self._release = cpool.release
        self._used = cpool.used
        self.offers = cpool.offers
        self.take_worker = self._take_worker
        self.list_ready = self._list_ready

    # ---- in flight -------------------------------------------------------------------------

    def dispatched(self, worker: Worker, ticket: bytes, pending: Pending) -> None:
        routing_id = pending.worker = worker.routing_id
        pending.ticket = ticket
        pending.attempt += 1
        self._hold(routing_id, ticket)
        if pending.lane:  # the lane's head, lent: in flight in the lane, its REPLY the lane's
            assert self._lane is not None
            self._lane.dispatch_head(pending.service, ticket, routing_id)
            return
        self._inflight[ticket] = pending

    def release(self, worker: Worker, ticket: bytes) -> bool:
        return self._release(worker.routing_id, ticket)

    # ---- the lane (phase 3b) ---------------------------------------------------------------

    @property
    def cpool(self) -> CPool:
        """The C pool, for the lane to share (scale0.net._zmqio.Lane.attach_pool)."""
        return self._cpool

    def attach_lane(self, lane: LanePort | None, due: Callable[[float, RequestDue], None]) -> None:
        if lane is None:
            self.adopt_lane()
            if self._lane is not None:  # the reply cache comes back, in its order
                for client_id, rid, service, status, body, expires in self._lane.cache_take():
                    reply = ClientReply(service, rid, status, body)
                    self._cache.put_until((client_id, rid), reply, expires)
            self._lane = None
            self._told_waits.clear()
            self.held = self._per_client.__getitem__
            self.running = self._inflight.get
            self.waiting_count = self._waiting_counts.__getitem__
            self.joinable = self._live.get
            self.cached = self._cache.get
            self.cache = self._cache.put
            self._due = _no_due
            return
        self._lane = lane
        self._due = due
        self.held = self._held_with_lane
        self.running = self._running_with_lane
        self.waiting_count = self._waiting_with_lane
        self.joinable = self._joinable_with_lane
        self.cached = self._cached_in_lane
        self.cache = self._cache_in_lane
        self._told_waits.clear()
        for service in self._waiting.services():
            self._tell_waits(service)
        for client, held in self._per_client.items():
            lane.python_holds(client, held)
        for key, pending in self._live.items():
            if pending.ids:
                lane.python_key(key[0], key[1], True)
        # The reply cache is the lane's from now on (it puts its own answers in): ours moves
        # there whole, in its order, under the same bounds
        cache = self._cache
        lane.cache_limits(cache.max_entries, cache.max_bytes, cache.max_age_s)
        for (client_id, rid), reply, expires in cache.take():
            lane.cache_put(client_id, rid, reply.service, reply.status, reply.body, expires)

    def _joinable_with_lane(self, key: RequestKey) -> Pending | None:
        """R10: the request a resend of ``key`` joins: ours, or the lane's, adopted. A waiting
        one of the lane's comes with the rest of its queue, so the order of what waits holds."""
        pending = self._live.get(key)
        if pending is not None:
            return pending
        lane = self._lane
        assert lane is not None
        record = lane.adopt_key(key[0], key[1])
        if record is None:
            return None
        if record[0]:  # in flight
            return self._adopt_one(record)
        queue = sorted([record, *lane.adopt_waiting(record[5])], key=lambda r: r[10])
        self._adopted(queue)
        return self._live.get(key)

    def _cached_in_lane(self, key: RequestKey, now: float) -> ClientReply | None:
        assert self._lane is not None
        got = self._lane.cache_get(key[0], key[1], now)
        return None if got is None else ClientReply(got[0], key[1], got[1], got[2])

    def _cache_in_lane(self, key: RequestKey, reply: ClientReply, now: float) -> None:
        assert self._lane is not None
        expires = now + self._cache.max_age_s
        self._lane.cache_put(key[0], key[1], reply.service, reply.status, reply.body, expires)

    def _held_with_lane(self, client: bytes) -> int:
        assert self._lane is not None
        return self._per_client[client] + self._lane.held(client)

    def _waiting_with_lane(self, service: str) -> int:
        assert self._lane is not None
        return self._waiting_counts[service] + self._lane.waiting(service)

    def _running_with_lane(self, ticket: bytes) -> Pending | None:
        pending = self._inflight.get(ticket)
        return pending if pending is not None else self._adopt_ticket(ticket)

    # ---- workers ---------------------------------------------------------------------------

    def _take_worker(self, service: str) -> Worker | None:
        routing_id = self._cpool.take(service)
        return None if routing_id is None else self._workers[routing_id]

    def _list_ready(self, worker: Worker) -> None:
        routing_id = worker.routing_id
        if self._workers.get(routing_id) is worker:  # (only the registered record, as WorkerPool)
            self._cpool.list_ready(routing_id)

    def _register(self, worker: Worker) -> Worker | None:
        routing_id = worker.routing_id
        old = self._workers.get(routing_id)
        # (checks, then changes; ids: the lane sends it IDREQUEST as dispatch_to does)
        self._cpool.add(routing_id, worker.services, worker.capacity, worker.ids)
        self._workers[routing_id] = worker
        return old

    def dismiss(self, routing_id: bytes) -> Worker | None:
        if self._lane is not None:
            self._adopted(self._lane.adopt_worker(routing_id))
        self._cpool.remove(routing_id)
        return self._workers.pop(routing_id, None)

    def offered(self) -> list[str]:
        return self._cpool.services()

    def workers_of(self, service: str) -> int:
        return self._cpool.offered_count(service)

    def ready_count(self, service: str) -> int:
        return self._cpool.ready_count(service)

    def tickets_of(self, worker: Worker) -> list[bytes]:
        routing_id = worker.routing_id
        if self._lane is not None:
            self._adopted(self._lane.adopt_worker(routing_id))
        return self._cpool.tickets(routing_id) if routing_id in self._workers else []

    def used(self, worker: Worker) -> int:
        return self._used(worker.routing_id)

    def spare(self, worker: Worker) -> int:
        return worker.capacity - self._used(worker.routing_id)
