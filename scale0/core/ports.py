"""What each room of the broker core asks of the others: one Protocol per room.

The rooms (sessions, dispatch, guard, family, forwarding, replication, lifecycle, views,
admin) never import each other: each names its collaborators by these Protocols, and
scale0/core/broker.py, the façade, builds the rooms and wires them together. So no import
circle can form between them (an import-linter contract in setup.cfg holds them to it), and a
room's dependence on another is written down here, member by member.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from scale0.config.model import NetworkConfig
from scale0.core.connections import Session
from scale0.core.effects import Channel, Effect, Malformed
from scale0.core.peers import Peer
from scale0.core.replica import Plan, Replica
from scale0.core.requests import Pending, RequestKey
from scale0.core.states import BrokerInput, Change
from scale0.core.timers import RequestDue
from scale0.core.workers import Worker
from scale0.wire.client import CheckConfig, ClientReply, Config, ConfigAck, DisconnectError
from scale0.wire.mdp import MdpClientReply, MdpWorkerRequest
from scale0.wire.peer import Forward, ForwardPartial, ForwardReply
from scale0.wire.worker import Ready, WorkerPartial

__all__ = [
    "DispatchPort",
    "FamilyPort",
    "ForwardingPort",
    "GuardPort",
    "LanePort",
    "LedgerPort",
    "LifecyclePort",
    "MajordomoPort",
    "MirrorPort",
    "ReplicationPort",
    "SessionsPort",
]


class LedgerPort(Protocol):
    """scale0/core/ledger.py: the hot path's state (requests, tickets in flight, the reply
    cache, the worker pool, what waits), by operations only; the meaning of each is in that
    module's docstring. A C implementation shared with the lane thread serves the same."""

    # requests
    def open(self, pending: Pending) -> None: ...

    def held(self, client: bytes) -> int: ...

    def held_by_client(self) -> dict[bytes, int]: ...

    def joinable(self, key: RequestKey) -> Pending | None: ...

    def open_at(self, seq: RequestDue) -> Pending | None: ...

    def is_open(self, seq: RequestDue) -> bool: ...

    def retire(self, pending: Pending) -> None: ...

    def client_busy(self, routing_id: bytes) -> bool: ...

    def open_by_connection(self) -> dict[bytes, int]: ...

    def held_from(self, broker_id: str) -> dict[str, int]: ...

    def adopt_peer(self, broker_id: str) -> None: ...

    def lane_forwarded_to(self, broker_id: str) -> dict[str, int]: ...

    def cached(self, key: RequestKey, now: float) -> ClientReply | None: ...

    def cache(self, key: RequestKey, reply: ClientReply, now: float) -> None: ...

    def cached_count(self) -> int: ...

    def prune_cache(self, now: float) -> None: ...

    # in flight
    def dispatched(self, worker: Worker, ticket: bytes, pending: Pending) -> None: ...

    def forwarded(self, ticket: bytes, pending: Pending, peer: str) -> None: ...

    def unassign(self, pending: Pending) -> None: ...

    def reschedule(self, pending: Pending, deadline: float) -> None: ...

    def redirect(self, pending: Pending, routing_id: bytes) -> None: ...

    def running(self, ticket: bytes) -> Pending | None: ...

    def answer(self, ticket: bytes, routing_id: bytes) -> Pending | None: ...

    def settle(self, ticket: bytes) -> Pending | None: ...

    def release(self, worker: Worker, ticket: bytes) -> bool: ...

    def in_flight_count(self) -> int: ...

    # workers
    def enroll(self, worker: Worker) -> Worker | None: ...

    def dismiss(self, routing_id: bytes) -> Worker | None: ...

    def worker(self, routing_id: bytes) -> Worker | None: ...

    def workers(self) -> list[Worker]: ...

    def worker_count(self) -> int: ...

    def offers(self, service: str) -> bool: ...

    def offered(self) -> list[str]: ...

    def workers_of(self, service: str) -> int: ...

    def ready_count(self, service: str) -> int: ...

    def tickets_of(self, worker: Worker) -> list[bytes]: ...

    def used(self, worker: Worker) -> int: ...

    def spare(self, worker: Worker) -> int: ...

    def take_worker(self, service: str) -> Worker | None: ...

    def list_ready(self, worker: Worker) -> None: ...

    # waiting
    def wait(self, pending: Pending, front: bool = False) -> None: ...

    def next_waiting(self, service: str, lend: bool = False) -> Pending | None: ...

    def put_back(self, service: str, kept: list[Pending]) -> None: ...

    def stop_waiting(self, pending: Pending) -> None: ...

    def take_out(self, pending: Pending) -> bool: ...

    def forwarded_waiting(self, service: str) -> Iterator[Pending]: ...

    def waiting_count(self, service: str) -> int: ...

    def waiting_total(self) -> int: ...

    def waiting_services(self) -> set[str]: ...

    def queued_services(self) -> list[str]: ...


