"""The lane's take rule for Majordomo requests, and what the ledger tells it, make a broker whose
lane dispatches some requests answer exactly as one that dispatches all (phase 3b; scale0/net/
_lane.c, scale0/core/ledger.py "The lane", docs/architecture.md "Phase 3b").

Two brokers on the same fake clock meet the same Majordomo clients and workers (every reading:
7/MDP, 18/MDP with and without the empty frame 0, majortomo's), and S0P clients whose requests
queue behind them. Broker A handles every message itself. Broker B shares its C pool with
:class:`RequestLane`, the lane's rule written in Python from _lane.c's description: a
client's REQUEST it takes is dispatched to the least recently used ready worker without B, and
a worker's final REPLY to one of those is answered without B; B adopts such a request whenever
it must decide something about it (a PARTIAL, the worker lost, its deadline, a view). The
node's part is played as the node plays it: before each message B hears what the lane heard and
did (``heard_elsewhere``, ``lane_did``); after it the lane is told what it may serve
(``lane_serves``; all adopted when that turns off); before a Tick the requests past their
deadline are adopted.

Each peer must receive the same messages in the same order from both brokers (tickets compared
by the order they were first seen: the lane's are its own), and at the end both brokers must
count, measure (latency histograms on the one clock) and hold the same.

``Twins(peer=True)`` (phase 4): a family of two, the peer b2 played by the test. b2 forwards
us requests (FORWARD, FORWARDWITH with and without the client's ids, resends), which the lane
serves, queues and answers as ``Forwarding.forward_in`` and ``Dispatch.finish`` would (4a);
b2's link answers our HELLO and sends tables, so the lane forwards our S0P clients' requests
to it as ``pick_peer`` and ``forward_to`` would and answers its FORWARDREPLYs (4b); b2 goes
silent and links again.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.config.model import BrokerEntry
from scale0.core.effects import Channel, Effect, Send, Start, Tick
from scale0.core.ledger import (
    C_POOL,
    REPLY_CACHE_AGE_S,
    REPLY_CACHE_BYTES,
    REPLY_CACHE_ENTRIES,
    CPoolLedger,
)
from scale0.core.metrics import LATENCY_BUCKETS_S
from scale0.core.ports import LaneCached, LaneRecord
from scale0.core.requests import ReplyCache
from scale0.wire.client import CheckConfig, ClientReply, ClientRequest, Heartbeat
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType, Message
from scale0.wire.mdp import (
    MDPC01,
    MDPC02,
    MDPW01,
    MDPW02,
    MdpClientReply,
    MdpClientRequest,
    MdpWorkerDisconnect,
    MdpWorkerHeartbeat,
    MdpWorkerPartial,
    MdpWorkerReady,
    MdpWorkerReply,
    MdpWorkerRequest,
    reading_code,
)
from scale0.wire.peer import (
    FORWARD_WITH_NAME,
    BrokerState,
    Forward,
    ForwardReply,
    Hello,
    PeerHeartbeat,
    Table,
    TableMode,
    TableReq,
    TableService,
    TableWorker,
)
from scale0.wire.worker import Ready, WorkerIdRequest, WorkerPartial, WorkerReply, WorkerRequest
from tests.core.harness import BACK, FRONT, NETWORK, Harness

PEER = Channel.PEER
LINK = Channel.LINK

if not C_POOL:
    pytest.skip(
        "the lane shares the C pool: scale0.core._pool is not built here", allow_module_level=True
    )


@pytest.fixture(autouse=True)
def ledger_pool(monkeypatch: pytest.MonkeyPatch) -> str:
    """The lane shares a C pool (tests/core/conftest.py's fixture, one value)."""
    monkeypatch.setenv("SCALE0_POOL", "c")
    return "c"


CLIENTS = (b"\x00c1", b"\x00c2", b"\x00c3")
WORKERS = (b"\x00w1", b"\x00w2", b"\x00w3")
S0P_CLIENT = b"\x00s0p"
S0P_CLIENTS = (S0P_CLIENT, b"\x00s0q")
S0P_WORKERS = (b"\x00v1", b"\x00v2")
#: Which request_id an S0P client's REQUEST carries: a new one, its last one again (a resend:
#: R10 joins it or answers it from the cache), or its one before last.
S0P_IDS = ("new", "new", "again", "old")
SERVICES = ("echo", "echo", "other", "mmi.service")
#: Client readings: (signature, delimited, majortomo); worker readings: (signature, delimited).
CLIENT_READINGS = (
    (MDPC01, True, False),
    (MDPC02, True, False),
    (MDPC02, False, False),
    (MDPC02, True, True),
)
WORKER_READINGS = ((MDPW01, True), (MDPW02, True), (MDPW02, False))


def _worker_reading(code: int) -> tuple[bytes, bool]:
    return (MDPW01 if code & 1 else MDPW02), bool(code & 4)


def _client_reading(code: int) -> tuple[bytes, bool, bool]:
    return (MDPC01 if code & 1 else MDPC02), bool(code & 4), bool(code & 8)


@dataclass
class Note:
    promise_ms: int
    reading: int
    client_id: bytes
    open: bool


@dataclass
class Record:
    ticket: bytes
    worker: bytes
    client: bytes
    client_id: bytes
    service: str
    body: tuple[bytes, ...]
    started: float
    deadline: float
    request_id: bytes
    reading: int  # the client's Majordomo reading, 0: an S0P client
    seq: int
    origin: bytes = b""  # a peer's FORWARD (phase 4a): its ticket
    via: str = ""  # (and that peer's broker id)
    limit: float = float("inf")  # (and the origin's deadline, FORWARDWITH's deadline_ms)
    forwarded_ids: bool = False  # (and whether FORWARDWITH carried the client's ids)
    peer: str = ""  # a client's request the lane forwarded to that peer (phase 4b)

    @property
    def ids(self) -> bool:
        """An S0P client's, or a FORWARD's with ids: its request_id is the client's own."""
        return self.forwarded_ids if self.origin else not self.reading

    def handed(self) -> LaneRecord:
        return (
            self.ticket,
            self.worker,
            self.client,
            self.client_id,
            "",
            self.service,
            self.body,
            self.started,
            self.deadline,
            self.request_id,
            self.seq,
            self.ids,
            self.origin,
            self.via,
            self.limit,
            self.peer,
        )


@dataclass
class RequestLane:
    """The C lane's session table, gates and request rule (a MirrorPort and a LanePort)."""

    pool: object
    services_of: Callable[[bytes], tuple[str, ...]]  # (the C pool's, in the worker's order)
    table: dict[tuple[Channel, bytes], Note] = field(default_factory=dict)
    on: bool = False
    timeout_s: float = 0.0
    cap: int = 0
    prefix: bytes = b""
    max_queued: int = 0
    may_queue: bool = False
    forwards_on: bool = False
    waits: dict[str, int] = field(default_factory=dict)  # Python's waiting, by service
    holds: dict[bytes, int] = field(default_factory=dict)  # Python's held, by client_id
    records: dict[bytes, Record] = field(default_factory=dict)  # in flight, by ticket
    queues: dict[str, list[Record]] = field(default_factory=dict)  # waiting, per service
    queued: int = 0
    counter: int = 0
    tickets: int = 0
    seq: int = 0
    lent: int = 0
    heard: list[tuple[Channel, bytes, float]] = field(default_factory=list)
    requests: int = 0
    replies: int = 0
    forwards: int = 0  # FORWARDs taken since the last drain (phase 4a)
    forwarded: int = 0  # and in all
    # Phase 4b: the peers it may forward to (in the order first told: pick_peer's ties), this
    # broker's id, how it moved their free counts, what it forwarded since the last drain
    peers: dict[bytes, tuple[bool, bool, dict[str, int]]] = field(default_factory=dict)
    identity: str = ""
    deltas: Counter[tuple[bytes, str]] = field(default_factory=Counter)
    forwarded_out: int = 0
    sent_out: int = 0  # (in all)
    peer_answered: int = 0  # FORWARDREPLYs it took, in all
    latency: dict[tuple[str, int], tuple[list[int], float]] = field(default_factory=dict)
    keys: set[tuple[bytes, bytes]] = field(default_factory=set)  # Python's (R10)
    cache: ReplyCache = field(
        default_factory=lambda: ReplyCache(
            max_entries=REPLY_CACHE_ENTRIES,
            max_bytes=REPLY_CACHE_BYTES,
            max_age_s=REPLY_CACHE_AGE_S,
        )
    )
    changed: set[str] = field(default_factory=set)
    taken: int = 0
    answered: int = 0
    handed_over: int = 0
    s0p_answered: int = 0
    sent: list[Message] = field(default_factory=list)  # the REQUESTs it sent workers

    # -- MirrorPort ------------------------------------------------------------------------------

    def note(
        self,
        channel: Channel,
        routing_id: bytes,
        promise_ms: int,
        gap_s: float,
        last_seen: float,
        majordomo: int,
        client_id: bytes,
        open: bool,
    ) -> None:
        self.table[(channel, routing_id)] = Note(promise_ms, majordomo, client_id, open)
        if channel is FRONT and majordomo:  # the core answers in the reading spoken last
            for record in self._all():
                if record.client == routing_id and record.reading:
                    record.reading = majordomo

    def _all(self) -> list[Record]:
        return [*self.records.values(), *(r for q in self.queues.values() for r in q)]

    def forget(self, channel: Channel, routing_id: bytes) -> None:
        self.table.pop((channel, routing_id), None)

    # -- LanePort ------------------------------------------------------------------------------

    def _hand(self, records: list[Record]) -> list[LaneRecord]:
        for record in records:
            if record.ticket:
                del self.records[record.ticket]
            else:
                self.queues[record.service].remove(record)
        self.handed_over += len(records)
        return [record.handed() for record in records]

    def adopt(self, ticket: bytes) -> LaneRecord | None:
        record = self.records.get(ticket)
        return None if record is None else self._hand([record])[0]

    def adopt_worker(self, routing_id: bytes) -> list[LaneRecord]:
        return self._hand(
            sorted(
                (r for r in self.records.values() if r.worker == routing_id), key=lambda r: r.ticket
            )
        )

    def adopt_all(self) -> list[LaneRecord]:
        waiting = sorted((r for q in self.queues.values() for r in q), key=lambda r: r.seq)
        return self._hand(sorted(self.records.values(), key=lambda r: r.ticket) + waiting)

    def adopt_due(self, now: float) -> list[LaneRecord]:
        due = [r for r in self._all() if r.deadline <= now]
        return self._hand(sorted(due, key=lambda r: (r.deadline, r.seq)))

    def adopt_next_waiting(self, service: str) -> LaneRecord | None:
        queue = self.queues.get(service)
        return self._hand(queue[:1])[0] if queue else None

    def waiting_head(self, service: str) -> LaneRecord | None:
        queue = self.queues.get(service)
        return queue[0].handed() if queue else None

    def dispatch_head(self, service: str, ticket: bytes, worker: bytes) -> None:
        record = self.queues[service].pop(0)  # (the core took the worker and holds the slot)
        record.ticket, record.worker = ticket, worker
        self.records[ticket] = record
        self.lent += 1

    def adopt_waiting(self, service: str) -> list[LaneRecord]:
        return self._hand(list(self.queues.get(service, ())))

    def waiting(self, service: str) -> int:
        return len(self.queues.get(service, ()))

    def waiting_total(self) -> int:
        return sum(map(len, self.queues.values()))

    def next_due(self) -> float | None:
        return min((r.deadline for r in self._all()), default=None)

    def _clients(self) -> list[Record]:
        """The records of clients' requests (a peer's FORWARD counts towards no client)."""
        return [r for r in self._all() if not r.origin]

    def held(self, client_id: bytes) -> int:
        return sum(1 for r in self._clients() if r.client_id == client_id)

    def busy(self, routing_id: bytes) -> bool:
        return any(r.client == routing_id for r in self._clients())

    def in_flight(self) -> int:
        return len(self.records)

    def open_by_connection(self) -> dict[bytes, int]:
        return dict(Counter(r.client for r in self._all()))  # (a peer link's FORWARDs too)

    def held_from(self, via: str) -> dict[str, int]:
        return dict(Counter(r.service for r in self._all() if r.origin and r.via == via))

    def held_by_client(self) -> dict[bytes, int]:
        return dict(Counter(r.client_id for r in self._clients()))

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def seq_from(self, number: int) -> None:
        self.seq = max(self.seq, number)

    def python_waits(self, service: str, count: int) -> None:
        assert count >= 0
        self.waits[service] = count

    def python_holds(self, client_id: bytes, count: int) -> None:
        assert count >= 0
        self.holds[client_id] = count

    def python_key(self, client_id: bytes, request_id: bytes, live: bool) -> None:
        if live:
            self.keys.add((client_id, request_id))
        else:
            self.keys.discard((client_id, request_id))

    def _by_key(self, client_id: bytes, request_id: bytes) -> Record | None:
        return next(
            (
                r
                for r in self._all()
                if r.ids and (r.client_id, r.request_id) == (client_id, request_id)
            ),
            None,
        )

    def adopt_key(self, client_id: bytes, request_id: bytes) -> LaneRecord | None:
        record = self._by_key(client_id, request_id)
        return None if record is None else self._hand([record])[0]

    # (the reply cache: scale0.core.requests.ReplyCache is what the C one copies)

    def cache_limits(self, max_entries: int, max_bytes: int, max_age_s: float) -> None:
        assert not len(self.cache)
        self.cache = ReplyCache(max_entries=max_entries, max_bytes=max_bytes, max_age_s=max_age_s)

    def cache_put(
        self,
        client_id: bytes,
        request_id: bytes,
        service: str,
        status: int,
        body: tuple[bytes, ...],
        expires: float,
    ) -> None:
        reply = ClientReply(service, request_id, status, body)
        self.cache.put_until((client_id, request_id), reply, expires)

    def cache_get(
        self, client_id: bytes, request_id: bytes, now: float
    ) -> tuple[str, int, tuple[bytes, ...]] | None:
        reply = self.cache.get((client_id, request_id), now)
        return None if reply is None else (reply.service, reply.status, reply.body)

    def cache_prune(self, now: float) -> None:
        self.cache.prune(now)

    def cache_count(self) -> int:
        return len(self.cache)

    def cache_take(self) -> list[LaneCached]:
        return [
            (key[0], key[1], reply.service, reply.status, reply.body, expires)
            for key, reply, expires in self.cache.take()
        ]

    # -- the node's part -----------------------------------------------------------------------

    def serve(
        self,
        on: bool,
        timeout_s: float,
        cap: int,
        prefix: bytes,
        max_queued: int,
        may_queue: bool,
    ) -> None:
        self.on, self.timeout_s, self.cap, self.prefix = on, timeout_s, cap, prefix
        self.max_queued, self.may_queue = max_queued, may_queue

    def serve_forwards(self, on: bool) -> None:
        self.forwards_on = on

    def peer(
        self, broker_id: bytes, usable: bool, forward_with: bool, free: dict[str, int]
    ) -> None:
        self.peers[broker_id] = (usable, forward_with, dict(free))

    def forget_peer(self, broker_id: bytes) -> None:
        self.peers.pop(broker_id, None)

    def peer_deltas(self) -> list[tuple[bytes, str, int]]:
        deltas = sorted((b, s, d) for (b, s), d in self.deltas.items() if d)
        self.deltas = Counter()
        return deltas

    def forwarded_to(self, broker_id: bytes) -> dict[str, int]:
        name = broker_id.decode()
        return dict(Counter(r.service for r in self.records.values() if r.peer == name))

    def adopt_peer(self, broker_id: bytes) -> list[LaneRecord]:
        name = broker_id.decode()
        return self._hand(
            sorted((r for r in self.records.values() if r.peer == name), key=lambda r: r.ticket)
        )

    def _move(self, broker_id: bytes, service: str, delta: int) -> None:
        told = self.peers.get(broker_id)
        if told is not None:  # (a peer forgotten since: only the delta, the family drops it)
            told[2][service] = told[2].get(service, 0) + delta
        self.deltas[(broker_id, service)] += delta

    def drain(
        self,
    ) -> tuple[int, int, list[tuple[str, int, list[int], float]], list[str], int, int]:
        latencies = [
            (service, status, counts, total)
            for (service, status), (counts, total) in sorted(self.latency.items())
        ]
        drained = (
            self.requests,
            self.replies,
            latencies,
            sorted(self.changed),
            self.forwards,
            self.forwarded_out,
        )
        self.requests = self.replies = self.forwards = self.forwarded_out = 0
        self.latency = {}
        self.changed = set()
        return drained

    # -- the take rule -----------------------------------------------------------------------

    def receive(
        self, channel: Channel, rid: bytes, message: Message, now: float
    ) -> list[Effect] | None:
        """The lane's effects if it takes ``message``, None if it passes it to the core."""
        if not self.on:
            return None
        if channel is FRONT and isinstance(message, MdpClientRequest):
            reading = reading_code((message.protocol, message.delimited, message.majortomo))
            return self._request(rid, reading, message.service, b"", message.body, now)
        if channel is FRONT and isinstance(message, ClientRequest):
            return self._request(rid, 0, message.service, message.request_id, message.body, now)
        if channel is BACK and isinstance(message, MdpWorkerReply):
            return self._reply(rid, message.ticket, True, 200, message.body, now)
        if channel is BACK and isinstance(message, WorkerReply):
            return self._reply(rid, message.ticket, False, message.status, message.body, now)
        if channel is PEER and isinstance(message, Forward):
            return self._forward(rid, message, now)
        if channel is LINK and isinstance(message, ForwardReply):
            return self._peer_reply(rid, message, now)
        return None

    def _pick(self, service: str, free_only: bool) -> bytes | None:
        """Forwarding.pick_peer: the usable peer offering ``service`` with the most free slots
        (with ``free_only``: > 0), the first of equals in the order told."""
        best: bytes | None = None
        best_free = 0
        for broker_id, (usable, _, free) in self.peers.items():
            slots = free.get(service)
            if not usable or slots is None or (free_only and slots <= 0):
                continue
            if best is None or slots > best_free:
                best, best_free = broker_id, slots
        return best

    def _forward_out(self, record: Record, broker_id: bytes, now: float) -> list[Effect]:
        """Phase 4b: ``record`` (an S0P client's, no worker ready) to that peer, as
        Forwarding.forward_to sends it."""
        ticket = self.prefix + self.next_seq().to_bytes(8, "big")
        record.ticket, record.peer = ticket, broker_id.decode()
        self.records[ticket] = record
        self._move(broker_id, record.service, -1)
        self.forwarded_out += 1
        self.sent_out += 1
        _, forward_with, _ = self.peers[broker_id]
        forward: Message
        if forward_with:
            forward = Forward(
                ticket,
                record.service,
                self.identity,
                record.body,
                client_id=record.client_id.decode(),
                request_id=record.request_id,
                deadline_ms=max(0, int((record.deadline - now) * 1000)),
            )
        else:
            forward = Forward(ticket, record.service, self.identity, record.body)
        return [Send(LINK, broker_id, forward)]

    def _peer_reply(self, link: bytes, message: ForwardReply, now: float) -> list[Effect] | None:
        """Phase 4b: a FORWARDREPLY on our link to a peer, to a request the lane forwarded
        there; not a 404 or 503 (F8: the core routes it again), nor while something of its
        service waits (F9: the core's drain_to_peers goes first)."""
        record = self.records.get(message.ticket)
        if (
            record is None
            or record.peer != link.decode()
            or message.status in (404, 503)
            or self.waits.get(record.service, 0)
            or self.waiting(record.service)
        ):
            return None
        del self.records[message.ticket]
        self._move(link, record.service, +1)
        self.replies += 1
        empty = ([0] * (len(LATENCY_BUCKETS_S) + 1), 0.0)
        counts, total = self.latency.get((record.service, message.status), empty)
        seconds = max(0.0, now - record.started)
        counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.latency[(record.service, message.status)] = (counts, total + seconds)
        self.heard.append((LINK, link, now))
        self.peer_answered += 1
        answer = ClientReply(record.service, record.request_id, message.status, message.body)
        self.s0p_answered += 1
        expires = now + self.cache.max_age_s
        self.cache.put_until((record.client_id, record.request_id), answer, expires)
        return [Send(FRONT, record.client, answer)]

    def _forward(self, rid: bytes, message: Forward, now: float) -> list[Effect] | None:
        """Phase 4a: a peer's FORWARD or FORWARDWITH (not FORWARDAS: no caller), with a
        deadline left if it says one, from a link the lane was told of, to the least recently
        used ready S0P worker, or queued when none is ready (in a family too: F6)."""
        note = self.table.get((PEER, rid))
        if (
            not self.forwards_on
            or note is None
            or not note.open
            or message.caller
            or message.deadline_ms == 0
            or message.service.startswith(("mmi.", "scale0."))
        ):
            return None
        ids = bool(message.client_id)
        if ids:  # R10 across brokers: a key the core holds, the lane holds or has cached
            key = (message.client_id.encode(), message.request_id)
            if (
                key in self.keys
                or self._by_key(*key) is not None
                or self.cache.get(key, now) is not None
            ):
                return None
        self.counter += 1
        seq = self.next_seq()
        service = message.service
        queue = self.pool.queue(service)  # type: ignore[attr-defined]
        waits = self.waits.get(service, 0)
        if queue:
            if waits or not self._can_write(queue[0], 0):
                return None
        elif (
            not self.pool.offered_count(service)  # type: ignore[attr-defined]
            or waits + self.waiting(service) >= self.max_queued
        ):
            return None  # (the core's 404, F7, or 503, R6)
        limit = float("inf")
        deadline = now + self.timeout_s
        if message.deadline_ms is not None:  # (as Forwarding.forward_in computes them)
            limit = now + message.deadline_ms / 1000
            deadline = min(now + self.timeout_s, limit)
        record = Record(
            b"",
            b"",
            rid,
            message.client_id.encode() if ids else b"\x00" + note.client_id,
            message.service,
            message.body,
            now,
            deadline,
            message.request_id if ids else b"",
            0,
            seq,
            origin=message.ticket,
            via=note.client_id.decode(),
            limit=limit,
            forwarded_ids=ids,
        )
        if queue:
            worker = self.pool.take(service)  # type: ignore[attr-defined]
            effects = self._dispatch(record, worker)
        else:  # F6: never forwarded again, so it may wait in the lane in a family too
            self.queues.setdefault(service, []).append(record)
            self.queued += 1
            effects = []
        self.requests += 1
        self.forwards += 1
        self.forwarded += 1
        self.heard.append((PEER, rid, now))
        self.taken += 1
        return effects

    def _can_write(self, worker: bytes, reading: int) -> bool:
        """Whether ``worker`` may be sent a request of a client of ``reading`` (0: S0P): it
        speaks the same protocol, and it has made no promise (R23)."""
        wnote = self.table.get((BACK, worker))
        return wnote is not None and bool(wnote.reading) == bool(reading) and not wnote.promise_ms

    def _request(
        self,
        rid: bytes,
        reading: int,
        service: str,
        request_id: bytes,
        body: tuple[bytes, ...],
        now: float,
    ) -> list[Effect] | None:
        pool = self.pool
        note = self.table.get((FRONT, rid))
        if (
            service.startswith(("mmi.", "scale0."))
            or note is None
            or note.reading != reading
            or not note.open
            or note.promise_ms
            or self.held(note.client_id) + self.holds.get(note.client_id, 0) >= self.cap
        ):
            return None
        if not reading:  # R10: a key the core holds, the lane holds or has cached is the core's
            key = (note.client_id, request_id)
            if (
                key in self.keys
                or self._by_key(*key) is not None
                or self.cache.get(key, now) is not None
            ):
                return None
        queue = pool.queue(service)  # type: ignore[attr-defined]
        self.counter += 1
        record = Record(
            b"",
            b"",
            rid,
            note.client_id,
            service,
            body,
            now,
            now + self.timeout_s,
            request_id if not reading else b"mdp.L%d" % self.counter,
            reading,
            self.next_seq(),
        )
        chosen = None
        if not queue and not reading and self.forwards_on and self.identity:
            chosen = self._pick(service, True)
            if chosen is None and not pool.offered_count(service):  # type: ignore[attr-defined]
                chosen = self._pick(service, False)  # (F6: not ours, so any peer offering it)
        if queue:
            worker = queue[0]
            if self.waits.get(service, 0) or not self._can_write(worker, reading):
                return None
            assert pool.take(service) == worker  # type: ignore[attr-defined]
            effects = self._dispatch(record, worker)
        elif chosen is not None and not self.waits.get(service, 0):
            effects = self._forward_out(record, chosen, now)  # F6, phase 4b
        elif (
            self.may_queue
            and pool.offered_count(service)  # type: ignore[attr-defined]
            and self.waits.get(service, 0) + self.waiting(service) < self.max_queued
        ):
            self.queues.setdefault(service, []).append(record)
            self.queued += 1
            effects = []
        else:
            return None
        self.requests += 1
        self.heard.append((FRONT, rid, now))
        self.taken += 1
        return effects

    def _dispatch(self, record: Record, worker: bytes) -> list[Effect]:
        """``record`` to ``worker`` (taken from the pool): a ticket, its slot, its REQUEST in
        the worker's protocol (IDREQUEST to an S0P worker that asked for ids)."""
        self.tickets += 1
        ticket = self.prefix + self.next_seq().to_bytes(8, "big")  # (one numbering: _lane.c)
        self.pool.hold(worker, ticket)  # type: ignore[attr-defined]
        record.ticket, record.worker = ticket, worker
        self.records[ticket] = record
        self.changed.add(record.service)
        wnote = self.table[(BACK, worker)]
        request: Message
        if wnote.reading:
            protocol, delimited = _worker_reading(wnote.reading)
            request = MdpWorkerRequest(ticket, record.body, protocol=protocol, delimited=delimited)
        elif self.pool.ids_of(worker):  # type: ignore[attr-defined]
            own = not record.origin or record.ids  # (a FORWARD without ids: empty ids)
            client_id = record.client_id.decode() if own else ""
            request = WorkerIdRequest(
                ticket, record.service, client_id, record.request_id if own else b"", record.body
            )
        else:
            request = WorkerRequest(ticket, record.service, record.body)
        self.sent.append(request)
        return [Send(BACK, worker, request)]

    def _reply(
        self,
        rid: bytes,
        ticket: bytes,
        majordomo: bool,
        status: int,
        body: tuple[bytes, ...],
        now: float,
    ) -> list[Effect] | None:
        record = self.records.get(ticket)
        if record is None or record.worker != rid or bool(record.reading) != majordomo:
            return None
        # What the worker serves now (a READY since may have changed it), in its order: a
        # request waiting in the core for one of them is the core's to give it; else the
        # first of the lane's queues that holds one, if the worker can be written its head
        services = self.services_of(rid)
        if any(self.waits.get(service, 0) for service in services):
            return None
        queued = next((s for s in services if self.queues.get(s)), None)
        if queued is not None and self.pool.spare(rid) < 0:  # type: ignore[attr-defined]
            queued = None  # a READY lowered its capacity: full even once this one is answered
        if queued is not None and not self._can_write(rid, self.queues[queued][0].reading):
            return None
        del self.records[ticket]
        self.pool.release(rid, ticket)  # type: ignore[attr-defined]
        effects: list[Effect] = []
        if queued is not None:
            effects = self._dispatch(self.queues[queued].pop(0), rid)
        else:
            self.pool.list_ready(rid)  # type: ignore[attr-defined]
        self.replies += 1
        empty = ([0] * (len(LATENCY_BUCKETS_S) + 1), 0.0)
        counts, total = self.latency.get((record.service, status), empty)
        seconds = max(0.0, now - record.started)
        counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.latency[(record.service, status)] = (counts, total + seconds)
        self.changed.add(record.service)
        self.heard.append((BACK, rid, now))
        self.answered += 1
        answer: Message
        if record.origin:  # a peer's: FORWARDREPLY on the peer ROUTER, cached with its ids
            if record.ids:
                expires = now + self.cache.max_age_s
                cached = ClientReply(record.service, record.request_id, status, body)
                self.cache.put_until((record.client_id, record.request_id), cached, expires)
            return [Send(PEER, record.client, ForwardReply(record.origin, status, body)), *effects]
        if record.reading:
            protocol, delimited, majortomo = _client_reading(record.reading)
            answer = MdpClientReply(
                record.service, body, protocol=protocol, delimited=delimited, majortomo=majortomo
            )
        else:
            answer = ClientReply(record.service, record.request_id, status, body)
            self.s0p_answered += 1
            expires = now + self.cache.max_age_s
            self.cache.put_until((record.client_id, record.request_id), answer, expires)
        return [Send(FRONT, record.client, answer), *effects]


Op = tuple[object, ...]

OPS = st.one_of(
    st.tuples(
        st.just("request"),
        st.sampled_from(CLIENTS),
        st.sampled_from(CLIENT_READINGS),
        st.sampled_from(SERVICES),
    ),
    st.tuples(
        st.just("request"),
        st.sampled_from(CLIENTS),
        st.sampled_from(CLIENT_READINGS[:2]),
        st.just("echo"),
    ),
    st.tuples(
        st.just("ready"),
        st.sampled_from(WORKERS),
        st.sampled_from(WORKER_READINGS),
        st.sampled_from(("echo", "echo", "other")),
    ),
    st.tuples(st.just("reply"), st.sampled_from(WORKERS)),
    st.tuples(st.just("reply"), st.sampled_from(WORKERS)),
    st.tuples(st.just("partial"), st.sampled_from(WORKERS)),
    st.tuples(st.just("beat"), st.sampled_from(WORKERS)),
    st.tuples(st.just("bye"), st.sampled_from(WORKERS)),
    st.tuples(
        st.just("s0p_request"),
    ),
    st.tuples(
        st.just("s0p"),
        st.sampled_from(S0P_CLIENTS),
        st.sampled_from(S0P_IDS),
        st.sampled_from(("echo", "echo", "other")),
    ),
    st.tuples(
        st.just("s0p_ready"),
        st.sampled_from(S0P_WORKERS),
        st.booleans(),
        st.sampled_from(("echo", "echo", "other")),
        st.sampled_from((1, 1, 2)),
    ),
    st.tuples(st.just("s0p_reply"), st.sampled_from(S0P_WORKERS), st.sampled_from((200, 500))),
    st.tuples(st.just("s0p_reply"), st.sampled_from(S0P_WORKERS), st.just(200)),
    st.tuples(st.just("s0p_partial"), st.sampled_from(S0P_WORKERS)),
    st.tuples(st.just("s0p_beat"), st.sampled_from(S0P_WORKERS)),
    st.tuples(st.just("s0p_client_beat"), st.sampled_from(S0P_CLIENTS)),
    st.tuples(st.just("s0p_hello"), st.sampled_from(S0P_CLIENTS + S0P_WORKERS)),
    st.tuples(st.just("advance"), st.sampled_from((0.2, 0.9, 2.0, 6.0))),
    st.tuples(
        st.just("status"),
    ),
)


def _services(ledger: CPoolLedger, routing_id: bytes) -> tuple[str, ...]:
    worker = ledger.worker(routing_id)
    assert worker is not None  # (a worker dismissed has had its requests adopted)
    return worker.services


#: The peer of the family in ``Twins(peer=True)``: broker b2, its link's routing id on our
#: peer ROUTER.
PEER_ID = "b2"
PEER_LINK = b"\x00p2"
PEER_ENTRY = BrokerEntry(
    identity=PEER_ID,
    frontend="tcp://127.0.0.1:7011",
    backend="tcp://127.0.0.1:7012",
    peer="tcp://127.0.0.1:7013",
    config_pub="tcp://127.0.0.1:7014",
)
#: b2's HELLO, on its link to us and as its answer on ours (it understands FORWARDWITH).
PEER_HELLO = Hello(
    PEER_ID,
    NETWORK.family,
    BrokerState.ACTIVE,
    3,
    {},
    TableMode.PULL,
    understands=frozenset({FORWARD_WITH_NAME}),
)


class Twins:
    def __init__(self, *, peer: bool = False, **network: object) -> None:
        if peer:  # a family of two: b2 forwards to us (phase 4a) and we may forward to it
            network["brokers"] = (*NETWORK.brokers, PEER_ENTRY)
        self.a = Harness(**network)
        self.b = Harness(**network)
        ledger = self.b.broker.ledger
        assert isinstance(ledger, CPoolLedger)
        self.lane = RequestLane(ledger.cpool, lambda rid: _services(ledger, rid))
        self.b.broker.mirror_sessions(self.lane)
        self.b.broker.attach_lane(self.lane)
        self.lane.serve_forwards(True)  # (as the node tells it at the start)
        self.serving: tuple[bool, float, int, bytes, int, bool] | None = None
        # Per broker: each worker's requests not answered yet (tickets, in order), and the
        # canonical name of every ticket (the order it was first seen)
        self.open: list[dict[bytes, list[bytes]]] = [defaultdict(list), defaultdict(list)]
        self.names: list[dict[bytes, int]] = [{}, {}]
        self.readings: dict[bytes, tuple[bytes, bool]] = {}
        self.s0p_ids = 0
        self.steps = 0
        self.sent_ids: dict[bytes, list[bytes]] = defaultdict(list)  # per S0P client
        self.peer_told: dict[bytes, bytes] = {}
        self.forward_ids: list[bytes] = []  # the request_ids b2's FORWARDWITHs carried
        self.tickets = 0
        # Phase 4b: what the lane was told of the peers it may forward to; per broker, our
        # FORWARDs to b2 not answered yet (tickets, in order); b2's table version
        self.peers_told: dict[bytes, tuple[bool, bool, dict[str, int]]] = {}
        self.out_open: list[list[bytes]] = [[], []]
        self.table_seq = 0
        self.lane.identity = self.b.broker.core.identity
        self._unlock()
        if peer:
            for harness in (self.a, self.b):
                harness.broker.handle(Start(), harness.now, harness.wall)  # (its links planned)
            for harness in (self.a, self.b):
                harness.send(PEER, PEER_LINK, PEER_HELLO)  # its link to us
                harness.send(LINK, PEER_ID.encode(), PEER_HELLO)  # its answer on ours: linked
            self._unlock()
        for harness in (self.a, self.b):
            for rid in S0P_CLIENTS:
                harness.client(rid)
            for rid in S0P_WORKERS:
                harness.send(
                    BACK,
                    rid,
                    CheckConfig(config_type=ConfigType.JSON, config_version=3, protocol=SIG_WORKER),
                )

    def _round(self) -> None:
        """The node's round start: what the lane heard and did goes to the core first."""
        heard, self.lane.heard = self.lane.heard, []
        broker = self.b.broker
        if heard:
            broker.heard_elsewhere(heard)
        requests, replies, latencies, changed, forwards, forwarded = self.lane.drain()
        if requests or replies or changed:
            broker.lane_did(requests, replies, latencies, changed, self.b.now, forwards, forwarded)
        broker.lane_moved(self.lane.peer_deltas())

    def _unlock(self) -> None:
        """The node's end of an entry into the core: the lane told what it may serve."""
        serving = self.b.broker.lane_serves()
        if serving != self.serving:
            if not serving[0]:
                self.b.broker.adopt_lane()
            self.lane.serve(*serving)
            self.serving = serving
        # (as LaneMirror.peers tells it: the links whose FORWARDs the lane may take)
        peers = self.b.broker.lane_peers()
        for rid in self.peer_told.keys() - peers.keys():
            self.lane.forget(PEER, rid)
        for rid, broker_id in peers.items():
            if self.peer_told.get(rid) != broker_id:
                self.lane.note(PEER, rid, 0, 0.0, 0.0, 0, broker_id, True)
        self.peer_told = peers
        # (and the peers it may forward to, phase 4b, whenever what it holds differs: once
        # what it moved since is applied, or a count it moved would be told back unmoved)
        self.b.broker.lane_moved(self.lane.peer_deltas())
        forward_peers = self.b.broker.lane_forward_peers()
        for name in self.peers_told.keys() - forward_peers.keys():
            self.lane.forget_peer(name)
        for name, told in forward_peers.items():
            if self.lane.peers.get(name) != told:
                self.lane.peer(name, *told)
        self.peers_told = forward_peers

    def _message(self, op: Op, which: int) -> tuple[Channel, bytes, Message] | None:
        kind = op[0]
        if kind == "request":
            _, rid, (protocol, delimited, majortomo), service = op  # type: ignore[misc]
            return (
                FRONT,
                rid,
                MdpClientRequest(
                    service,
                    (b"body%d" % self.steps,),  # (which request a worker gets shows)
                    protocol=protocol,
                    delimited=delimited,
                    majortomo=majortomo,
                ),
            )  # type: ignore[arg-type]
        if kind == "ready":
            _, rid, (protocol, delimited), service = op  # type: ignore[misc]
            return BACK, rid, MdpWorkerReady(service, protocol=protocol, delimited=delimited)  # type: ignore[arg-type]
        if kind == "forward":  # b2 forwards us a request: plain, with a deadline, with ids
            _, form, pick, service, deadline_ms = op
            assert isinstance(service, str) and isinstance(deadline_ms, int)
            if which == 0:
                self.tickets += 1
                if form == "ids" and (pick == "new" or not self.forward_ids):
                    self.forward_ids.append(b"f%d" % self.tickets)
            ticket = b"T%d" % self.tickets
            body = (b"body%d" % self.steps,)
            if form == "plain":
                return PEER, PEER_LINK, Forward(ticket, service, PEER_ID, body)
            if form == "with":
                forward = Forward(ticket, service, PEER_ID, body, deadline_ms=deadline_ms)
                return PEER, PEER_LINK, forward
            request_id = self.forward_ids[-1]
            forward = Forward(
                ticket,
                service,
                PEER_ID,
                body,
                client_id="fc",
                request_id=request_id,
                deadline_ms=deadline_ms,
            )
            return PEER, PEER_LINK, forward
        if kind == "peer_beat":
            return PEER, PEER_LINK, PeerHeartbeat(PEER_ID, self.a.wall, BrokerState.ACTIVE, 3, 0)
        if kind == "table_req":  # F16: the slots b2's forwards hold here, the lane's too
            return PEER, PEER_LINK, TableReq(PEER_ID)
        if kind == "table":  # b2's table on our link: echo and other, and its count of ours
            slots = op[1]
            assert isinstance(slots, int)
            if which == 0:
                self.table_seq += 1
            rows = tuple(
                TableService(service, (TableWorker("bw", 2, self.a.wall),))
                for service in ("echo", "other")
            )
            table = Table(
                PEER_ID,
                self.table_seq,
                True,
                rows,
                slots=(("echo", slots), ("other", slots)),
            )
            return LINK, PEER_ID.encode(), table
        if kind == "link_hello":  # b2 answers our link's HELLO (again, after a silence)
            return LINK, PEER_ID.encode(), PEER_HELLO
        if kind == "fwd_reply":  # b2 answers the oldest of ours it holds
            outstanding = self.out_open[which]
            if not outstanding:
                return None
            status = op[1]
            assert isinstance(status, int)
            reply = ForwardReply(outstanding.pop(0), status, (b"there",))
            return LINK, PEER_ID.encode(), reply
        rid = op[1] if len(op) > 1 else b""
        assert isinstance(rid, bytes)
        protocol, delimited = self.readings.get(rid, (MDPW02, True))
        tickets = self.open[which].get(rid)
        if kind in ("reply", "partial"):
            if not tickets:
                return None
            ticket = tickets[0]
            if kind == "partial":
                if protocol != MDPW02:
                    return None
                return BACK, rid, MdpWorkerPartial(ticket, (b"part",), delimited=delimited)
            tickets.pop(0)
            return (
                BACK,
                rid,
                MdpWorkerReply(ticket, (b"done",), protocol=protocol, delimited=delimited),
            )
        if kind == "s0p_ready":
            _, rid, ids, service, capacity = op  # type: ignore[misc]
            wall = self.a.wall
            ready = Ready((service,), True, 1000, wall, 3, capacity, ids)  # type: ignore[arg-type]
            return BACK, rid, ready
        if kind in ("s0p_reply", "s0p_partial"):
            if not tickets:
                return None
            if kind == "s0p_partial":
                return BACK, rid, WorkerPartial(tickets[0], (b"part",))
            status = op[2]
            assert isinstance(status, int)
            return BACK, rid, WorkerReply(tickets.pop(0), status, (b"done",))
        if kind == "s0p_beat":
            return BACK, rid, Heartbeat(time=self.a.wall, config_version=3, protocol=SIG_WORKER)
        if kind == "s0p_hello":  # a CHECKCONFIG: a session lost at a long advance comes back
            channel, protocol = (FRONT, SIG_CLIENT) if rid in S0P_CLIENTS else (BACK, SIG_WORKER)
            hello = CheckConfig(config_type=ConfigType.JSON, config_version=3, protocol=protocol)
            return channel, rid, hello
        if kind == "s0p_client_beat":
            return FRONT, rid, Heartbeat(time=self.a.wall, config_version=3, protocol=SIG_CLIENT)
        if kind == "beat":
            return BACK, rid, MdpWorkerHeartbeat(protocol=protocol, delimited=delimited)
        if kind == "bye":
            return BACK, rid, MdpWorkerDisconnect(protocol=protocol, delimited=delimited)
        raise AssertionError(op)

    def _seen(self, effects: list[Effect], which: int) -> list[tuple[Channel, bytes, object]]:
        """The sends, tickets named by the order they were first seen (a worker's requests
        not answered remembered, a lost worker's forgotten)."""
        names = self.names[which]
        seen: list[tuple[Channel, bytes, object]] = []
        for effect in effects:
            if not isinstance(effect, Send):
                continue
            message = effect.message
            if isinstance(message, (MdpWorkerRequest, WorkerRequest, WorkerIdRequest)):
                name = names.setdefault(message.ticket, len(names))
                self.open[which][effect.routing_id].append(message.ticket)
                ids: tuple[str, bytes] | None = None
                if isinstance(message, WorkerIdRequest):
                    ids = (message.client_id, message.request_id)
                    if message.request_id.startswith(b"mdp."):  # the lane's are mdp.L<n>, D1
                        ids = (message.client_id, b"mdp.*")
                what = ("request", name, type(message).__name__, ids, message.body)
                seen.append((effect.channel, effect.routing_id, what))
            elif isinstance(message, Forward) and effect.channel is LINK:
                name = names.setdefault(message.ticket, len(names))
                self.out_open[which].append(message.ticket)
                what = (
                    "forward",
                    name,
                    message.service,
                    message.body,
                    message.client_id,
                    message.request_id,
                    message.deadline_ms,
                    message.origin_broker,
                )
                seen.append((effect.channel, effect.routing_id, what))
            elif isinstance(message, MdpWorkerDisconnect):
                self.open[which].pop(effect.routing_id, None)
                seen.append((effect.channel, effect.routing_id, message))
            else:
                seen.append((effect.channel, effect.routing_id, message))
        return seen

    def step(self, op: Op) -> None:
        self.steps += 1
        kind = op[0]
        a, b = self.a, self.b
        self._round()
        if kind == "advance":
            seconds = float(op[1])  # type: ignore[arg-type]
            out_a = a.advance(seconds)
            b.now += seconds
            b.wall += seconds
            b.broker.adopt_due(b.now)
            out_b = b.broker.handle(Tick(), b.now, b.wall)
        elif kind == "status":
            assert a.broker.stats()["in_flight"] == b.broker.stats()["in_flight"]
            view_a, view_b = (
                a.broker.ledger.open_by_connection(),
                b.broker.ledger.open_by_connection(),
            )
            assert view_a == view_b
            out_a, out_b = [], []
        elif kind in ("s0p_request", "s0p"):
            rid, pick, service = (S0P_CLIENT, "new", "echo") if kind == "s0p_request" else op[1:]
            assert isinstance(rid, bytes) and isinstance(service, str)
            sent = self.sent_ids[rid]
            if pick == "new" or len(sent) < (1 if pick == "again" else 2):
                self.s0p_ids += 1
                sent.append(b"s%d" % self.s0p_ids)
                request_id = sent[-1]
            else:
                request_id = sent[-1] if pick == "again" else sent[-2]
            request = ClientRequest(service, request_id, (b"body%d" % self.steps,))
            out_a = a.send(FRONT, rid, request)
            taken = self.lane.receive(FRONT, rid, request, b.now)
            out_b = taken if taken is not None else b.send(FRONT, rid, request)
        else:
            got_a, got_b = self._message(op, 0), self._message(op, 1)
            assert (got_a is None) == (got_b is None), (op, got_a, got_b)
            if got_a is None or got_b is None:
                return
            if kind == "ready":
                self.readings[got_a[1]] = op[2]  # type: ignore[assignment]
            out_a = a.send(*got_a)
            taken = self.lane.receive(got_b[0], got_b[1], got_b[2], b.now)
            out_b = taken if taken is not None else b.send(*got_b)
        self._unlock()
        seen_a, seen_b = self._seen(out_a, 0), self._seen(out_b, 1)
        for peer in {(c, r) for c, r, _ in seen_a + seen_b}:
            got_a_peer = [m for c, r, m in seen_a if (c, r) == peer]
            got_b_peer = [m for c, r, m in seen_b if (c, r) == peer]
            if kind == "advance":
                # Deadlines that are equal fire in the order their timers were pushed, and an
                # adopted request's is pushed when it is adopted: a Tick's answers to one peer
                # are compared as a multiset (they only answer: nothing is dispatched by them)
                got_a_peer, got_b_peer = (
                    sorted(map(repr, got_a_peer)),
                    sorted(map(repr, got_b_peer)),
                )
            assert got_a_peer == got_b_peer, (op, peer, got_a_peer, got_b_peer)

    def finish(self) -> None:
        self._round()
        a, b = self.a.broker, self.b.broker
        keys = (
            "requests",
            "replies",
            "retries",
            "workers_lost",
            "dropped",
            "errors_504",
            "errors_503",
            "cache_hits",
            "duplicates_joined",
            "forwards_served",
        )
        assert {k: a.core.counters.get(k) for k in keys} == {
            k: b.core.counters.get(k) for k in keys
        }
        assert a.core.metrics.replies == b.core.metrics.replies
        for service, stats in a.core.metrics.services.items():
            other = b.core.metrics.services[service]
            assert stats.replies == other.replies, service
            assert stats.latency.counts == other.latency.counts, service
            assert stats.latency.sum_s == pytest.approx(other.latency.sum_s), service
        assert a.stats()["in_flight"] == b.stats()["in_flight"]
        assert a.stats()["queued"] == b.stats()["queued"]
        assert sorted(a.ledger.held_by_client().values()) == sorted(
            b.ledger.held_by_client().values()
        )
        assert a.ledger.open_by_connection() == b.ledger.open_by_connection()
        assert a.ledger.cached_count() == b.ledger.cached_count()
        b.attach_lane(None)  # what the lane holds is adopted: then the ledgers agree in full
        assert a.stats()["in_flight"] == b.stats()["in_flight"]
        assert sorted(a.ledger.held_by_client().values()) == sorted(
            b.ledger.held_by_client().values()
        )


def _play(ops: list[Op]) -> Twins:
    twins = Twins()
    for op in ops:
        twins.step(op)
    twins.finish()
    return twins


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_a_broker_whose_lane_takes_majordomo_requests_answers_as_one_without(ops: list[Op]) -> None:
    _play(ops)


def _ready(rid: bytes, reading: tuple[bytes, bool] = (MDPW02, True), service: str = "echo") -> Op:
    return ("ready", rid, reading, service)


def _request(
    rid: bytes, reading: tuple[bytes, bool, bool] = (MDPC02, True, False), service: str = "echo"
) -> Op:
    return ("request", rid, reading, service)


def test_the_lane_takes_a_plain_request_and_its_reply() -> None:
    """The common case really is the lane's: nothing of it reaches broker B once the client
    has its session (its first request opens it in the core, D1)."""
    twins = _play(
        [
            _ready(WORKERS[0]),
            *[_request(CLIENTS[0]), ("reply", WORKERS[0])] * 3,
            *[_request(CLIENTS[1], (MDPC01, True, False)), ("reply", WORKERS[0])] * 2,
        ]
    )
    assert (twins.lane.taken, twins.lane.answered, twins.lane.handed_over) == (3, 3, 0)


def test_the_lanes_queue_is_behind_the_cores() -> None:
    """R6 across the two queues: a new client's first request (its session opens in the
    core, D1) waits in the core for the busy worker, the next request waits in the lane behind
    it. The lane's REPLY that frees the worker goes to the core (a request waits there), which
    gives the worker its waiting request; that one's REPLY frees it again, and the core, its
    own queue empty, lends it the lane's head, which stays the lane's: the lane answers it."""
    twins = _play(
        [
            _ready(WORKERS[0]),
            _request(CLIENTS[0]),
            ("reply", WORKERS[0]),
            _request(CLIENTS[0]),  # the lane's, dispatched
            _request(CLIENTS[1]),  # waits in the core: the lane is told
            _request(CLIENTS[0]),  # waits in the lane, behind it
            ("reply", WORKERS[0]),  # to the core: the lane's request adopted, answered
            ("reply", WORKERS[0]),  # the core's: the lane's head lent the freed worker
            ("reply", WORKERS[0]),  # the lane's again: it answers
        ]
    )
    lane = twins.lane
    assert (lane.taken, lane.answered, lane.handed_over, lane.lent) == (2, 1, 1, 1)
    assert lane.queued == 1 and not any(lane.waits.values())


def test_the_lane_serves_its_own_queue() -> None:
    """The issue's bench in small: more requests than workers, all Majordomo: after the
    clients' first requests (which open their sessions in the core) everything stays in the
    lane: queued, dispatched at each REPLY, answered."""
    first = [
        _request(CLIENTS[0]),
        _request(CLIENTS[1]),
        ("reply", WORKERS[0]),
        ("reply", WORKERS[1]),
    ]
    window = [_request(CLIENTS[i % 2]) for i in range(6)]
    replies = [("reply", WORKERS[i % 2]) for i in range(6)]
    twins = _play([_ready(WORKERS[0]), _ready(WORKERS[1]), *first, *window, *replies])
    assert (twins.lane.taken, twins.lane.answered, twins.lane.handed_over) == (6, 6, 0)
    assert twins.lane.queued == 4


def test_the_lanes_requests_are_retried_when_their_worker_is_lost_and_time_out() -> None:
    """R8, R9: the worker running the lane's request says DISCONNECT: the request is adopted
    and dispatched again to the other worker, which never answers: 504 on the Tick."""
    twins = _play(
        [
            _ready(WORKERS[0]),
            _ready(WORKERS[1]),
            _request(CLIENTS[0]),
            ("reply", WORKERS[0]),
            _request(CLIENTS[0]),  # the lane's, at WORKERS[1] (least recently used)
            ("bye", WORKERS[1]),
            ("advance", 6.0),
        ]
    )
    assert (twins.lane.taken, twins.lane.handed_over) == (1, 1)
    counters = twins.a.broker.core.counters
    assert (counters["retries"], counters["errors_504"]) == (1, 1)


def test_the_lanes_request_past_its_deadline_is_answered_504_on_the_tick() -> None:
    twins = _play(
        [_ready(WORKERS[0]), _request(CLIENTS[0]), ("reply", WORKERS[0]), _request(CLIENTS[0])]
        + [("beat", WORKERS[0]), ("advance", 0.9)] * 7
    )
    assert (twins.lane.taken, twins.lane.handed_over) == (1, 1)
    assert twins.a.broker.core.counters["errors_504"] == 1


def test_a_partial_hands_the_request_to_the_core() -> None:
    twins = _play(
        [
            _ready(WORKERS[0]),
            _request(CLIENTS[0]),
            ("reply", WORKERS[0]),
            _request(CLIENTS[0]),
            ("partial", WORKERS[0]),
            ("reply", WORKERS[0]),
        ]
    )
    assert (twins.lane.taken, twins.lane.answered, twins.lane.handed_over) == (1, 0, 1)


def test_the_cap_per_client_counts_the_lanes_requests_too() -> None:
    """R20: with max_requests_per_client 1, a second request while the lane holds the first
    is the core's 429 (the core adds the lane's count to its own)."""
    twins = Twins(max_requests_per_client=1)
    for op in [
        _ready(WORKERS[0]),
        _ready(WORKERS[1]),
        _request(CLIENTS[0]),
        ("reply", WORKERS[0]),
        _request(CLIENTS[0]),
        _request(CLIENTS[0]),
    ]:
        twins.step(op)
    twins.finish()
    assert twins.lane.taken == 1
    assert twins.a.broker.core.counters["errors_429"] == 1


def test_a_long_random_run_exercises_every_hand_over() -> None:
    """The property above over one long run (seeded): the lane takes, answers and hands
    over requests many times, so the equality checked at every step is not vacuous."""
    rng = random.Random(1414)
    twins = Twins()
    ops = [OPS_LONG[rng.randrange(len(OPS_LONG))](rng) for _ in range(3000)]
    for op in ops:
        twins.step(op)
    twins.finish()
    lane = twins.lane
    assert lane.taken > 150 and lane.queued > 100 and lane.answered > 5 and lane.handed_over > 100


def _s0p(rid: bytes = S0P_CLIENT, pick: str = "new", service: str = "echo") -> Op:
    return ("s0p", rid, pick, service)


def _s0p_ready(rid: bytes, ids: bool = True, service: str = "echo", capacity: int = 1) -> Op:
    return ("s0p_ready", rid, ids, service, capacity)


def test_the_lane_takes_s0p_requests_and_the_core_answers_their_resends_from_its_cache() -> None:
    """An S0P client's REQUEST to an S0P worker is the lane's from the first (the client
    negotiated: its session exists), and so is the REPLY; the lane puts that REPLY in the
    reply cache, where the core finds it when the client asks again (R10): the resend is
    passed, answered from the cache, run nowhere."""
    twins = _play(
        [
            _s0p_ready(S0P_WORKERS[0]),
            _s0p(),
            ("s0p_reply", S0P_WORKERS[0], 200),
            _s0p(pick="again"),
            _s0p(),
            ("s0p_reply", S0P_WORKERS[0], 500),  # a worker's status is cached as it is
            _s0p(pick="again"),
        ]
    )
    lane = twins.lane
    assert (lane.taken, lane.answered, lane.handed_over) == (2, 2, 0)
    assert twins.b.broker.core.counters["cache_hits"] == 2


def test_a_resend_joins_the_lanes_request_in_flight() -> None:
    """R10: the resend of a request the lane runs is passed; the core adopts the lane's
    request by its key and joins it (the answer goes where the client asked from last); the
    worker's REPLY then is the core's to answer (its ticket adopted)."""
    twins = _play(
        [
            _s0p_ready(S0P_WORKERS[0]),
            _s0p(),
            _s0p(pick="again"),
            ("s0p_reply", S0P_WORKERS[0], 200),
            _s0p(pick="again"),  # now from the cache the core put it in
        ]
    )
    lane = twins.lane
    assert (lane.taken, lane.answered, lane.handed_over) == (1, 0, 1)
    counters = twins.b.broker.core.counters
    assert (counters["duplicates_joined"], counters["cache_hits"]) == (1, 1)


def test_a_resend_of_a_waiting_request_keeps_the_order_of_the_queue() -> None:
    """R6 and R10: three requests wait in the lane's queue; a resend of the second adopts the
    whole queue in its order (not the second alone at the back), so the worker gets them in
    the order they came, as a broker without a lane gives them."""
    twins = _play(
        [
            _s0p_ready(S0P_WORKERS[0], ids=False),
            _s0p(),  # dispatched
            _s0p(S0P_CLIENTS[1]),  # waits in the lane
            _s0p(),  # waits in the lane
            _s0p(S0P_CLIENTS[1]),  # waits in the lane
            _s0p(pick="again"),  # the resend of S0P_CLIENT's second (waiting): joins it
            *[("s0p_reply", S0P_WORKERS[0], 200)] * 4,
        ]
    )
    lane = twins.lane
    # (and the one in flight, whose REPLY comes while they wait in the core)
    assert (lane.taken, lane.queued, lane.handed_over) == (4, 3, 4)


def test_a_worker_that_asked_for_ids_is_sent_idrequest_by_the_lane() -> None:
    twins = Twins()
    twins.step(_s0p_ready(S0P_WORKERS[0], ids=True))
    twins.step(_s0p_ready(S0P_WORKERS[1], ids=False))
    twins.step(_s0p())
    twins.step(_s0p())
    kinds = [type(m).__name__ for m in twins.lane.sent]
    assert sorted(kinds) == ["WorkerIdRequest", "WorkerRequest"]
    twins.finish()


def test_an_s0p_worker_and_a_majordomo_client_meet_in_the_core() -> None:
    """Readings must match for the lane: a Majordomo client's request to an S0P worker, and an
    S0P client's to a Majordomo worker, are passed to the core, which serves both."""
    twins = _play(
        [
            _s0p_ready(S0P_WORKERS[0], service="other"),
            _ready(WORKERS[0]),
            _request(CLIENTS[0], service="other"),
            ("s0p_reply", S0P_WORKERS[0], 200),
            _request(CLIENTS[0], service="other"),  # the client has its session: still passed
            ("s0p_reply", S0P_WORKERS[0], 200),
            _s0p(),  # echo: only the Majordomo worker offers it
            ("reply", WORKERS[0]),
        ]
    )
    assert (twins.lane.taken, twins.lane.handed_over) == (0, 0)


def test_a_closed_loop_ends_in_the_lane() -> None:
    """The issue's bench in small, closed loop: two clients keep five requests each
    outstanding against two workers. Their first requests open their sessions in the core
    and wait there; the core's queue drains as the workers answer, the new requests wait in
    the lane behind it, and from then on the lane alone takes, queues, dispatches and answers:
    nothing more is handed over."""
    twins = Twins()
    for op in [_ready(WORKERS[0]), _ready(WORKERS[1])]:
        twins.step(op)
    for i in range(10):
        twins.step(_request(CLIENTS[i % 2], CLIENT_READINGS[i % 2]))
    for i in range(40):
        twins.step(("reply", WORKERS[i % 2]))
        twins.step(_request(CLIENTS[i % 2], CLIENT_READINGS[i % 2]))
    handed, answered = twins.lane.handed_over, twins.lane.answered
    for i in range(200):
        twins.step(("reply", WORKERS[i % 2]))
        twins.step(_request(CLIENTS[i % 2], CLIENT_READINGS[i % 2]))
    assert twins.lane.handed_over == handed
    assert twins.lane.answered == answered + 200
    twins.finish()


def test_a_long_s0p_run_exercises_the_cache_the_joins_and_the_hand_overs() -> None:
    """The property over one long seeded run of mostly S0P clients and workers (resends,
    statuses, READYs that change capacity and ids, sessions lost and negotiated again), so
    the lane's S0P rule, R10 across the lane and the core, and the cache are not vacuous."""
    rng = random.Random(3)
    twins = Twins()
    for worker in S0P_WORKERS:
        twins.step(_s0p_ready(worker))
    for _ in range(3000):
        twins.step(OPS_S0P[rng.randrange(len(OPS_S0P))](rng))
    twins.finish()
    lane, counters = twins.lane, twins.b.broker.core.counters
    assert lane.taken > 100 and lane.s0p_answered > 30 and lane.handed_over > 50
    assert counters["cache_hits"] >= 5 and counters["duplicates_joined"] >= 20


def _steady(r: random.Random) -> Op:
    """A request of a client in the reading it always speaks."""
    index = r.randrange(len(CLIENTS))
    return _request(CLIENTS[index], CLIENT_READINGS[index])


OPS_LONG: list[Callable[[random.Random], Op]] = [
    *[_steady] * 5,
    lambda r: _request(r.choice(CLIENTS), r.choice(CLIENT_READINGS), r.choice(SERVICES)),
    lambda r: _ready(r.choice(WORKERS), r.choice(WORKER_READINGS), r.choice(("echo", "other"))),
    *[lambda r: ("reply", r.choice(WORKERS))] * 6,
    lambda r: ("partial", r.choice(WORKERS)),
    *[lambda r: ("beat", r.choice(WORKERS))] * 3,
    *[lambda r: ("advance", r.choice((0.1, 0.3)))] * 2,
    lambda r: ("status",),
    lambda r: r.choice((("bye", r.choice(WORKERS)), ("s0p_request",), ("advance", 6.0))),
]

#: Mostly S0P: new requests and resends, replies with statuses, READYs, beats, hellos.
OPS_S0P: list[Callable[[random.Random], Op]] = [
    *[
        lambda r: _s0p(
            r.choice(S0P_CLIENTS), r.choice(("new",) * 8 + ("again", "old")), r.choice(SERVICES[:3])
        )
    ]
    * 8,
    lambda r: _s0p_ready(
        r.choice(S0P_WORKERS), r.random() < 0.5, r.choice(("echo", "other")), r.choice((1, 2))
    ),
    *[lambda r: ("s0p_reply", r.choice(S0P_WORKERS), r.choice((200, 200, 500)))] * 8,
    lambda r: ("s0p_partial", r.choice(S0P_WORKERS)),
    *[lambda r: ("s0p_beat", r.choice(S0P_WORKERS))] * 2,
    *[lambda r: ("s0p_client_beat", r.choice(S0P_CLIENTS))] * 2,
    lambda r: ("advance", r.choice((0.1, 0.3))),
    lambda r: ("status",),
    *[lambda r: ("s0p_hello", r.choice(S0P_CLIENTS + S0P_WORKERS))] * 4,
    lambda r: r.choice(
        (
            ("advance", 6.0),
            _steady(r),
            ("reply", r.choice(WORKERS)),
            _s0p_ready(r.choice(S0P_WORKERS)),
            _s0p_ready(r.choice(S0P_WORKERS)),
            ("status",),
        )
    ),
]


# ---- phase 4a: a peer's FORWARDs ----------------------------------------------------------------


def _forward(
    form: str = "ids", pick: str = "new", service: str = "echo", deadline_ms: int = 4000
) -> Op:
    return ("forward", form, pick, service, deadline_ms)


def test_the_lane_serves_a_peers_forwards_and_their_resends_are_the_cores() -> None:
    """b2 forwards us requests, in every form the lane takes: each goes to the ready S0P
    worker and its REPLY back to b2 as FORWARDREPLY, without the core; a FORWARDWITH with
    ids is cached under the client's ids, so the same ids forwarded again are the core's,
    answered from the cache (R10 across brokers, F15), run nowhere."""
    twins = Twins(peer=True)
    for op in [
        _s0p_ready(S0P_WORKERS[0]),
        _forward("plain"),
        ("s0p_reply", S0P_WORKERS[0], 200),
        _forward("with"),
        ("s0p_reply", S0P_WORKERS[0], 500),
        _forward("ids"),
        ("s0p_reply", S0P_WORKERS[0], 200),
        _forward("ids", pick="again"),
    ]:
        twins.step(op)
    twins.finish()
    lane = twins.lane
    assert (lane.forwarded, lane.answered, lane.handed_over) == (3, 3, 0)
    counters = twins.b.broker.core.counters
    assert (counters["forwards_served"], counters["cache_hits"]) == (3, 1)  # (a hit is no run)
    assert [type(m).__name__ for m in lane.sent] == ["WorkerIdRequest"] * 3
    assert [(m.client_id, m.request_id) for m in lane.sent] == [  # type: ignore[attr-defined]
        ("", b""),
        ("", b""),
        ("fc", b"f3"),
    ]


def test_a_forward_the_lane_may_not_take_is_the_cores() -> None:
    """What the lane passes: a FORWARDWITH whose deadline passed on the way (the core's
    504), a FORWARD no local worker offers (F7: the core's 404), the REPLY of a worker whose
    service has a request waiting in the core (a client's, queued there in a family), the
    resend of a FORWARD the lane runs (the core adopts it by its ids and joins it), and a
    reserved service. One no worker is ready for waits in the lane (F6: it is never forwarded
    again), behind what waits in the core."""
    twins = Twins(peer=True)
    for op in [
        _forward("with", deadline_ms=0),
        _forward("ids"),  # no worker offers it: 404
        _s0p_ready(S0P_WORKERS[0]),
        _forward("plain"),  # the lane's, dispatched
        _forward("plain"),  # the lane's, queued: none ready
        ("s0p_reply", S0P_WORKERS[0], 200),  # the lane's: the worker gets the queued one
        _s0p(),  # a client's: waits in the core (a family: the lane queues no client's)
        _forward("plain"),  # the lane's, queued behind it
        ("s0p_reply", S0P_WORKERS[0], 200),  # the core's (adopted): a request waits there
        ("s0p_reply", S0P_WORKERS[0], 200),  # the client's: the core lends the lane's head
        ("s0p_reply", S0P_WORKERS[0], 200),  # the lane's again
        _forward("ids"),  # the lane's
        _forward("ids", pick="again"),  # the core's: joins it
        ("s0p_reply", S0P_WORKERS[0], 200),
        _forward("plain", service="mmi.service"),
    ]:
        twins.step(op)
    twins.finish()
    lane = twins.lane
    assert (lane.forwarded, lane.queued, lane.answered, lane.handed_over) == (4, 2, 2, 2)
    assert lane.lent == 1
    counters = twins.b.broker.core.counters
    assert (counters["errors_404"], counters["duplicates_joined"]) == (2, 1)  # (and mmi.*)


def test_a_silent_peers_forwards_are_the_cores_until_it_is_heard() -> None:
    """F3: b2 silent past liveness is down: the lane is told to take nothing of it, and its
    next FORWARD (which the core hears, and logs it up) is the core's; the one after is the
    lane's again."""
    twins = Twins(peer=True)
    for op in [
        _s0p_ready(S0P_WORKERS[0]),
        ("advance", 2.0),
        ("s0p_beat", S0P_WORKERS[0]),
        ("advance", 2.0),
        ("s0p_beat", S0P_WORKERS[0]),
        _forward("plain"),  # b2 was down: the core's
        ("s0p_reply", S0P_WORKERS[0], 200),
        _forward("plain"),  # up again: the lane's
        ("s0p_reply", S0P_WORKERS[0], 200),
    ]:
        twins.step(op)
    twins.finish()
    lane = twins.lane
    assert (lane.forwarded, lane.answered) == (1, 1)


#: A family of two: b2's FORWARDs in every form beside the local S0P clients and workers.
OPS_FORWARD: list[Callable[[random.Random], Op]] = [
    *OPS_S0P,
    *[
        lambda r: _forward(
            r.choice(("plain", "with", "ids", "ids")),
            r.choice(("new",) * 6 + ("again",)),
            r.choice(("echo", "echo", "other")),
            r.choice((4000, 4000, 1500, 0)),
        )
    ]
    * 8,
    *[lambda r: ("s0p_reply", r.choice(S0P_WORKERS), r.choice((200, 200, 500)))] * 16,
    *[lambda r: ("peer_beat",)] * 3,
    *[lambda r: ("table_req",)] * 2,
]


def test_a_long_run_of_forwards_beside_clients_answers_as_one_without() -> None:
    """The property over a long seeded run in a family of two: b2's FORWARDs (plain, with a
    deadline, with ids, resent) beside local S0P clients, statuses, partials, READYs, silences
    and sessions lost: every peer gets the same messages from both brokers."""
    rng = random.Random(44)
    twins = Twins(peer=True)
    for worker in S0P_WORKERS:
        twins.step(_s0p_ready(worker))
    for _ in range(3000):
        twins.step(OPS_FORWARD[rng.randrange(len(OPS_FORWARD))](rng))
    twins.finish()
    lane, counters = twins.lane, twins.b.broker.core.counters
    assert lane.forwarded > 50 and lane.handed_over > 20 and lane.s0p_answered > 20
    assert counters["cache_hits"] >= 5 and counters["forwards_served"] > lane.forwarded


OPS_PEER = st.one_of(
    OPS,
    st.tuples(
        st.just("forward"),
        st.sampled_from(("plain", "with", "ids")),
        st.sampled_from(("new", "new", "again")),
        st.sampled_from(("echo", "other", "mmi.service")),
        st.sampled_from((4000, 1500, 0)),
    ),
    st.tuples(st.just("peer_beat")),
    st.tuples(st.just("table_req")),
    st.tuples(st.just("table"), st.sampled_from((0, 1, 2))),
    st.tuples(st.just("fwd_reply"), st.sampled_from((200, 500, 503, 404))),
    st.tuples(st.just("link_hello")),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(OPS_PEER, max_size=40))
def test_a_broker_whose_lane_takes_forwards_answers_as_one_without(ops: list[Op]) -> None:
    twins = Twins(peer=True)
    for op in ops:
        twins.step(op)
    twins.finish()


# ---- phase 4b: the lane forwards a client's request to a peer ------------------------------------


def test_the_lane_forwards_a_clients_request_and_answers_the_peers_reply() -> None:
    """No local worker of echo: b2's table offers two slots, so the lane forwards the S0P
    client's requests to b2 (FORWARDWITH with the client's ids and what is left of the
    deadline), two at once, and the third too: b2 has no free slot left, but no worker here
    offers echo, so it goes to the peer offering it with the most free however few, as
    pick_peer(free=False) (F6). The lane answers b2's FORWARDREPLYs to its own (cached: a
    resend is the core's, from the cache); a 503 is the core's (F8: routed again, to b2)."""
    twins = Twins(peer=True)
    for op in [
        ("table", 2),
        _s0p(),  # forwarded by the lane
        _s0p(S0P_CLIENTS[1]),  # forwarded by the lane (b2's second slot)
        _s0p(),  # none free, but no local worker: to b2 anyway (F6), by the lane
        ("fwd_reply", 200),  # the lane's
        ("fwd_reply", 200),
        ("fwd_reply", 200),
        _s0p(pick="again"),  # the core's: from the cache
        _s0p(),  # the lane's
        ("fwd_reply", 503),  # the core's (F8)
        ("fwd_reply", 200),
    ]:
        twins.step(op)
    twins.finish()
    lane = twins.lane
    assert (lane.sent_out, lane.peer_answered, lane.handed_over) == (4, 3, 1)
    counters = twins.b.broker.core.counters
    assert (counters["forwarded"], counters["retries"], counters["cache_hits"]) == (5, 1, 1)


#: A family of two with b2's table: clients' requests the lane forwards, b2's answers, tables.
OPS_FORWARD_OUT: list[Callable[[random.Random], Op]] = [
    *OPS_FORWARD,
    *[lambda r: ("fwd_reply", r.choice((200, 200, 200, 500, 503, 404)))] * 12,
    *[lambda r: ("table", r.choice((0, 1, 2, 3)))] * 3,
    *[lambda r: ("link_hello",)] * 2,
    *[lambda r: _s0p(r.choice(S0P_CLIENTS), r.choice(("new",) * 6 + ("again",)))] * 6,
]


def test_a_long_run_of_forwarding_both_ways_answers_as_one_without() -> None:
    """The property over a long seeded run in a family of two: the lane forwards clients'
    requests to b2 (its tables move the free counts), answers or hands over b2's replies,
    and serves b2's FORWARDs, beside local workers that come and go."""
    rng = random.Random(45)
    twins = Twins(peer=True)
    twins.step(("table", 2))
    for _ in range(3000):
        twins.step(OPS_FORWARD_OUT[rng.randrange(len(OPS_FORWARD_OUT))](rng))
    twins.finish()
    lane = twins.lane
    assert lane.sent_out > 15 and lane.peer_answered > 3 and lane.forwarded > 30
