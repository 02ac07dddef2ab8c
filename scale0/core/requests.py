"""Requests a broker holds: waiting or in flight, with deadlines and attempts; and the reply cache.

The reply cache answers a client's retry of a request it already answered (same client, same
request_id) without running it again; it is bounded in entries, bytes and age.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from scale0.core.timers import RequestDue
from scale0.wire.client import ClientReply

# A request's identity across retries: (who asked, request_id). "Who" is the client_id the
# client negotiated with, so a retry over a new connection still finds its request.
RequestKey = tuple[bytes, bytes]

#: How many others (peers' forwards, a client's other connection) one request answers at most.
MAX_JOINED = 16

K = TypeVar("K", bound=Hashable)


class Tally(dict[K, int]):
    """Counts by key, 0 for a key never counted. Unlike ``collections.Counter`` it overrides
    no store or delete, so writes stay dict's own C code; its ``__getitem__`` is a lookup with
    no Python frame but on a miss (the ledger's hot path binds it, scale0/core/ledger.py)."""

    __slots__ = ()

    def __missing__(self, key: K) -> int:
        return 0


@dataclass(slots=True, eq=False)
class Pending:
    """One client request: waiting for a worker (``ticket`` None) or dispatched to one."""

    seq: RequestDue  # also its deadline's timer key
    client: bytes  # routing id to answer; updated when the client retries from a new connection
    key: RequestKey
    service: str
    request_id: bytes
    body: tuple[bytes, ...]
    deadline: float
    attempt: int = 0
    ticket: bytes | None = None
    worker: bytes | None = None
    done: bool = False
    peer: str | None = None  # the peer broker this request was forwarded to (§5.4)
    origin: bytes | None = None  # forwarded to us: the origin's FORWARD ticket; ``client`` is
    # then the origin link's routing id on our peer ROUTER, and the answer is a FORWARDREPLY
    started: float = 0.0  # when the client asked (monotonic): the latency histogram's origin
    caller: str = ""  # the client's CURVE key, carried by FORWARD (§5.4), "" without CURVE
    # ``key`` is the client's own (client_id, request_id): a Scale0 client's request, or one a
    # peer forwarded with FORWARDWITH's ids. Such a request is joined by a resend however it
    # comes (R10) and its worker REPLY cached; it is the ids an IDREQUEST worker is told.
    # False for a Majordomo request (its ids are this broker's own) and a FORWARD without ids.
    ids: bool = True
    via: str = ""  # forwarded to us: the origin broker's id (records, logs)
    limit: float = float("inf")  # forwarded to us: the origin's deadline as FORWARDWITH said
    # Who else waits for this request's answer (R10 across brokers, §5.4): each a routing id
    # and the FORWARD ticket to answer on our peer ROUTER, or None for our own frontend client.
    also: list[tuple[bytes, bytes | None]] | None = None
    # F15: the peer that held this request when it was lost, and until when the request goes
    # back only to it (it joins the run it may still be doing), never to another broker.
    prefer: str | None = None
    prefer_until: float = 0.0
    # The C lane's, waiting in its queue: dispatched by the core to a worker it freed, but the
    # lane's to answer (scale0/core/ledger.py ``next_waiting(service, lend=True)``); never opened
    lane: bool = False

    def join(self, routing_id: bytes, ticket: bytes | None) -> None:
        """Someone else asks for this very request (R10): answer it too. A frontend client
        (``ticket`` None) is answered on the connection it asked from last; at most
        :data:`MAX_JOINED` others wait, the oldest dropped (their origin times it out)."""
        also = self.also
        if also is None:
            also = self.also = []
        elif ticket is None:
            also[:] = [entry for entry in also if entry[1] is not None]
        if len(also) >= MAX_JOINED:
            del also[0]
        also.append((routing_id, ticket))


class ReplyCache:
    """Recent final replies by RequestKey, bounded by entries, total body bytes and age.

    First in, first out: a hit does not refresh an entry, so insertion order is expiry order
    and the oldest entry is the one evicted (and the first that :meth:`prune` reaches).
    """

    __slots__ = ("_bytes", "_entries", "max_age_s", "max_bytes", "max_entries")

    def __init__(self, *, max_entries: int, max_bytes: int, max_age_s: float) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._entries: OrderedDict[RequestKey, tuple[float, int, ClientReply]] = OrderedDict()
        self._bytes = 0

    def get(self, key: RequestKey, now: float) -> ClientReply | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] < now:
            self._drop(key)
            return None
        return entry[2]

    def put(self, key: RequestKey, reply: ClientReply, now: float) -> None:
        self.put_until(key, reply, now + self.max_age_s)

    def put_until(self, key: RequestKey, reply: ClientReply, expires: float) -> None:
        """``put`` of an entry whose expiry is known (one moved here from another cache)."""
        size = sum(map(len, reply.body))
        if size > self.max_bytes:
            return  # larger than the whole cache: not worth evicting everything for
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (expires, size, reply)
        self._bytes += size
        entries = self._entries
        while len(entries) > self.max_entries or self._bytes > self.max_bytes:
            _, (_, dropped, _) = entries.popitem(last=False)  # the oldest
            self._bytes -= dropped

    def prune(self, now: float) -> None:
        """Drop expired entries (oldest first: insertion order is expiry order)."""
        while self._entries:
            key, (expires, _, _) = next(iter(self._entries.items()))
            if expires >= now:
                break
            self._drop(key)

    def take(self) -> list[tuple[RequestKey, ClientReply, float]]:
        """Every entry, oldest first, with its expiry; the cache is left empty."""
        taken = [(key, reply, expires) for key, (expires, _, reply) in self._entries.items()]
        self._entries.clear()
        self._bytes = 0
        return taken

    def _drop(self, key: RequestKey) -> None:
        _, size, _ = self._entries.pop(key)
        self._bytes -= size

    def __len__(self) -> int:
        return len(self._entries)


