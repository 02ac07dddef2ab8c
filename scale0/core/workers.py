"""Workers and the least-recently-used queue of ready workers per service.

A worker with spare capacity sits in the LRU queue of every service it offers; taking it for one
service moves it to the back of that queue, or out of all of them when it is full. A released
worker goes to the back. All operations are O(1) per service (OrderedDict as an LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Worker:
    """One READY worker: what it serves, how much at once, and what it is running now.

    ``in_flight`` is the Python pool's storage (scale0/core/ledger.py; a ledger on the C pool
    leaves it empty): the rooms ask the ledger (``used``, ``spare``, ``tickets_of``), never
    this set."""

    routing_id: bytes
    services: tuple[str, ...]
    capacity: int
    heartbeat: bool
    interval_s: float
    in_flight: set[bytes] = field(default_factory=set)
    ids: bool = False  # its READY asked for request_ids: REQUEST carries the client's ids


class WorkerPool:
    """The ready workers of each service, least recently used first."""

    __slots__ = ("_offered", "_ready", "workers")

    def __init__(self) -> None:
        self.workers: dict[bytes, Worker] = {}
        self._ready: dict[str, OrderedDict[bytes, Worker]] = {}
        self._offered: dict[str, int] = {}  # service -> number of workers offering it

    def add(self, worker: Worker) -> None:
        """Register a new worker, or replace the services of a known one (a new READY)."""
        old = self.workers.get(worker.routing_id)
        if old is not None:
            self._unlist(old)
            self._uncount(old)
            worker.in_flight = old.in_flight
        self.workers[worker.routing_id] = worker
        for service in worker.services:
            self._offered[service] = self._offered.get(service, 0) + 1

    def remove(self, routing_id: bytes) -> Worker | None:
        worker = self.workers.pop(routing_id, None)
        if worker is not None:
            self._unlist(worker)
            self._uncount(worker)
        return worker

    def offers(self, service: str) -> bool:
        """Whether any registered worker (ready or busy) offers ``service``."""
        return service in self._offered

    def services(self) -> list[str]:
        return sorted(self._offered)

    def ready_count(self, service: str) -> int:
        queue = self._ready.get(service)
        return len(queue) if queue else 0

    def take(self, service: str) -> Worker | None:
        """The least recently used worker with spare capacity for ``service``, marked used."""
        queue = self._ready.get(service)
        if not queue:
            return None
        routing_id, worker = queue.popitem(last=False)
        if worker.capacity - len(worker.in_flight) > 1:  # (spare, inline: the hot path)
            queue[routing_id] = worker  # still has room: to the back, others go first
        else:
            self._unlist(worker)  # full after this dispatch: out of every queue
        return worker

    def release(self, routing_id: bytes, ticket: bytes) -> bool:
        """The slot ``ticket`` holds at the registered worker ``routing_id`` is free again (True
        if it was held; False, nothing done, for a worker gone or a ticket it does not hold),
        as the C pool's ``release``."""
        worker = self.workers.get(routing_id)
        if worker is None or ticket not in worker.in_flight:
            return False
        worker.in_flight.discard(ticket)
        return True

    def list_ready(self, worker: Worker) -> None:
        """Put a worker with spare capacity at the back of each of its services' queues; a full
        one leaves them (it was given requests outside :meth:`take`, as a worker that frees a
        slot is given what waits, R5: else take would hand it one more than its capacity)."""
        routing_id = worker.routing_id
        if self.workers.get(routing_id) is not worker:
            return
        if len(worker.in_flight) >= worker.capacity:
            self._unlist(worker)
            return
        ready = self._ready
        for service in worker.services:
            queue = ready.get(service)
            if queue is None:
                queue = ready[service] = OrderedDict()
            # Only the registered worker is ever listed (add() unlists the one it replaces).
            if routing_id in queue:
                queue.move_to_end(routing_id)
            else:
                queue[routing_id] = worker

    def _unlist(self, worker: Worker) -> None:
        for service in worker.services:
            queue = self._ready.get(service)
            if queue is not None:
                queue.pop(worker.routing_id, None)
                if not queue:
                    del self._ready[service]

    def _uncount(self, worker: Worker) -> None:
        for service in worker.services:
            left = self._offered[service] - 1
            if left:
                self._offered[service] = left
            else:
                del self._offered[service]