class SessionsPort(Protocol):
    """scale0/core/sessions.py: the client and worker sessions."""

    clients: dict[bytes, Session]
    workers: dict[bytes, Session]

    def session(
        self, channel: Channel, routing_id: bytes, now: float, out: list[Effect]
    ) -> Session | None: ...

    def seen(self, channel: Channel, routing_id: bytes, now: float) -> None: ...

    def adopt(self, channel: Channel, routing_id: bytes, now: float) -> Session: ...

    def remirror(self, channel: Channel, routing_id: bytes) -> None: ...

    def full(self, channel: Channel, routing_id: bytes) -> bool: ...

    def set_timeout(self, session: Session, timeout_s: float) -> None: ...

    def unpromise(self, session: Session) -> None: ...

    def skewed(
        self,
        channel: Channel,
        routing_id: bytes,
        sent: float,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> bool: ...

    def forget(
        self, channel: Channel, routing_id: bytes, now: float, out: list[Effect], reason: str
    ) -> None: ...

    def renegotiate_all(self, why: str, out: list[Effect]) -> None: ...

    def refuse(self, channel: Channel, routing_id: bytes, why: str, out: list[Effect]) -> None: ...


class MirrorPort(Protocol):
    """The C lane's copy of the sessions (scale0/net/lane.py): what its take rule for plain
    HEARTBEATs reads of each (docs/architecture.md, "The lane"). Told by Sessions whenever it
    changes; never asked anything back (the lane's news comes as ``heard_elsewhere``)."""

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
    ) -> None: ...

    def forget(self, channel: Channel, routing_id: bytes) -> None: ...


#: A request of the lane's, handed to the ledger (LanePort's ``adopt*``): ticket, worker's
#: routing id (both b"" while it waits in the lane's queue), client's routing id, client_id,
#: caller (its CURVE key), service, body, started, deadline, request_id, its number
#: (``next_seq``'s, shared with the core: its deadline's timer key), and ids: True for an S0P
#: client's request (request_id is the client's own: R10's key, an IDREQUEST's ids), False for
#: a Majordomo one (request_id is the lane's, D1); then, for a request a peer forwarded us that
#: the lane took (phase 4a), origin (the peer's FORWARD ticket), via (that peer's broker id) and
#: limit (the origin's deadline as FORWARDWITH said, monotonic); b"", "" and inf for a client's.
#: A forwarded one's client is the peer link's routing id on our peer ROUTER, and its client_id
#: the client's own with ids, else b"\x00" + the peer's broker id (its request_id then b"").
#: Last, peer (phase 4b): the broker id a client's request was forwarded to by the lane (it is
#: in flight there: ticket set, worker b""), "" otherwise.
LaneRecord = tuple[
    bytes,
    bytes,
    bytes,
    bytes,
    str,
    str,
    tuple[bytes, ...],
    float,
    float,
    bytes,
    int,
    bool,
    bytes,
    str,
    float,
    str,
]

#: One of the lane's cached replies as it hands them back: (client_id, request_id, service,
#: status, body, expires).
LaneCached = tuple[bytes, bytes, str, int, tuple[bytes, ...], float]