class WaitQueue:
    """Requests waiting for a worker, first in first out per service (R6).

    An answered request (its deadline passed, or it was moved) stays in its queue until it is
    reached and is then skipped: so :meth:`count` is what really waits, kept apart from the
    queues' lengths. Every change to a queue goes through here, so the two never disagree.
    """

    __slots__ = ("_queues", "counts")

    def __init__(self) -> None:
        self._queues: dict[str, deque[Pending]] = {}
        self.counts: Tally[str] = Tally()  # service -> requests really waiting (read only)

    def count(self, service: str) -> int:
        return self.counts.get(service, 0)

    def total(self) -> int:
        return sum(self.counts.values())

    def services(self) -> set[str]:
        """The services some request waits for."""
        return {s for s, n in self.counts.items() if n}

    def queued(self) -> list[str]:
        """The services with a queue, waiting requests or not (a snapshot)."""
        return [s for s, q in self._queues.items() if q]

    def push(self, pending: Pending, *, front: bool = False) -> None:
        queue = self._queues.get(pending.service)
        if queue is None:
            queue = self._queues[pending.service] = deque()
        if front:
            queue.appendleft(pending)
        else:
            queue.append(pending)
        self.counts[pending.service] = self.counts.get(pending.service, 0) + 1

    def pop(self, service: str) -> Pending | None:
        """The first request still waiting for ``service`` (answered ones are dropped)."""
        queue = self._queues.get(service)
        while queue:
            pending = queue.popleft()
            if not pending.done:
                self.counts[service] -= 1
                return pending
        return None

    def put_back(self, service: str, kept: list[Pending]) -> None:
        """Return ``kept`` (popped from ``service``'s queue, in order) to its front."""
        queue = self._queues.setdefault(service, deque())
        queue.extendleft(reversed(kept))
        self.counts[service] = self.counts.get(service, 0) + len(kept)

    def expired(self, pending: Pending) -> None:
        """``pending`` no longer waits (it is being answered): its entry is skipped later."""
        self.counts[pending.service] -= 1

    def take_out(self, pending: Pending) -> bool:
        """Remove ``pending`` from its queue if it waits there (True if it did)."""
        queue = self._queues.get(pending.service)
        if not queue or pending not in queue:
            return False
        queue.remove(pending)
        self.counts[pending.service] -= 1
        return True

    def forwarded_to_us(self, service: str) -> Iterator[Pending]:
        """Take out, in order, the live requests peers forwarded us that wait for ``service``."""
        queue = self._queues.get(service)
        if not queue:
            return
        for pending in [p for p in queue if p.origin is not None and not p.done]:
            queue.remove(pending)
            self.counts[service] -= 1
            yield pending