class LanePort(Protocol):
    """The lane's requests, as the ledger reaches them (scale0/net/lane.py; docs/architecture.md
    "Phase 3b"): the C lane dispatches a client's REQUEST (S0P or Majordomo) to a ready worker
    of the C pool that speaks the same protocol and returns its final REPLY without the core,
    while the ledger tells it where it may not (a service a request waits for here, R6; a
    client with a request held here, R20; a key the core holds a request under, R10:
    ``python_key``); whatever the core must decide about one of its requests (a PARTIAL, a lost
    worker, a deadline, a resend, a table) first hands that request to the ledger
    (``adopt*``), which then owns it as one of its own. While a lane is attached the reply
    cache is the lane's (``cache_*``: the lane puts its own S0P answers in it). Called only
    while the loop holds the lane's lock."""

    def adopt(self, ticket: bytes) -> LaneRecord | None: ...

    def adopt_worker(self, routing_id: bytes) -> list[LaneRecord]: ...

    def adopt_all(self) -> list[LaneRecord]: ...

    def adopt_due(self, now: float) -> list[LaneRecord]: ...

    def next_due(self) -> float | None: ...

    def held(self, client_id: bytes) -> int: ...

    def busy(self, routing_id: bytes) -> bool: ...

    def in_flight(self) -> int: ...

    def open_by_connection(self) -> dict[bytes, int]: ...

    def held_by_client(self) -> dict[bytes, int]: ...

    def held_from(self, via: str) -> dict[str, int]: ...

    def forwarded_to(self, broker_id: bytes) -> dict[str, int]: ...

    def adopt_peer(self, broker_id: bytes) -> list[LaneRecord]: ...

    def adopt_next_waiting(self, service: str) -> LaneRecord | None: ...

    def waiting_head(self, service: str) -> LaneRecord | None: ...

    def dispatch_head(self, service: str, ticket: bytes, worker: bytes) -> None: ...

    def adopt_waiting(self, service: str) -> list[LaneRecord]: ...

    def waiting(self, service: str) -> int: ...

    def waiting_total(self) -> int: ...

    def next_seq(self) -> int: ...

    def seq_from(self, number: int) -> None: ...

    def python_waits(self, service: str, count: int) -> None: ...

    def python_holds(self, client_id: bytes, count: int) -> None: ...

    def python_key(self, client_id: bytes, request_id: bytes, live: bool) -> None: ...

    def adopt_key(self, client_id: bytes, request_id: bytes) -> LaneRecord | None: ...

    def cache_limits(self, max_entries: int, max_bytes: int, max_age_s: float) -> None: ...

    def cache_put(
        self,
        client_id: bytes,
        request_id: bytes,
        service: str,
        status: int,
        body: tuple[bytes, ...],
        expires: float,
    ) -> None: ...

    def cache_get(
        self, client_id: bytes, request_id: bytes, now: float
    ) -> tuple[str, int, tuple[bytes, ...]] | None: ...

    def cache_prune(self, now: float) -> None: ...

    def cache_count(self) -> int: ...

    def cache_take(self) -> list[LaneCached]: ...


class PeerLanePort(Protocol):
    """What the family tells the C lane of its peers, and hears back (phase 4b,
    docs/architecture.md): the lane forwards a client's request no local worker is ready for
    to the usable peer with the most free slots, as ``Forwarding.pick_peer`` would, and answers
    its FORWARDREPLY; it moves those free counts by one per forward and per answer
    (``peer_deltas``), and the family tells it the counts it holds whenever they differ. Called
    only while the loop holds the lane's lock."""

    def peer(
        self, broker_id: bytes, usable: bool, forward_with: bool, free: dict[str, int]
    ) -> None: ...

    def forget_peer(self, broker_id: bytes) -> None: ...

    def peer_deltas(self) -> list[tuple[bytes, str, int]]: ...


class DispatchPort(Protocol):
    """scale0/core/dispatch.py: requests waiting and in flight, and the worker pool."""

    def worker_lost(
        self, routing_id: bytes, now: float, out: list[Effect], reason: str, silent_s: float = 0.0
    ) -> None: ...

    def promised(
        self, worker: Worker, promise_s: float, now: float, wall: float, out: list[Effect]
    ) -> None: ...

    def route_again(
        self, pending: Pending, now: float, out: list[Effect], status: int, why: str
    ) -> None: ...

    def take(self, pending: Pending, now: float, out: list[Effect]) -> None: ...

    def finish(
        self, pending: Pending, reply: ClientReply, out: list[Effect], now: float
    ) -> None: ...

    def fail(self, pending: Pending, status: int, message: str, out: list[Effect]) -> None: ...

    def let_go(self, pending: Pending, why: str, out: list[Effect]) -> None: ...

    def relay_partial(
        self, pending: Pending, body: tuple[bytes, ...], out: list[Effect]
    ) -> None: ...

    def services_left(self, services: Iterable[str], now: float) -> None: ...

    def client_busy(self, routing_id: bytes) -> bool: ...

    def client_request(
        self,
        routing_id: bytes,
        service: str,
        request_id: bytes,
        body: tuple[bytes, ...],
        now: float,
        out: list[Effect],
    ) -> None: ...

    def ready(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: Ready,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None: ...

    def worker_reply(
        self,
        routing_id: bytes,
        ticket: bytes,
        status: int,
        body: tuple[bytes, ...],
        now: float,
        out: list[Effect],
    ) -> None: ...

    def worker_partial(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: WorkerPartial,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None: ...


class GuardPort(Protocol):
    """scale0/core/guard.py: error scores and bans, and the connections (R20)."""

    banned: dict[bytes, float]

    @property
    def conns(self) -> Mapping[tuple[Channel, int], object]: ...

    @property
    def unnegotiated(self) -> Mapping[tuple[Channel, int], None]: ...

    @property
    def unnegotiated_peers(self) -> Mapping[tuple[Channel, int], None]: ...

    def count_error(
        self, channel: Channel, sender: bytes, reply_to: bytes, now: float, out: list[Effect]
    ) -> bool: ...

    def malformed(self, event: Malformed, now: float, out: list[Effect]) -> None: ...


class FamilyPort(Protocol):
    """scale0/core/family.py: the other members, their links and tables."""

    peers: dict[str, Peer]
    seeds: dict[str, str]
    seed_linked: set[str]
    seed_names: dict[str, str]

    def not_accepting(self, protocol: bytes, channel: Channel) -> DisconnectError: ...

    def table_changed(self, services: Sequence[str], now: float) -> None: ...

    def plan_links(self, network: NetworkConfig, plan: Plan, out: list[Effect]) -> None: ...

    def joined(self, out: list[Effect]) -> None: ...

    def say_hello(self, now: float, wall: float, out: list[Effect]) -> None: ...


class ForwardingPort(Protocol):
    """scale0/core/forwarding.py: requests sent to peers and taken from them."""

    def pick_peer(self, service: str, *, free: bool) -> Peer | None: ...

    def forward_to(self, peer: Peer, pending: Pending, out: list[Effect]) -> None: ...

    def drain_to_peers(self, now: float, out: list[Effect]) -> None: ...

    def send_back(self, pending: Pending, out: list[Effect]) -> bool: ...

    def orphaned(self, services: Sequence[str], now: float, out: list[Effect]) -> None: ...

    def forward_in(
        self, peer: Peer, routing_id: bytes, msg: Forward, now: float, out: list[Effect]
    ) -> None: ...

    def reply_in(self, peer: Peer, msg: ForwardReply, now: float, out: list[Effect]) -> None: ...

    def partial_in(
        self, peer: Peer, msg: ForwardPartial, now: float, out: list[Effect]
    ) -> None: ...


class LifecyclePort(Protocol):
    """scale0/core/lifecycle.py: the broker's state, and moving work away."""

    def change(self, change: BrokerInput, now: float, by: str, out: list[Effect]) -> Change: ...

    def move_worker(self, routing_id: bytes, now: float, out: list[Effect]) -> None: ...

    def answered(self, pending: Pending, out: list[Effect]) -> None: ...


class MajordomoPort(Protocol):
    """scale0/core/majordomo.py: who speaks Majordomo, and the two answers of every request in
    Majordomo form, built where they are made (the rest is rewritten at the end of the event)."""

    @property
    def speaks(self) -> Mapping[tuple[Channel, bytes], tuple[bytes, bool, bool]]: ...

    def worker_request(
        self, routing_id: bytes, ticket: bytes, body: tuple[bytes, ...]
    ) -> MdpWorkerRequest | None: ...

    def client_reply(self, routing_id: bytes, reply: ClientReply) -> MdpClientReply | None: ...


class ReplicationPort(Protocol):
    """scale0/core/replication.py: the config replica and what peers say of configs."""

    replica: Replica

    def check_config_message(self) -> CheckConfig: ...

    def newer_config(self, peer: Peer, version: int, out: list[Effect]) -> None: ...

    def config_answer(
        self, origin: str, msg: Config | ConfigAck, out: list[Effect], now: float, wall: float
    ) -> None: ...

    def peer_check_config(
        self, peer: Peer, routing_id: bytes, msg: CheckConfig, out: list[Effect]
    ) -> None: ...
