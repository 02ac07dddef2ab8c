"""The broker state machine: negotiation, LRU routing by service, deadlines, retries, liveness.

Pure: ``Broker.handle(event, now, wall)`` returns effects; ``now`` is a monotonic clock for
timers and deadlines, ``wall`` is UNIX time for clock-skew checks. No sockets, no clock reads, no
randomness (the per-boot ``boot_id`` that prefixes tickets is passed in).

Rules (docs/protocol.md; tests/core/test_broker.py names a test after each):
 R1  A client or worker must CHECKCONFIG first; any other command from a sender with no
     negotiation on record gets FORCENEGOTIATE (and is not acted on).
 R2  CHECKCONFIG naming our config_version gets CONFIGACK, anything else gets CONFIG: the
     client view of the network config in the asked config_type, with sha256 and signature.
 R3  A broker that is not active answers CHECKCONFIG and REQUEST with DISCONNECTERROR 503; a
     disabled or draining one answers 301 naming an active peer's frontend (clients) or
     backend (workers) when it knows one, so one seed is enough (docs/operations.md).
 R4  READY puts the worker in the LRU queue of each of its services; a new READY replaces them.
 R5  A REQUEST goes to the least recently used ready worker of its service; a worker of
     capacity N takes up to N requests at once.
 R6  With no ready worker a request waits (at most max_queued_requests per service, else 503 at
     once) until a worker is ready, or until its deadline: 503.
 R7  A request for a service no worker offers gets 404 at once, unless the service had a
     worker here or in a peer's table within the last request_timeout_ms (the failover grace:
     a worker that moved registers again), the broker started less than that ago, or the
     config lists it in `services`; such a request waits (R6) until its deadline.
     mmi.service is answered from live state, other mmi.* get 501 and scale0.* 404.
 R8  A worker silent for liveness x its interval, or that says DISCONNECT, is lost: each of its
     requests is dispatched again (at most max_retries times), else answered 504.
 R9  A request in flight past its deadline is answered 504 and not retried (the worker may
     still be running it); a PARTIAL from the worker moves the deadline on.
 R10 A request_id the client already used gets the cached reply, or joins the request still
     in flight: it is never executed a second time.
 R11 A READY asking for an interval shorter than default_heartbeat_interval_ms gets the default;
     every broker HEARTBEAT to a worker carries the interval it enforces.
 R12 READY or HEARTBEAT whose time is more than max_clock_skew_s from ours gets
     DISCONNECTERROR 412 and the sender is forgotten.
 R13 A malformed message gets DISCONNECTERROR 400/501 and ends the sender's session; over
     error_threshold of them within error_window_s ban the sender for error_ban_s: one
     DISCONNECTERROR 429, then its messages are dropped unread.
 R14 A REPLY or PARTIAL with an unknown ticket, or from another worker than the ticket's, is
     dropped silently.
 R15 READY for a reserved service name, or one this broker does not route, gets
     DISCONNECTERROR 400, registers nothing and ends the session; an empty READY takes no work.
 R16 A HEARTBEAT naming an older config_version gets FORCENEGOTIATE.
 R17 Shutdown tells every client and worker DISCONNECT, and every peer link.
 R18 Disable (and Drain) move service away: each idle worker is told 301 to an active peer
     (503 if none) and forgotten, a busy one as soon as its last request is answered; requests
     waiting here go to a peer that offers the service, else their client is told to move
     (301/503) and resends there; forwarded ones get FORWARDREPLY 503 (F8 routes them again).
 R19 Drain (SIGTERM) is a disable that also tells each client DISCONNECT once it has nothing
     in flight here, and says Drained once no request is in flight at all.

The family (docs/protocol.md §5-6; tests/core/test_family.py names a test after each):
 F1  Start connects a link to every other member of the family (to each seed while joining)
     and says HELLO on it; a link whose HELLO is not answered says HELLO again every interval.
 F2  A HELLO on the peer ROUTER from a member of our family is answered with our HELLO; another
     family or a non-member gets DISCONNECTERROR 401; a broker_id whose link spoke within the
     last interval from another routing id gets 409 (an older one is taken over: the peer
     restarted). Anything else from a routing id that has not said HELLO is ignored.
 F3  Any message from a peer is a heartbeat; a peer silent for liveness x interval is down: its
     table is dropped and the requests forwarded to it are routed again or answered 504. Its
     link's routing id is kept: when it speaks again on the same link it is up again.
 F4  A peer HELLO or HEARTBEAT naming a newer config_version makes us CHECKCONFIG it at once;
     a HEARTBEAT whose time is off by more than max_clock_skew_s gets DISCONNECTERROR 412.
 F5  Tables: we pull (TABLEREQ since our copy) when a link comes up and whenever a HEARTBEAT's
     table_seq is ahead of our copy; a peer that asked for push gets a full TABLE after its HELLO
     and a delta at each commit; a TABLEREQ gets the delta since since_seq, else a full TABLE.
 F6  A request with no ready local worker goes to the usable peer with the most free slots for
     its service; else it waits here if a local worker offers the service; else it goes to a
     usable peer that offers it at all. A forwarded request is never forwarded again.
 F7  A FORWARD is dispatched like a local request under our own deadline; with no local worker
     offering the service it gets FORWARDREPLY 404 at once, 503 if we are not active; its
     PARTIALs and REPLY go back as FORWARDPARTIAL and FORWARDREPLY.
 F8  A FORWARDREPLY 404 or 503 routes the request again (within max_retries; the peer's slots
     for it count as none until its next table), else the client gets that status.
 F9  Requests waiting for a service are forwarded as soon as a peer's table shows free slots,
     or as soon as the last local worker of the service is lost; then requests forwarded to
     us that wait for it get FORWARDREPLY 404 at once (their origin routes them again).
 F10 A config offered (config SUB, a peer's CONFIG, the disk, the file, an admin) is judged by
     the replica (scale0/core/replica.py, K1-K5). An applied config is persisted, published by a
     config source, its plan performed (links, subscriptions), every client and worker is told
     FORCENEGOTIATE, and a joining broker becomes active. A refusal is logged, nothing changes.
 F11 CHECKCONFIG from a peer gets CONFIGACK or CONFIG with the whole config and its signature;
     503 while we are not active. A config source republishes every config_republish_s.
 F12 DISCONNECT from a peer marks it down at once.
 F13 A disabled broker keeps saying HELLO and HEARTBEAT (state disabled) and forwards nothing.

Management (MANAGEMENTREQ and the HTTP server) has its own rules, M1-M6, in
scale0/core/admin.py; the broker answers its queries (``status``, ``client_table``, ...) and
changes state through ``set_state`` (disable/enable, §6.4).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.config.canonical import canonical_json, config_sha256, tree_sha256
from scale0.config.formats import Format, render
from scale0.config.model import NetworkConfig
from scale0.config.schema import to_tree
from scale0.core.admin import Management, Outcome
from scale0.core.effects import (
    Channel,
    Close,
    ConfigOffered,
    ConfigRead,
    Connect,
    Drain,
    Drained,
    Effect,
    Event,
    FanOutDone,
    Log,
    Malformed,
    ManagementCall,
    ManagementSubmit,
    Persist,
    Publish,
    Received,
    Send,
    Shutdown,
    Start,
    Subscribe,
    Tick,
)
from scale0.core.metrics import LATENCY_BUCKETS_S, Histogram, Metrics
from scale0.core.peers import LocalTable, Peer
from scale0.core.records import heartbeat_gap, refused, request_done
from scale0.core.replica import (
    Applied,
    Conflict,
    Offer,
    Plan,
    Refused,
    Replica,
    SignedConfig,
    plan_change,
)
from scale0.core.replica import Outcome as ConfigOutcome
from scale0.core.requests import Pending, ReplyCache, RequestKey
from scale0.core.timers import TimerHeap
from scale0.core.workers import Worker, WorkerPool
from scale0.wire.admin import ManagementRequest
from scale0.wire.client import (
    CheckConfig,
    ClientPartial,
    ClientReply,
    ClientRequest,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.configsync import PublishedConfig
from scale0.wire.frames import (
    SIG_BROKER,
    SIG_CLIENT,
    SIG_WORKER,
    ConfigType,
    JsonValue,
    Message,
    is_reserved_service,
)
from scale0.wire.peer import (
    BrokerState,
    Forward,
    ForwardPartial,
    ForwardReply,
    Hello,
    PeerHeartbeat,
    Table,
    TableMode,
    TableReq,
    TableWorker,
)
from scale0.wire.worker import Ready, WorkerPartial, WorkerReply, WorkerRequest

State = Literal["joining", "active", "disabled"]

REPLY_CACHE_ENTRIES = 10_000
REPLY_CACHE_BYTES = 64 << 20
REPLY_CACHE_AGE_S = 60.0
SWEEP_INTERVAL_S = 1.0
#: Worker changes are gathered this long into one table version before peers hear of them.
TABLE_COMMIT_S = 0.05

_PROTOCOL = {Channel.FRONTEND: SIG_CLIENT, Channel.BACKEND: SIG_WORKER}
_FORMATS: dict[ConfigType, Format] = {
    ConfigType.JSON: "json",
    ConfigType.XML: "xml",
    ConfigType.ZFL: "zfl",
}


@dataclass(slots=True, eq=False)
class Session:
    """A negotiated client or worker connection (R1)."""

    routing_id: bytes
    channel: Channel
    client_id: str
    config_version: int
    last_seen: float
    timeout_s: float  # silent this long = gone (liveness x interval)
    gen: int  # tells a live timer entry from one left by an earlier session


# Timer keys: ("session", channel, routing_id, gen), ("beat", routing_id, gen),
# ("request", seq), ("sweep",), ("peers",), ("table",), ("republish",).
TimerKey = tuple[object, ...]


class Broker:
    """One broker's decisions. Feed it events; perform the effects it returns, in order."""

    def __init__(
        self,
        identity: str,
        network: NetworkConfig | None,
        *,
        state: State,
        boot_id: bytes,
        signature: str | None,
        now: float,
        trusted_keys: Sequence[Ed25519PublicKey] = (),
        family: str | None = None,
        seeds: Sequence[str] = (),
        config_subs: Sequence[str] = (),
        config_source: bool = False,
        own_ports: Mapping[str, int] | None = None,
    ) -> None:
        """``network`` None: no config yet, the broker is joining (F1, F10) whatever ``state``
        says; it becomes ``state`` (active unless disabled) once a config is applied.
        ``own_ports`` (channel name -> port from the broker file, 0 unknown) are compared with
        this broker's entry in every config applied (own_endpoint_mismatch)."""
        self.identity = identity
        self._own_ports = dict(own_ports or {})
        self._wanted: State = "disabled" if state == "disabled" else "active"
        self.state: State = state if network is not None else "joining"
        self._boot_id = boot_id
        self._ticket_seq = 0
        self._seq = 0
        self._gen = 0
        self._started = now
        self._timers: TimerHeap[TimerKey] = TimerHeap()
        self._sessions: dict[Channel, dict[bytes, Session]] = {
            Channel.FRONTEND: {},
            Channel.BACKEND: {},
        }
        self._client_ids: dict[tuple[Channel, str], bytes] = {}
        self._pool = WorkerPool()
        self._queues: dict[str, deque[Pending]] = {}
        self._queued: dict[str, int] = {}
        self._requests: dict[int, Pending] = {}
        self._inflight: dict[bytes, Pending] = {}
        self._live: dict[RequestKey, Pending] = {}
        self._service_left: dict[str, float] = {}
        self._errors: dict[bytes, deque[float]] = {}
        self._banned: dict[bytes, float] = {}
        self._cache = ReplyCache(
            max_entries=REPLY_CACHE_ENTRIES,
            max_bytes=REPLY_CACHE_BYTES,
            max_age_s=REPLY_CACHE_AGE_S,
        )
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "requests",
                "replies",
                "errors_404",
                "errors_503",
                "errors_504",
                "retries",
                "cache_hits",
                "duplicates_joined",
                "malformed",
                "banned",
                "dropped",
                "workers_lost",
                "forwarded",
                "forwards_served",
                "peers_lost",
                "peer_ignored",
                "configs_applied",
                "configs_refused",
                "config_conflicts",
                "config_malformed",
            ),
            0,
        )
        # The family (F1-F13): peers by broker_id, our peer ROUTER's routing ids -> broker_id,
        # the seeds a joining broker asks, our own heartbeat table, the config replica.
        self.config_source = config_source
        self._seeds = {f"seed:{i}": endpoint for i, endpoint in enumerate(seeds)}
        self._seed_linked: set[str] = set()
        self._seed_names: dict[str, str] = {}  # seed link -> the broker_id its HELLO gave
        self._config_subs = tuple(config_subs)
        self._subscribed: tuple[str, ...] | None = None
        self._peers: dict[str, Peer] = {}
        self._peer_rids: dict[bytes, str] = {}
        self._table = LocalTable()
        self._table_armed = False
        current = None
        if network is not None:
            current = SignedConfig(
                network, config_sha256(network), signature or "", origin=identity
            )
        self.replica = Replica(identity, trusted_keys, family=family, current=current)
        if network is None:
            network = NetworkConfig(family=family or "unknown", config_version=0, brokers=())
        self._apply_network(network, signature)
        self._timers.push(now + SWEEP_INTERVAL_S, ("sweep",))
        self._clock = now  # the ``now`` of the event being handled (for latency metrics)
        self._started_wall: float | None = None
        self.metrics = Metrics()
        self.management = Management(self)
        #: The net layer's own counters (received, sent, dropped...), shared for ``status``.
        self.io_counters: dict[str, int] = {}
        #: The node's event log counters while it writes one (docs/trend.md): RequestDone on.
        self.event_log: Mapping[str, int] | None = None
        #: Drain (SIGTERM) ran: the broker is disabled and stops once nothing is in flight.
        self.draining = False
        self._drained_said = False

    # ---- configuration ---------------------------------------------------------------------

    def _apply_network(self, network: NetworkConfig, signature: str | None) -> None:
        self.network = network
        self.signature = signature
        self.sha256 = config_sha256(network)
        self.max_frame_bytes = network.max_frame_bytes
        self._interval_s = network.default_heartbeat_interval_ms / 1000
        self._timeout_s = network.request_timeout_ms / 1000
        entry = next((b for b in network.brokers if b.identity == self.identity), None)
        self._routes: frozenset[str] | None = None
        for allowed in (network.services, entry.services if entry else "all"):
            if allowed != "all":
                names = frozenset(allowed)
                self._routes = names if self._routes is None else self._routes & names
        self._documents: dict[ConfigType, bytes] = {}
        self._whole: dict[ConfigType, bytes] = {}
        self._view_sha256: str | None = None

    def client_view(self, config_type: ConfigType) -> bytes:
        """The part of the network config clients and workers see, serialized (cached)."""
        document = self._documents.get(config_type)
        if document is None:
            typed = config_type is ConfigType.JSON
            tree = to_tree(self.network, typed=typed)
            view = {key: tree[key] for key in self.network.client_view if key in tree}
            document = render(view, _FORMATS[config_type], kind="network")
            self._documents[config_type] = document
        return document

    @property
    def client_view_sha256(self) -> str:
        """sha256 of the client view's canonical JSON, whatever format carries it (§3.2)."""
        if self._view_sha256 is None:
            tree = to_tree(self.network, typed=True)
            self._view_sha256 = tree_sha256(
                {key: tree[key] for key in self.network.client_view if key in tree}
            )
        return self._view_sha256

    # ---- queries for the I/O layer ---------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When :meth:`handle` next wants a ``Tick``.

        A request that got its answer leaves its deadline entry in the heap (lazy deletion):
        such entries are dropped here when they reach the head, so under steady load the
        broker's timer waits for the next live deadline instead of firing for each answered
        request, and the heap holds about one entry per request still running.
        """
        timers = self._timers
        requests = self._requests
        while True:
            key = timers.head()
            if key is None or key[0] != "request" or key[1] in requests:
                return timers.next_due()
            timers.drop_head()

    def is_banned(self, routing_id: bytes, now: float) -> bool:
        until = self._banned.get(routing_id)
        if until is None:
            return False
        if now < until:
            return True
        del self._banned[routing_id]
        return False

    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            "clients": len(self._sessions[Channel.FRONTEND]),
            "workers": len(self._pool.workers),
            "in_flight": len(self._inflight),
            "queued": sum(self._queued.values()),
            "reply_cache": len(self._cache),
            "banned_senders": len(self._banned),
            "timers": len(self._timers),
        }

    def services(self) -> dict[str, dict[str, int]]:
        """Per service: workers offering it, ready workers, requests waiting."""
        names = set(self._pool.services()) | {s for s, n in self._queued.items() if n}
        return {
            s: {
                "workers": sum(1 for w in self._pool.workers.values() if s in w.services),
                "ready": self._pool.ready_count(s),
                "queued": self._queued.get(s, 0),
            }
            for s in sorted(names)
        }

    # ---- management: queries and state (rules M1-M6 in scale0/core/admin.py) ---------------

    def service_table(self) -> list[JsonValue]:
        """Per service: workers, ready and busy workers, queue depth, answers and latency."""
        names = set(self._pool.services()) | {s for s, n in self._queued.items() if n}
        names |= set(self.metrics.services)
        rows: list[JsonValue] = []
        for name in sorted(names):
            offering = [w for w in self._pool.workers.values() if name in w.services]
            stats = self.metrics.services.get(name)
            latency = stats.latency if stats is not None else None
            rows.append(
                {
                    "service": name,
                    "workers": len(offering),
                    "ready": self._pool.ready_count(name),
                    "busy": sum(1 for w in offering if w.in_flight),
                    "queued": self._queued.get(name, 0),
                    "replies": {str(k): v for k, v in sorted(stats.replies.items())}
                    if stats is not None
                    else {},
                    "latency_count": latency.count if latency is not None else 0,
                    "latency_sum_s": latency.sum_s if latency is not None else 0.0,
                    "latency_p50_s": latency.quantile(0.5) if latency is not None else None,
                    "latency_p95_s": latency.quantile(0.95) if latency is not None else None,
                    # cumulative counts per bound of status' latency_buckets_s, +Inf last
                    "latency_buckets": list(
                        latency.cumulative() if latency is not None else Histogram().cumulative()
                    ),
                }
            )
        return rows

    def client_table(self, now: float) -> list[JsonValue]:
        """The client sessions: id, connection, how long silent, requests waiting or running."""
        open_requests: dict[bytes, int] = {}
        for pending in self._requests.values():
            if not pending.done:
                open_requests[pending.client] = open_requests.get(pending.client, 0) + 1
        rows: list[JsonValue] = [
            {
                "client_id": s.client_id,
                "routing_id": s.routing_id.hex(),
                "config_version": s.config_version,
                "idle_s": round(now - s.last_seen, 3),
                "requests": open_requests.get(s.routing_id, 0),
            }
            for s in sorted(self._sessions[Channel.FRONTEND].values(), key=lambda s: s.client_id)
        ]
        return rows

    def worker_table(self, now: float) -> list[JsonValue]:
        """The READY workers: id, services, capacity, requests running, heartbeat, silence."""
        sessions = self._sessions[Channel.BACKEND]
        rows: list[dict[str, JsonValue]] = []
        for rid, worker in self._pool.workers.items():
            session = sessions.get(rid)
            rows.append(
                {
                    "worker_id": session.client_id if session is not None else None,
                    "routing_id": rid.hex(),
                    "services": list(worker.services),
                    "capacity": worker.capacity,
                    "in_flight": len(worker.in_flight),
                    "heartbeat": worker.heartbeat,
                    "interval_ms": round(worker.interval_s * 1000),
                    "idle_s": round(now - session.last_seen, 3) if session is not None else None,
                }
            )
        rows.sort(key=lambda row: str(row["worker_id"]))
        return list(rows)

    def status(self, now: float, wall: float) -> dict[str, JsonValue]:
        """The ``status`` command: state, config, the /metrics counters, services, history."""
        stats = self.stats()
        totals = self.metrics.totals()
        counters: dict[str, JsonValue] = dict(self.counters)
        counters.update({f"net_{k}": v for k, v in self.io_counters.items()})
        return {
            "broker": self.identity,
            "family": self.network.family,
            "state": self.state,
            "config_version": self.network.config_version,
            "sha256": self.sha256,
            "uptime_s": round(now - self._started, 3),
            "time": wall,
            "clients": stats["clients"],
            "workers": stats["workers"],
            "in_flight": stats["in_flight"],
            "queued": stats["queued"],
            "banned_senders": stats["banned_senders"],
            "requests": self.counters["requests"],
            "replies": int(totals["replies"]),
            "replies_by_status": {str(k): v for k, v in sorted(self.metrics.replies.items())},
            "latency_count": int(totals["latency_count"]),
            "latency_sum_s": totals["latency_sum_s"],
            "latency_buckets_s": list(LATENCY_BUCKETS_S),
            "dropped": self.counters["dropped"]
            + self.io_counters.get("banned_dropped", 0)
            + self.io_counters.get("send_dropped", 0),
            "counters": counters,
            "event_log": None if self.event_log is None else {**self.event_log},
            "config_source": self.config_source,
            "peers": len(self._peers),
            "peers_up": sum(1 for p in self._peers.values() if p.status == "up"),
            "config_conflicts": self.config_view()["conflicts"],
            "services": self.service_table(),
            "history": [dict(sample) for sample in self.metrics.history],
        }

    def set_state(self, target: State, now: float, by: str, out: list[Effect]) -> Outcome:
        """``disable`` / ``enable`` (§6.4): active <-> disabled; a joining broker refuses (503).

        Disabling answers every request still waiting for a worker with 503 (nothing is routed
        any more); requests already at a worker finish and are answered.
        """
        before = self.state
        if before == "joining":
            return Outcome(503, None, f"broker {self.identity} is joining: it has no config yet")
        if before == target:
            return Outcome(200, {"broker": self.identity, "state": before, "changed": False})
        self.state = target
        out.append(Log("warning", "broker_state", {"from": before, "to": target, "by": by}))
        if target == "disabled":
            self._move_away(now, out)
        return Outcome(200, {"broker": self.identity, "state": target, "changed": True})

    def _move_away(self, now: float, out: list[Effect]) -> None:
        """R18: the broker stops serving; its waiting requests and idle workers go elsewhere."""
        moved: set[bytes] = set()
        for service, queue in self._queues.items():
            while queue:
                pending = queue.popleft()
                if pending.done:
                    continue
                self._queued[service] -= 1
                if pending.origin is not None:
                    self._fail(pending, 503, f"broker {self.identity} is {self.state}", out)
                    continue
                peer = self._pick_peer(service, free=False)
                if peer is not None:
                    self._forward_to(peer, pending, out)
                    continue
                # Nobody here will run it: its client resends it where it is told to go.
                self._retire(pending)
                moved.add(pending.client)
        for rid in moved:
            self._move_client(rid, now, out)
        for worker in list(self._pool.workers.values()):
            if not worker.in_flight:
                self._move_worker(worker.routing_id, now, out)
        self._check_drained(out)

    def _move_worker(self, rid: bytes, now: float, out: list[Effect]) -> None:
        if self.draining:  # R17's DISCONNECT, early: it fails over at once
            out.append(Send(Channel.BACKEND, rid, Disconnect(protocol=SIG_WORKER)))
        else:
            message = self._not_accepting(SIG_WORKER, Channel.BACKEND)
            out.append(Send(Channel.BACKEND, rid, message))
        self._forget(Channel.BACKEND, rid, now, out, reason="moved")

    def _move_client(self, rid: bytes, now: float, out: list[Effect]) -> None:
        if rid not in self._sessions[Channel.FRONTEND]:
            return
        if self.draining:
            out.append(Send(Channel.FRONTEND, rid, Disconnect(protocol=SIG_CLIENT)))
        else:
            out.append(
                Send(Channel.FRONTEND, rid, self._not_accepting(SIG_CLIENT, Channel.FRONTEND))
            )
        self._forget(Channel.FRONTEND, rid, now, out, reason="moved")

    def _client_busy(self, rid: bytes) -> bool:
        return any(p.client == rid and p.origin is None for p in self._requests.values())

    def _drain(self, grace_ms: int, now: float, out: list[Effect]) -> None:
        """R19: SIGTERM. Disable, tell idle clients DISCONNECT, finish what is in flight."""
        if self.draining:
            return
        self.draining = True
        out.append(
            Log("info", "broker_draining", {"in_flight": len(self._inflight), "grace_ms": grace_ms})
        )
        if self.state == "active":
            self.set_state("disabled", now, "shutdown", out)
        elif self.state == "disabled":
            self._move_away(now, out)
        for rid in list(self._sessions[Channel.FRONTEND]):
            if not self._client_busy(rid):
                self._move_client(rid, now, out)
        self._check_drained(out)

    def _check_drained(self, out: list[Effect]) -> None:
        if self.draining and not self._inflight and not self._drained_said:
            self._drained_said = True
            out.append(Drained())

    def _after_answer(self, pending: Pending, out: list[Effect]) -> None:
        """R19: a request was answered while draining: move its client once it is idle here."""
        if pending.origin is None and not self._client_busy(pending.client):
            self._move_client(pending.client, self._clock, out)
        self._check_drained(out)

    def _sample(self, now: float, wall: float) -> None:
        self.metrics.maybe_sample(
            now,
            wall,
            {
                "requests": self.counters["requests"],
                "clients": len(self._sessions[Channel.FRONTEND]),
                "workers": len(self._pool.workers),
                "queued": sum(self._queued.values()),
                "in_flight": len(self._inflight),
            },
        )

    # ---- the one entry point ---------------------------------------------------------------

    def handle(self, event: Event, now: float, wall: float) -> list[Effect]:
        out: list[Effect] = []
        self._clock = now
        if isinstance(event, Received):
            self._received(event.channel, event.routing_id, event.message, now, wall, out)
        elif isinstance(event, Tick):
            self._tick(now, wall, out)
        elif isinstance(event, Malformed):
            self._malformed(event, now, out)
        elif isinstance(event, ConfigOffered):
            self._config_offered(event, now, wall, out)
        elif isinstance(event, Start):
            self._start(now, wall, out)
        elif isinstance(event, Shutdown):
            self._shutdown(out)
        elif isinstance(event, Drain):
            self._drain(event.grace_ms, now, out)
        elif isinstance(event, ManagementCall):
            self.management.checked(event, now, wall, out)
        elif isinstance(event, ManagementSubmit):
            self.management.submitted(event, now, wall, out)
        elif isinstance(event, ConfigRead):
            self.management.config_read(event, now, wall, out)
        elif isinstance(event, FanOutDone):
            self.management.fanned_out(event, out)
        return out

    # ---- the hot path's entry points (docs/performance.md) ---------------------------------
    # The same rules as handle(Received(...)) for the two messages of every request, fed the
    # fields scale0.wire.hot reads from raw frames, so no message or event object is built.

    def handle_request(
        self, rid: bytes, service: str, request_id: bytes, body: tuple[bytes, ...], now: float
    ) -> list[Effect]:
        """Exactly ``handle(Received(FRONTEND, rid, ClientRequest(service, request_id, body)))``."""
        self._clock = now
        out: list[Effect] = []
        self._client_request(rid, service, request_id, body, now, out)
        return out

    def handle_reply(
        self, rid: bytes, ticket: bytes, status: int, body: tuple[bytes, ...], now: float
    ) -> list[Effect]:
        """Exactly ``handle(Received(BACKEND, rid, WorkerReply(ticket, status, body)))``."""
        self._clock = now
        out: list[Effect] = []
        self._worker_reply(rid, ticket, status, body, now, out)
        return out

    def _received(
        self,
        channel: Channel,
        rid: bytes,
        message: Message,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        # Hot path first: isinstance checks in order of frequency.
        if isinstance(message, ClientRequest):
            self._client_request(rid, message.service, message.request_id, message.body, now, out)
        elif isinstance(message, WorkerReply):
            self._worker_reply(rid, message.ticket, message.status, message.body, now, out)
        elif isinstance(message, WorkerPartial):
            self._worker_partial(rid, message, now, out)
        elif channel is Channel.PEER or channel is Channel.LINK:
            self._peer_message(channel, rid, message, now, wall, out)
        elif isinstance(message, Heartbeat):
            self._heartbeat(channel, rid, message, now, wall, out)
        elif isinstance(message, CheckConfig):
            self._check_config(channel, rid, message, now, out)
        elif isinstance(message, Ready):
            self._ready(rid, message, now, wall, out)
        elif isinstance(message, Disconnect):
            self._forget(channel, rid, now, out, reason="disconnect")
        elif isinstance(message, ManagementRequest):
            # Credentials first (scale0/core/admin.py, M1): the sender is its own routing id.
            self.management.submit(
                channel, rid, rid, message, session_ok=False, now=now, wall=wall, out=out
            )
        else:
            # Majordomo and peer traffic are decoded by the wire layer but not routed yet.
            self.counters["dropped"] += 1
            out.append(Log("info", "unsupported_message", {"command": message.COMMAND.decode()}))

    # ---- negotiation (R1, R2, R3, R16) -----------------------------------------------------

    def _session(
        self, channel: Channel, rid: bytes, now: float, out: list[Effect]
    ) -> Session | None:
        session = self._sessions[channel].get(rid)
        if session is None:
            out.append(
                Send(
                    channel,
                    rid,
                    ForceNegotiate(reason="send CHECKCONFIG first", protocol=_PROTOCOL[channel]),
                )
            )
            return None
        if channel is Channel.BACKEND:
            heartbeat_gap(
                out, rid, now - session.last_seen, session.timeout_s / self.network.liveness
            )
        session.last_seen = now
        return session

    def _check_config(
        self, channel: Channel, rid: bytes, msg: CheckConfig, now: float, out: list[Effect]
    ) -> None:
        protocol = _PROTOCOL[channel]
        if self.state != "active":
            out.append(Send(channel, rid, self._not_accepting(protocol, channel)))
            return
        client_id = msg.client_id or f"{self.identity}.{rid.hex()}"
        holder = self._client_ids.get((channel, client_id))
        if holder is not None and holder != rid:
            other = self._sessions[channel].get(holder)
            if other is not None and now - other.last_seen < self._interval_s:
                out.append(
                    Send(
                        channel,
                        rid,
                        DisconnectError(
                            code=409,
                            message=f"client_id {client_id!r} is in use by a live connection",
                            protocol=protocol,
                        ),
                    )
                )
                return
            self._forget(channel, holder, now, out, reason="replaced")
        sessions = self._sessions[channel]
        old = sessions.get(rid)
        if old is not None and old.client_id != client_id:
            self._client_ids.pop((channel, old.client_id), None)
        self._gen += 1
        session = Session(
            rid,
            channel,
            client_id,
            self.network.config_version,
            now,
            self._interval_s * self.network.liveness,
            self._gen,
        )
        if old is not None:
            session.timeout_s = old.timeout_s
        sessions[rid] = session
        self._client_ids[(channel, client_id)] = rid
        self._timers.push(now + session.timeout_s, ("session", channel, rid, session.gen))
        worker = self._pool.workers.get(rid) if channel is Channel.BACKEND else None
        if worker is not None:
            # A registered worker renegotiating (after FORCENEGOTIATE): its beat timer belongs
            # to the old session, so it gets one of this session.
            self._timers.push(now + worker.interval_s, ("beat", rid, session.gen))
        version = self.network.config_version
        if msg.config_version == version:
            out.append(
                Send(
                    channel,
                    rid,
                    ConfigAck(config_version=version, client_id=client_id, protocol=protocol),
                )
            )
            return
        out.append(
            Send(
                channel,
                rid,
                Config(
                    config_type=msg.config_type,
                    config_version=version,
                    # §3.2: the digest covers the view sent; the signature covers the whole
                    # config, so it goes only with the whole config (peers, not clients).
                    sha256=self.client_view_sha256,
                    client_id=client_id,
                    document=self.client_view(msg.config_type),
                    signature=None,
                    protocol=protocol,
                ),
            )
        )

    def _not_accepting(self, protocol: bytes, channel: Channel) -> DisconnectError:
        """R3: 503, or (disabled, draining) 301 to an active peer's endpoint for this channel."""
        if self.state == "disabled" and channel in (Channel.FRONTEND, Channel.BACKEND):
            target = self._active_endpoint(channel)
            if target is not None:
                return DisconnectError(
                    code=301,
                    message=f"broker {self.identity} is {self.state}: go to {target}",
                    endpoint=target,
                    protocol=protocol,
                )
        return DisconnectError(
            code=503, message=f"broker {self.identity} is {self.state}", protocol=protocol
        )

    def _active_endpoint(self, channel: Channel) -> str | None:
        """The frontend or backend of an active peer we are linked to (the first by id)."""
        for broker_id in sorted(self._peers):
            if not self._peers[broker_id].usable():
                continue
            entry = next((b for b in self.network.brokers if b.identity == broker_id), None)
            if entry is not None:
                return entry.frontend if channel is Channel.FRONTEND else entry.backend
        return None

    def _skewed(
        self, channel: Channel, rid: bytes, sent: float, now: float, wall: float, out: list[Effect]
    ) -> bool:
        skew = abs(sent - wall)
        if skew <= self.network.max_clock_skew_s:
            return False
        out.append(
            Send(
                channel,
                rid,
                DisconnectError(
                    code=412,
                    message=f"clock skew {skew:.1f} s is over {self.network.max_clock_skew_s} s",
                    protocol=_PROTOCOL[channel],
                ),
            )
        )
        self._forget(channel, rid, now, out, reason="clock_skew")
        return True

    def _heartbeat(
        self,
        channel: Channel,
        rid: bytes,
        msg: Heartbeat,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        if channel not in _PROTOCOL:
            return
        session = self._session(channel, rid, now, out)
        if session is None or self._skewed(channel, rid, msg.time, now, wall, out):
            return
        if msg.config_version < self.network.config_version:
            out.append(
                Send(
                    channel,
                    rid,
                    ForceNegotiate(
                        reason=f"config_version {self.network.config_version} is current",
                        protocol=_PROTOCOL[channel],
                    ),
                )
            )
            return
        if channel is Channel.FRONTEND:
            # Workers get the broker's own heartbeats on their schedule; clients get an answer.
            out.append(
                Send(
                    channel,
                    rid,
                    Heartbeat(
                        time=wall, config_version=self.network.config_version, protocol=SIG_CLIENT
                    ),
                )
            )

    # ---- workers (R4, R8, R11, R12, R15) ---------------------------------------------------

    def _ready(self, rid: bytes, msg: Ready, now: float, wall: float, out: list[Effect]) -> None:
        session = self._session(Channel.BACKEND, rid, now, out)
        if session is None or self._skewed(Channel.BACKEND, rid, msg.time, now, wall, out):
            return
        refused = [
            s
            for s in msg.services
            if is_reserved_service(s) or (self._routes is not None and s not in self._routes)
        ]
        if refused:
            why = f"services not offered here or reserved: {', '.join(refused)}"
            out.append(
                Send(
                    Channel.BACKEND,
                    rid,
                    DisconnectError(code=400, message=why, protocol=SIG_WORKER),
                )
            )
            self._forget(Channel.BACKEND, rid, now, out, reason="refused")
            return
        interval_s = max(msg.hbeatinterval_ms, self.network.default_heartbeat_interval_ms) / 1000
        worker = Worker(
            rid, tuple(dict.fromkeys(msg.services)), msg.capacity, msg.heartbeat, interval_s
        )
        old = self._pool.workers.get(rid)
        known = old is not None
        if self._peers:
            self._table_changed(old.services if old is not None else (), now)
        self._pool.add(worker)
        session.timeout_s = interval_s * self.network.liveness if msg.heartbeat else float("inf")
        if not known:
            self._timers.push(now + interval_s, ("beat", rid, session.gen))
        out.append(
            Log(
                "info",
                "worker_ready",
                {"worker": rid.hex(), "services": list(worker.services), "capacity": msg.capacity},
            )
        )
        self._worker_free(worker, now, out)

    def _worker_free(self, worker: Worker, now: float, out: list[Effect]) -> None:
        """Give queued requests to a worker with spare capacity, then list it as ready."""
        if self._peers:
            self._table_changed(worker.services, now)
        for service in worker.services:
            queue = self._queues.get(service)
            while queue and worker.spare > 0:
                pending = queue.popleft()
                if pending.done:
                    continue
                self._queued[service] -= 1
                self._dispatch_to(worker, pending, now, out)
        self._pool.list_ready(worker)

    def _worker_lost(
        self, rid: bytes, now: float, out: list[Effect], reason: str, silent_s: float = 0.0
    ) -> None:
        worker = self._pool.remove(rid)
        if worker is None:
            return
        self.counters["workers_lost"] += 1
        if self._peers:
            self._table_changed(worker.services, now)
        gone = [s for s in worker.services if not self._pool.offers(s)]
        for service in gone:
            self._service_left[service] = now
        out.append(
            Log(
                "warning",
                "worker_lost",
                {"worker": rid.hex(), "reason": reason, "silent_ms": round(silent_s * 1000)},
            )
        )
        for ticket in sorted(worker.in_flight):
            pending = self._inflight.pop(ticket, None)
            if pending is not None:
                self._route_again(pending, now, out, 504, "worker lost")
        if gone and self._peers:
            self._orphaned(gone, now, out)

    def _route_again(
        self, pending: Pending, now: float, out: list[Effect], status: int, why: str
    ) -> None:
        """Its worker or peer is lost (R8, F3, F8): dispatch again within max_retries, else fail."""
        pending.ticket = pending.worker = pending.peer = None
        if pending.attempt <= self.network.max_retries:
            self.counters["retries"] += 1
            pending.deadline = now + self._timeout_s
            self._timers.push(pending.deadline, ("request", pending.seq))
            self._route(pending, now, out, front=True)
        else:
            self._fail(pending, status, f"{why} after {pending.attempt} attempt(s)", out)

    # ---- requests (R5, R6, R7, R9, R10) ----------------------------------------------------

    def _client_request(
        self,
        rid: bytes,
        service: str,
        request_id: bytes,
        body: tuple[bytes, ...],
        now: float,
        out: list[Effect],
    ) -> None:
        session = self._session(Channel.FRONTEND, rid, now, out)
        if session is None:
            return
        if self.state != "active":
            out.append(
                Send(Channel.FRONTEND, rid, self._not_accepting(SIG_CLIENT, Channel.FRONTEND))
            )
            return
        self.counters["requests"] += 1
        key = (session.client_id.encode(), request_id)
        cached = self._cache.get(key, now)
        if cached is not None:
            self.counters["cache_hits"] += 1
            self.metrics.reply(cached.status)
            out.append(Send(Channel.FRONTEND, rid, cached))
            return
        live = self._live.get(key)
        if live is not None:
            self.counters["duplicates_joined"] += 1
            live.client = rid  # answer wherever the client asks from now
            return
        if is_reserved_service(service):
            self._reserved(rid, ClientRequest(service, request_id, body), out)
            return
        if not self._known(service, now):
            self.counters["errors_404"] += 1
            self.metrics.reply(404)
            if self.event_log is not None:
                refused(out, service, rid, body, now, 404)
            out.append(
                Send(
                    Channel.FRONTEND,
                    rid,
                    ClientReply.failure(service, request_id, 404, f"no service {service!r}"),
                )
            )
            return
        self._seq += 1
        pending = Pending(self._seq, rid, key, service, request_id, body, now + self._timeout_s)
        pending.started = now
        self._requests[pending.seq] = pending
        self._live[key] = pending
        self._timers.push(pending.deadline, ("request", pending.seq))
        self._route(pending, now, out, front=False)

    def _known(self, service: str, now: float) -> bool:
        if self._routes is not None:
            return service in self._routes  # listed services wait for a worker (R6)
        if self._pool.offers(service) or now - self._started < self._timeout_s:
            return True
        if any(peer.offers(service) for peer in self._peers.values() if peer.usable()):
            return True
        left = self._service_left.get(service)
        return left is not None and now - left < self._timeout_s

    def _route(self, pending: Pending, now: float, out: list[Effect], *, front: bool) -> None:
        worker = self._pool.take(pending.service)
        if worker is not None:
            self._dispatch_to(worker, pending, now, out)
            return
        service = pending.service
        if self._peers and pending.origin is None and self.state == "active":
            # F6: a peer with free slots; else wait here if we offer it; else any peer that does.
            peer = self._pick_peer(service, free=True)
            if peer is None and not self._pool.offers(service):
                peer = self._pick_peer(service, free=False)
            if peer is not None:
                self._forward_to(peer, pending, out)
                return
        elif pending.origin is not None and not self._pool.offers(service):
            self._fail(pending, 404, f"no worker for {service!r} on {self.identity}", out)
            return
        waiting = self._queued.get(service, 0)
        if waiting >= self.network.max_queued_requests and not front:
            self._fail(pending, 503, f"{waiting} requests already wait for {service!r}", out)
            return
        queue = self._queues.setdefault(service, deque())
        if front:
            queue.appendleft(pending)
        else:
            queue.append(pending)
        self._queued[service] = waiting + 1

    def _dispatch_to(self, worker: Worker, pending: Pending, now: float, out: list[Effect]) -> None:
        self._ticket_seq += 1
        ticket = self._boot_id + self._ticket_seq.to_bytes(8, "big")
        pending.ticket = ticket
        pending.worker = worker.routing_id
        pending.attempt += 1
        if pending.attempt > 1:
            # A retry gets a whole deadline of its own on the new worker.
            pending.deadline = max(pending.deadline, now + self._timeout_s)
        worker.in_flight.add(ticket)
        self._inflight[ticket] = pending
        if self._peers:
            self._table_changed(worker.services, now)
        out.append(
            Send(
                Channel.BACKEND,
                worker.routing_id,
                WorkerRequest(ticket=ticket, service=pending.service, body=pending.body),
            )
        )

    def _worker_reply(
        self,
        rid: bytes,
        ticket: bytes,
        status: int,
        body: tuple[bytes, ...],
        now: float,
        out: list[Effect],
    ) -> None:
        session = self._sessions[Channel.BACKEND].get(rid)
        if session is not None:
            session.last_seen = now
        worker = self._pool.workers.get(rid)
        pending = self._inflight.get(ticket)
        if pending is None or pending.worker != rid:
            self.counters["dropped"] += 1  # R14: unknown ticket, silently
            if worker is not None and ticket in worker.in_flight:
                # A late answer to a request already given 504 (R9): the slot is free again.
                worker.in_flight.discard(ticket)
                self._worker_free(worker, now, out)
            return
        del self._inflight[ticket]
        reply = ClientReply(
            service=pending.service, request_id=pending.request_id, status=status, body=body
        )
        self._finish(pending, reply, out, now)
        if worker is not None:
            worker.in_flight.discard(ticket)
            if self.state != "active" and not worker.in_flight:
                self._move_worker(rid, now, out)  # R18: its last request here is answered
            else:
                self._worker_free(worker, now, out)

    def _worker_partial(
        self, rid: bytes, msg: WorkerPartial, now: float, out: list[Effect]
    ) -> None:
        session = self._sessions[Channel.BACKEND].get(rid)
        if session is not None:
            session.last_seen = now
        pending = self._inflight.get(msg.ticket)
        if pending is None or pending.worker != rid:
            self.counters["dropped"] += 1
            return
        pending.deadline = now + self._timeout_s  # progress: the deadline moves on (R9)
        self._relay_partial(pending, msg.body, out)

    def _relay_partial(self, pending: Pending, body: tuple[bytes, ...], out: list[Effect]) -> None:
        if pending.origin is not None:
            out.append(Send(Channel.PEER, pending.client, ForwardPartial(pending.origin, body)))
            return
        out.append(
            Send(
                Channel.FRONTEND,
                pending.client,
                ClientPartial(service=pending.service, request_id=pending.request_id, body=body),
            )
        )

    def _retire(self, pending: Pending) -> None:
        """The request has its final answer: forget it everywhere but the reply cache."""
        pending.done = True
        self._requests.pop(pending.seq, None)
        self._live.pop(pending.key, None)

    def _finish(self, pending: Pending, reply: ClientReply, out: list[Effect], now: float) -> None:
        self._retire(pending)
        if self.event_log is not None:
            request_done(out, pending, reply.status, reply.body, now, self._peer_rids)
        self.metrics.observe(pending.service, reply.status, now - pending.started)
        self.counters["replies"] += 1
        if pending.origin is not None:  # F7: the origin broker caches; we only answer it
            answer = ForwardReply(pending.origin, reply.status, reply.body)
            out.append(Send(Channel.PEER, pending.client, answer))
            if self.draining:
                self._check_drained(out)
            return
        self._cache.put(pending.key, reply, now)
        out.append(Send(Channel.FRONTEND, pending.client, reply))
        if self.draining:
            self._after_answer(pending, out)

    def _fail(self, pending: Pending, status: int, message: str, out: list[Effect]) -> None:
        self.counters[f"errors_{status}"] = self.counters.get(f"errors_{status}", 0) + 1
        self._retire(pending)
        if self.event_log is not None:
            request_done(out, pending, status, (), self._clock, self._peer_rids)
        self.metrics.observe(pending.service, status, self._clock - pending.started)
        if pending.origin is not None:
            failure = ClientReply.failure(pending.service, pending.request_id, status, message)
            answer = ForwardReply(pending.origin, status, failure.body)
            out.append(Send(Channel.PEER, pending.client, answer))
            if self.draining:
                self._check_drained(out)
            return
        out.append(
            Send(
                Channel.FRONTEND,
                pending.client,
                ClientReply.failure(pending.service, pending.request_id, status, message),
            )
        )
        if self.draining:
            self._after_answer(pending, out)

    def _reserved(self, rid: bytes, msg: ClientRequest, out: list[Effect]) -> None:
        """Reserved names (protocol.md §7.3): mmi.service from live state, the rest refused."""
        if msg.service == "mmi.service":
            name = msg.body[0].decode("utf-8", "replace") if msg.body else ""
            answer = b"200" if self._pool.offers(name) else b"404"
            reply = ClientReply(
                service=msg.service, request_id=msg.request_id, status=200, body=(answer,)
            )
        elif msg.service.startswith("mmi."):
            reply = ClientReply.failure(msg.service, msg.request_id, 501, "MMI service unknown")
        else:
            reply = ClientReply.failure(msg.service, msg.request_id, 404, "no broker service")
        self.metrics.reply(reply.status)
        out.append(Send(Channel.FRONTEND, rid, reply))

    # ---- time (R8, R6, R9) and errors (R13) ------------------------------------------------

    def _tick(self, now: float, wall: float, out: list[Effect]) -> None:
        for key in self._timers.pop_due(now):
            kind = key[0]
            if kind == "request":
                self._request_due(key, now, out)
            elif kind == "session":
                self._session_due(key, now, out)
            elif kind == "beat":
                self._beat_due(key, now, wall, out)
            elif kind == "sweep":
                self._sweep(now)
                self._sample(now, wall)
                self._timers.push(now + SWEEP_INTERVAL_S, ("sweep",))
            elif kind == "peers":
                self._peers_due(now, wall, out)
                self._timers.push(now + self._interval_s, ("peers",))
            elif kind == "table":
                self._table_armed = False
                self._commit_table(now, wall, out)
            elif kind == "republish":
                self._publish(out)
                self._timers.push(now + self.network.config_republish_s, ("republish",))

    def _request_due(self, key: TimerKey, now: float, out: list[Effect]) -> None:
        seq = key[1]
        assert isinstance(seq, int)  # our own timer key, not network input
        pending = self._requests.get(seq)
        if pending is None or pending.done:
            return
        if pending.deadline > now:
            self._timers.push(pending.deadline, key)  # moved on by a PARTIAL or a retry
            return
        if pending.ticket is None:
            self._queued[pending.service] -= 1  # its queue entry is skipped when reached
            self._fail(pending, 503, f"no worker for {pending.service!r} before the deadline", out)
            return
        if pending.peer is not None:
            peer = self._peers.get(pending.peer)
            if peer is not None:
                peer.forwarded.discard(pending.ticket)
        # The worker keeps the slot: it may still be running the request. Its late REPLY finds
        # no ticket (R14) and gives the slot back; so does losing the worker.
        self._inflight.pop(pending.ticket, None)
        self._fail(pending, 504, f"no reply within {self._timeout_s:g} s", out)

    def _session_due(self, key: TimerKey, now: float, out: list[Effect]) -> None:
        _, channel, rid, gen = key
        assert isinstance(channel, Channel) and isinstance(rid, bytes)
        session = self._sessions[channel].get(rid)
        if session is None or session.gen != gen:
            return
        expires = session.last_seen + session.timeout_s
        if expires > now:
            self._timers.push(expires, key)
            return
        self._forget(channel, rid, now, out, reason="expired")

    def _beat_due(self, key: TimerKey, now: float, wall: float, out: list[Effect]) -> None:
        _, rid, gen = key
        assert isinstance(rid, bytes)
        session = self._sessions[Channel.BACKEND].get(rid)
        worker = self._pool.workers.get(rid)
        if session is None or session.gen != gen or worker is None:
            return
        out.append(
            Send(
                Channel.BACKEND,
                rid,
                Heartbeat(
                    time=wall,
                    config_version=self.network.config_version,
                    hbeatinterval_ms=round(worker.interval_s * 1000),
                    protocol=SIG_WORKER,
                ),
            )
        )
        self._timers.push(now + worker.interval_s, key)

    def _forget(
        self, channel: Channel, rid: bytes, now: float, out: list[Effect], *, reason: str
    ) -> None:
        session = self._sessions.get(channel, {}).pop(rid, None)
        if session is not None and self._client_ids.get((channel, session.client_id)) == rid:
            del self._client_ids[(channel, session.client_id)]
        if channel is Channel.BACKEND:
            self._worker_lost(rid, now, out, reason, now - session.last_seen if session else 0.0)

    def _malformed(self, event: Malformed, now: float, out: list[Effect]) -> None:
        if event.channel is Channel.CONFIG or event.channel is Channel.LINK:
            # No session and no reply route: PUB senders and our own links are not scored
            # (§6.1, §6.3 rule 1); the publication or answer is dropped and logged.
            key = "config_malformed" if event.channel is Channel.CONFIG else "peer_ignored"
            self.counters[key] += 1
            out.append(
                Log(
                    "warning",
                    "config_dropped" if event.channel is Channel.CONFIG else "peer_malformed",
                    {"code": event.error.code, "reason": str(event.error)},
                )
            )
            return
        self.counters["malformed"] += 1
        rid = event.routing_id
        if self.is_banned(rid, now):
            return
        protocol = _PROTOCOL.get(event.channel, SIG_BROKER)
        if self.count_error(event.channel, rid, rid, now, out):
            return
        out.append(
            Send(
                event.channel,
                rid,
                DisconnectError(code=event.error.code, message=str(event.error), protocol=protocol),
            )
        )
        self._forget(event.channel, rid, now, out, reason="malformed")  # §2.4: session ends

    def count_error(
        self, channel: Channel, sender: bytes, reply_to: bytes, now: float, out: list[Effect]
    ) -> bool:
        """One error towards ``sender``'s score (R13, §8); True if it banned the sender.

        The ban is answered once, DISCONNECTERROR 429 to ``reply_to`` (the sender's routing id,
        or the waiting HTTP request), and ends the sender's session.
        """
        window = self._errors.setdefault(sender, deque())
        window.append(now)
        while window and window[0] <= now - self.network.error_window_s:
            window.popleft()
        if len(window) <= self.network.error_threshold:
            return False
        self.counters["banned"] += 1
        self._banned[sender] = now + self.network.error_ban_s
        del self._errors[sender]
        self._forget(channel, sender, now, out, reason="banned")
        out.append(
            Log(
                "warning",
                "sender_banned",
                {"sender": sender.hex(), "ban_s": self.network.error_ban_s},
            )
        )
        out.append(
            Send(
                channel,
                reply_to,
                DisconnectError(
                    code=429,
                    message="too many errors: ignored for a while",
                    protocol=_PROTOCOL.get(
                        channel, SIG_BROKER if channel is Channel.PEER else SIG_CLIENT
                    ),
                ),
            )
        )
        return True

    def _sweep(self, now: float) -> None:
        """Bound memory: forget old error scores, ended bans and old cached replies."""
        horizon = now - self.network.error_window_s
        for rid in [r for r, w in self._errors.items() if not w or w[-1] <= horizon]:
            del self._errors[rid]
        for rid in [r for r, until in self._banned.items() if until <= now]:
            del self._banned[rid]
        for service in [s for s, t in self._service_left.items() if now - t >= self._timeout_s]:
            del self._service_left[service]
        self._cache.prune(now)

    def _shutdown(self, out: list[Effect]) -> None:
        for channel, sessions in self._sessions.items():
            for rid in sessions:
                out.append(Send(channel, rid, Disconnect(protocol=_PROTOCOL[channel])))
        for link in [*self._peers, *self._seeds]:
            out.append(Send(Channel.LINK, link.encode(), Disconnect(protocol=SIG_BROKER)))
        out.append(Log("info", "broker_stopping", {"identity": self.identity}))

    # ---- the family: start, links and HELLO (F1, F2, F3, F12, F13) -------------------------

    def _start(self, now: float, wall: float, out: list[Effect]) -> None:
        if self.replica.current is not None:
            self._plan_links(self.network, plan_change(None, self.network, self.identity), out)
        for link, endpoint in self._seeds.items():
            if self.state == "joining":
                out.append(Connect(link, endpoint))
        self._resubscribe(out)
        self._say_hello(now, wall, out)
        self._timers.push(now + self._interval_s, ("peers",))
        if self.config_source:
            self._publish(out)
            self._timers.push(now + self.network.config_republish_s, ("republish",))

    def _plan_links(self, network: NetworkConfig, plan: Plan, out: list[Effect]) -> None:
        """Perform ``plan``'s links (K5): one per other member of ``network`` (F1); refresh how
        each peer's table reaches us from the config's links."""
        wants: dict[str, tuple[bool, TableMode]] = {}
        if network.peers:
            for link in network.peers:
                if link.target == self.identity:
                    wants[link.source] = (True, TableMode(link.table_mode))
        for broker_id in plan.close:
            peer = self._peers.pop(broker_id, None)
            if peer is not None and peer.routing_id is not None:
                self._peer_rids.pop(peer.routing_id, None)
            out.append(Close(broker_id))
            out.append(Log("info", "peer_removed", {"peer": broker_id}))
        for broker_id, endpoint in plan.connect.items():
            known = self._peers.get(broker_id)
            if known is not None and known.routing_id is not None:
                self._peer_rids.pop(known.routing_id, None)
            self._peers[broker_id] = Peer(broker_id, endpoint, TableMode.PULL, False)
            out.append(Connect(broker_id, endpoint))
        for broker_id, peer in self._peers.items():
            peer.pull, peer.wants = wants.get(broker_id, (not network.peers, TableMode.PULL))

    def _endpoints(self) -> dict[str, str]:
        entry = next((b for b in self.network.brokers if b.identity == self.identity), None)
        if entry is None:
            return {}
        return {
            "frontend": entry.frontend,
            "backend": entry.backend,
            "peer": entry.peer,
            "config_pub": entry.config_pub,
        }

    def _hello(self, mode: TableMode) -> Hello:
        return Hello(
            broker_id=self.identity,
            family=self.replica.family or self.network.family,
            state=BrokerState(self.state),
            config_version=self.replica.version,
            endpoints=self._endpoints(),
            table_mode=mode,
        )

    def _say_hello(self, now: float, wall: float, out: list[Effect]) -> None:
        """HELLO on every link not answered yet; HEARTBEAT on the others (F1, F13)."""
        for broker_id, peer in self._peers.items():
            if not peer.linked:
                mode = peer.wants if peer.pull else TableMode.PULL
                out.append(Send(Channel.LINK, broker_id.encode(), self._hello(mode)))
            else:
                out.append(Send(Channel.LINK, broker_id.encode(), self._heartbeat_message(wall)))
        if self.state == "joining":
            for seed in self._seeds:
                if seed in self._seed_linked:
                    out.append(Send(Channel.LINK, seed.encode(), self._check_config_message()))
                else:
                    out.append(Send(Channel.LINK, seed.encode(), self._hello(TableMode.PULL)))

    def _heartbeat_message(self, wall: float) -> PeerHeartbeat:
        return PeerHeartbeat(
            broker_id=self.identity,
            time=wall,
            state=BrokerState(self.state),
            config_version=self.replica.version,
            table_seq=self._table.seq,
        )

    def _check_config_message(self) -> CheckConfig:
        version = self.replica.version
        return CheckConfig(
            config_type=ConfigType.JSON,
            config_version=version or None,
            client_id=self.identity,
            protocol=SIG_BROKER,
        )

    def _peers_due(self, now: float, wall: float, out: list[Effect]) -> None:
        """Every interval: expire silent peers (F3), then HELLO or HEARTBEAT on every link."""
        limit = self._interval_s * self.network.liveness
        for peer in list(self._peers.values()):
            if peer.status == "up" and now - peer.last_seen > limit:
                self._peer_down(peer, now, out, reason="silent")
        self._say_hello(now, wall, out)

    def _peer_up(self, peer: Peer, now: float, out: list[Effect]) -> None:
        peer.last_seen = now
        if peer.status != "up":
            peer.status = "up"
            out.append(Log("info", "peer_up", {"peer": peer.broker_id}))

    def _peer_down(self, peer: Peer, now: float, out: list[Effect], *, reason: str) -> None:
        was_up = peer.status == "up"
        peer.status = "down"
        peer.linked = False
        peer.push_to = False
        if peer.routing_id is not None and reason != "silent":
            # Silence is only a suspicion: the peer's link is still the same connection and it
            # does not know we dropped it, so it will not say HELLO again. Keep its routing id,
            # so that what it says next on that link counts (F3) instead of being ignored as
            # "before HELLO" (F2) for good. A restart (new HELLO) or DISCONNECT replaces it.
            self._peer_rids.pop(peer.routing_id, None)
            peer.routing_id = None
        self._services_left(peer.table, now)
        peer.forget_table()
        if was_up:
            self.counters["peers_lost"] += 1
            out.append(
                Log(
                    "warning",
                    "peer_lost",
                    {
                        "peer": peer.broker_id,
                        "reason": reason,
                        "silent_ms": round((now - peer.last_seen) * 1000),
                    },
                )
            )
        for ticket in sorted(peer.forwarded):
            pending = self._inflight.pop(ticket, None)
            if pending is not None:
                self._route_again(pending, now, out, 504, f"peer {peer.broker_id} lost")
        peer.forwarded.clear()

    def _peer_message(
        self,
        channel: Channel,
        rid: bytes,
        message: Message,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        if channel is Channel.LINK:
            link = rid.decode("utf-8", "replace")
            if link in self._seeds:
                self._seed_message(link, message, now, wall, out)
                return
            peer = self._peers.get(link)
            if peer is None:
                return  # a link we closed: its last messages are of no interest
            self._link_message(peer, message, now, wall, out)
            return
        if isinstance(message, Hello):
            self._hello_in(rid, message, now, wall, out)
            return
        broker_id = self._peer_rids.get(rid)
        peer = self._peers.get(broker_id) if broker_id is not None else None
        if peer is None:
            self.counters["peer_ignored"] += 1  # F2: nothing counts before HELLO
            return
        claimed = getattr(message, "broker_id", peer.broker_id)
        if claimed != peer.broker_id:
            self.counters["peer_ignored"] += 1
            out.append(
                Log("warning", "peer_spoof", {"peer": peer.broker_id, "claimed": str(claimed)})
            )
            return
        self._peer_up(peer, now, out)
        if isinstance(message, Forward):
            self._forward_in(peer, rid, message, now, out)
        elif isinstance(message, PeerHeartbeat):
            self._peer_heartbeat(peer, rid, message, now, wall, out)
        elif isinstance(message, TableReq):
            self._table_req_in(peer, rid, message, out)
        elif isinstance(message, Table):
            self._table_in(peer, message, now, out)
        elif isinstance(message, CheckConfig):
            self._peer_check_config(peer, rid, message, out)
        elif isinstance(message, Disconnect):
            self._peer_down(peer, now, out, reason="disconnect")  # F12
        else:
            self.counters["peer_ignored"] += 1

    def _hello_in(self, rid: bytes, msg: Hello, now: float, wall: float, out: list[Effect]) -> None:
        """F2: a peer's link says HELLO on our ROUTER."""
        if self.state == "joining":
            return  # nothing to check it against yet; it says HELLO again every interval
        peer = self._peers.get(msg.broker_id)
        if msg.family != self.network.family or peer is None:
            why = (
                f"family {msg.family!r} is not {self.network.family!r}"
                if msg.family != self.network.family
                else f"{msg.broker_id!r} is not a broker of family {self.network.family!r}"
            )
            out.append(
                Send(Channel.PEER, rid, DisconnectError(code=401, message=why, protocol=SIG_BROKER))
            )
            out.append(Log("warning", "peer_refused", {"peer": msg.broker_id, "reason": why}))
            return
        if (
            peer.routing_id is not None
            and peer.routing_id != rid
            and now - peer.last_seen < self._interval_s
        ):
            why = f"broker_id {msg.broker_id!r} is in use by a live link"
            out.append(
                Send(Channel.PEER, rid, DisconnectError(code=409, message=why, protocol=SIG_BROKER))
            )
            return
        if peer.routing_id is not None and peer.routing_id != rid:
            # A new link for a known broker: it restarted. What it held for us is gone.
            self._peer_rids.pop(peer.routing_id, None)
            self._peer_down(peer, now, out, reason="restarted")
        peer.routing_id = rid
        self._peer_rids[rid] = peer.broker_id
        peer.state = msg.state
        peer.config_version = msg.config_version
        peer.push_to = msg.table_mode is TableMode.PUSH
        self._peer_up(peer, now, out)
        mode = peer.wants if peer.pull else TableMode.PULL
        out.append(Send(Channel.PEER, rid, self._hello(mode)))
        if peer.push_to:
            self._send_table(peer, None, out)
        if not peer.linked:  # say HELLO on our link now rather than at the next interval
            out.append(Send(Channel.LINK, peer.broker_id.encode(), self._hello(mode)))
        self._newer_config(peer, msg.config_version, out)

    def _link_message(
        self, peer: Peer, message: Message, now: float, wall: float, out: list[Effect]
    ) -> None:
        """What comes back on our own link to ``peer``: answers to what we sent on it."""
        if isinstance(message, ForwardReply):
            self._peer_up(peer, now, out)
            self._forward_reply_in(peer, message, now, out)
            return
        if isinstance(message, ForwardPartial):
            self._peer_up(peer, now, out)
            self._forward_partial_in(peer, message, now, out)
            return
        if isinstance(message, Hello):
            if message.broker_id != peer.broker_id or message.family != self.network.family:
                out.append(
                    Log(
                        "warning",
                        "peer_wrong_hello",
                        {"peer": peer.broker_id, "said": message.broker_id},
                    )
                )
                return
            self._peer_up(peer, now, out)
            peer.state = message.state
            peer.config_version = message.config_version
            if not peer.linked:
                peer.linked = True
                out.append(Log("info", "peer_linked", {"peer": peer.broker_id}))
                if peer.pull and peer.wants is TableMode.PULL:
                    self._send_table_req(peer, full=True, out=out)
            self._newer_config(peer, message.config_version, out)
            return
        if isinstance(message, DisconnectError):
            out.append(
                Log(
                    "warning",
                    "peer_refused_us",
                    {"peer": peer.broker_id, "code": message.code, "reason": message.message},
                )
            )
            peer.linked = False
            return
        if not peer.linked:
            self.counters["peer_ignored"] += 1
            return
        self._peer_up(peer, now, out)
        if isinstance(message, Table):
            if message.broker_id == peer.broker_id:
                self._table_in(peer, message, now, out)
        elif isinstance(message, (Config, ConfigAck)):
            self._config_answer(peer.broker_id, message, out, now, wall)
        elif isinstance(message, Disconnect):
            self._peer_down(peer, now, out, reason="disconnect")
        else:
            self.counters["peer_ignored"] += 1

    def _seed_message(
        self, link: str, message: Message, now: float, wall: float, out: list[Effect]
    ) -> None:
        """A joining broker's seed links: HELLO, then CHECKCONFIG until a CONFIG applies."""
        if isinstance(message, Hello):
            self._seed_linked.add(link)
            self._seed_names[link] = message.broker_id
            if self.state == "joining":
                out.append(Send(Channel.LINK, link.encode(), self._check_config_message()))
        elif isinstance(message, (Config, ConfigAck)):
            self._config_answer(self._seed_names.get(link, link), message, out, now, wall)
        elif isinstance(message, DisconnectError):
            self._seed_linked.discard(link)
            out.append(
                Log(
                    "warning",
                    "seed_refused_us",
                    {"seed": self._seeds[link], "code": message.code, "reason": message.message},
                )
            )

    def _peer_heartbeat(
        self,
        peer: Peer,
        rid: bytes,
        msg: PeerHeartbeat,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        skew = abs(msg.time - wall)
        if skew > self.network.max_clock_skew_s:
            why = f"clock skew {skew:.1f} s is over {self.network.max_clock_skew_s} s"
            out.append(
                Send(Channel.PEER, rid, DisconnectError(code=412, message=why, protocol=SIG_BROKER))
            )
            self._peer_down(peer, now, out, reason="clock_skew")
            return
        peer.state = msg.state
        peer.config_version = msg.config_version
        if msg.table_seq < peer.table_seq:
            peer.forget_table()  # its table started again (it restarted): pull all of it
        # Pull mode: its HEARTBEAT says our copy is stale. (Push mode repairs gaps in _table_in.)
        pulling = peer.pull and peer.linked and peer.wants is TableMode.PULL
        if pulling and msg.table_seq > peer.table_seq:
            self._send_table_req(peer, full=False, out=out)
        self._newer_config(peer, msg.config_version, out)

    # ---- tables (F5, F9) -------------------------------------------------------------------

    def _send_table_req(self, peer: Peer, *, full: bool, out: list[Effect]) -> None:
        since = None if full or peer.table_seq == 0 else peer.table_seq
        out.append(
            Send(
                Channel.LINK,
                peer.broker_id.encode(),
                TableReq(broker_id=self.identity, since_seq=since),
            )
        )

    def _send_table(self, peer: Peer, since: int | None, out: list[Effect]) -> None:
        if peer.routing_id is None:
            return
        delta = self._table.since(since) if since is not None else None
        if delta is None:
            table = Table(self.identity, self._table.seq, True, self._table.full())
        else:
            table = Table(self.identity, self._table.seq, False, delta)
        out.append(Send(Channel.PEER, peer.routing_id, table))

    def _table_req_in(self, peer: Peer, rid: bytes, msg: TableReq, out: list[Effect]) -> None:
        self._send_table(peer, msg.since_seq, out)

    def _table_in(self, peer: Peer, msg: Table, now: float, out: list[Effect]) -> None:
        if not peer.pull:
            self.counters["peer_ignored"] += 1  # no link in the config shares its table with us
            return
        if not msg.full and msg.table_seq > peer.table_seq + 1 and peer.wants is TableMode.PUSH:
            # A pushed delta skipped a version we never saw: ask for everything.
            self._send_table_req(peer, full=True, out=out)
            return
        if not msg.full and msg.table_seq <= peer.table_seq:
            return  # old news
        before = list(peer.table)
        peer.apply_table(msg.table_seq, msg.full, msg.services)
        self._services_left([s for s in before if s not in peer.table], now)
        self._drain_to_peers(now, out)

    def _endpoint_mismatches(self, network: NetworkConfig) -> list[str]:
        """Where this broker's entry names other ports than it bound (its file's, not 0)."""
        entry = next((b for b in network.brokers if b.identity == self.identity), None)
        if entry is None:
            return []
        problems = []
        for channel, own in sorted(self._own_ports.items()):
            endpoint = getattr(entry, channel, None)
            if not own or not isinstance(endpoint, str):
                continue
            port = endpoint.rpartition(":")[2]
            if port.isdigit() and int(port) != own:
                problems.append(
                    f"{channel}_port is {own}, but brokers[{self.identity}].{channel} in config "
                    f"v{network.config_version} is {endpoint}"
                )
        return problems

    def _services_left(self, services: Iterable[str], now: float) -> None:
        """R7: services a peer no longer offers stay known for the failover grace."""
        for service in services:
            self._service_left[service] = now

    def _table_changed(self, services: Sequence[str], now: float) -> None:
        self._table.mark(services)
        if not self._table_armed:
            self._table_armed = True
            self._timers.push(now + TABLE_COMMIT_S, ("table",))

    def _commit_table(self, now: float, wall: float, out: list[Effect]) -> None:
        if not self._table.dirty:
            return
        rows: dict[str, list[TableWorker]] = {}
        sessions = self._sessions[Channel.BACKEND]
        for worker in self._pool.workers.values():
            session = sessions.get(worker.routing_id)
            if session is None:
                continue
            row = TableWorker(
                worker_id=session.client_id,
                capacity=max(worker.spare, 0),
                last_heartbeat=max(wall - (now - session.last_seen), 0.0),
            )
            for service in worker.services:
                rows.setdefault(service, []).append(row)
        delta = self._table.commit({s: tuple(r) for s, r in rows.items()})
        if not delta:
            return
        table = Table(self.identity, self._table.seq, False, delta)
        for peer in self._peers.values():
            if peer.push_to and peer.routing_id is not None and peer.status == "up":
                out.append(Send(Channel.PEER, peer.routing_id, table))

    # ---- forwarding (F6-F9) ----------------------------------------------------------------

    def _pick_peer(self, service: str, *, free: bool) -> Peer | None:
        """The usable peer offering ``service`` with the most free slots (F6); with ``free``,
        only one that has some. Our estimate of its slots drops by one per forward."""
        best: Peer | None = None
        best_slots = 0
        for peer in self._peers.values():
            if not peer.usable() or not peer.offers(service):
                continue
            slots = peer.free.get(service, 0)
            if (free and slots <= 0) or (best is not None and slots <= best_slots):
                continue
            best, best_slots = peer, slots
        return best

    def _forward_to(self, peer: Peer, pending: Pending, out: list[Effect]) -> None:
        self._ticket_seq += 1
        ticket = self._boot_id + self._ticket_seq.to_bytes(8, "big")
        pending.ticket = ticket
        pending.peer = peer.broker_id
        pending.attempt += 1
        peer.forwarded.add(ticket)
        peer.free[pending.service] = peer.free.get(pending.service, 0) - 1
        self._inflight[ticket] = pending
        self.counters["forwarded"] += 1
        out.append(
            Send(
                Channel.LINK,
                peer.broker_id.encode(),
                Forward(ticket, pending.service, self.identity, pending.body),
            )
        )

    def _drain_to_peers(self, now: float, out: list[Effect]) -> None:
        """F9: requests waiting here go to peers whose tables now show free slots.

        Requests forwarded to us stay (F6: never forwarded again) without holding up the
        ones behind them; the first request no peer can take ends the pass, in order.
        """
        if self.state != "active":
            return
        for service, queue in self._queues.items():
            if not queue or not any(p.usable() and p.offers(service) for p in self._peers.values()):
                continue
            kept: deque[Pending] = deque()
            while queue:
                pending = queue.popleft()
                if pending.done:
                    continue  # its count went when its deadline passed
                if pending.origin is not None:
                    kept.append(pending)
                    continue
                peer = self._pick_peer(service, free=True)
                if peer is None and not self._pool.offers(service):
                    peer = self._pick_peer(service, free=False)
                if peer is None:
                    kept.append(pending)
                    break
                self._queued[service] -= 1
                self._forward_to(peer, pending, out)
            kept.extend(queue)
            queue.clear()
            queue.extend(kept)

    def _orphaned(self, services: Sequence[str], now: float, out: list[Effect]) -> None:
        """F7, F9: the last local worker of ``services`` is gone. What peers forwarded to us
        and waits for one goes back to its origin (404, so it routes it again, F8); what our
        own clients asked goes to a peer that offers the service."""
        for service in services:
            queue = self._queues.get(service)
            if not queue:
                continue
            for pending in [p for p in queue if p.origin is not None and not p.done]:
                queue.remove(pending)
                self._queued[service] -= 1
                self._fail(pending, 404, f"no worker for {service!r} on {self.identity}", out)
        self._drain_to_peers(now, out)

    def _forward_in(
        self, peer: Peer, rid: bytes, msg: Forward, now: float, out: list[Effect]
    ) -> None:
        """F7: a peer forwards us a request; we run it here, or say why not at once."""
        if self.state != "active":
            why = f"broker {self.identity} is {self.state}"
            failure = ClientReply.failure(msg.service, b"", 503, why)
            out.append(Send(Channel.PEER, rid, ForwardReply(msg.ticket, 503, failure.body)))
            return
        self.counters["forwards_served"] += 1
        self.counters["requests"] += 1  # one definition: docs/management.md "Counters"
        self._seq += 1
        pending = Pending(
            self._seq,
            rid,
            (b"\x00" + peer.broker_id.encode(), msg.ticket),
            msg.service,
            b"",
            msg.body,
            now + self._timeout_s,
            origin=msg.ticket,
            started=now,
        )
        self._requests[pending.seq] = pending
        self._timers.push(pending.deadline, ("request", pending.seq))
        self._route(pending, now, out, front=False)

    def _forward_reply_in(
        self, peer: Peer, msg: ForwardReply, now: float, out: list[Effect]
    ) -> None:
        pending = self._inflight.get(msg.ticket)
        if pending is None or pending.peer != peer.broker_id:
            self.counters["dropped"] += 1  # unknown ticket: dropped silently (§5.4)
            return
        del self._inflight[msg.ticket]
        peer.forwarded.discard(msg.ticket)
        if msg.status in (404, 503) and not pending.done:
            # F8: it could not take it after all. Count its slots as none until its next table.
            peer.free[pending.service] = 0
            if msg.status == 404:
                peer.table.pop(pending.service, None)
            self._route_again(pending, now, out, msg.status, f"peer {peer.broker_id} refused")
            return
        peer.free[pending.service] = peer.free.get(pending.service, 0) + 1
        reply = ClientReply(
            service=pending.service, request_id=pending.request_id, status=msg.status, body=msg.body
        )
        self._finish(pending, reply, out, now)

    def _forward_partial_in(
        self, peer: Peer, msg: ForwardPartial, now: float, out: list[Effect]
    ) -> None:
        pending = self._inflight.get(msg.ticket)
        if pending is None or pending.peer != peer.broker_id:
            self.counters["dropped"] += 1
            return
        pending.deadline = now + self._timeout_s
        self._relay_partial(pending, msg.body, out)

    # ---- config replication (F4, F10, F11) -------------------------------------------------

    def _newer_config(self, peer: Peer, version: int, out: list[Effect]) -> None:
        if version > self.replica.version and peer.linked:
            out.append(Send(Channel.LINK, peer.broker_id.encode(), self._check_config_message()))

    def _peer_check_config(
        self, peer: Peer, rid: bytes, msg: CheckConfig, out: list[Effect]
    ) -> None:
        current = self.replica.current
        if self.state != "active" or current is None or not current.signature:
            out.append(Send(Channel.PEER, rid, self._not_accepting(SIG_BROKER, Channel.PEER)))
            return
        if msg.config_version == current.version:
            answer: Message = ConfigAck(
                config_version=current.version, client_id=peer.broker_id, protocol=SIG_BROKER
            )
        else:
            answer = Config(
                config_type=msg.config_type,
                config_version=current.version,
                sha256=current.sha256,
                client_id=peer.broker_id,
                document=self._whole_document(msg.config_type),
                signature=current.signature,
                protocol=SIG_BROKER,
            )
        out.append(Send(Channel.PEER, rid, answer))

    def _whole_document(self, config_type: ConfigType) -> bytes:
        document = self._whole.get(config_type)
        if document is None:
            if config_type is ConfigType.JSON:
                document = canonical_json(self.network)
            else:
                tree = to_tree(self.network, typed=False)
                document = render(tree, _FORMATS[config_type], kind="network")
            self._whole[config_type] = document
        return document

    def _config_answer(
        self, origin: str, msg: Config | ConfigAck, out: list[Effect], now: float, wall: float
    ) -> None:
        if isinstance(msg, ConfigAck):
            return
        offer = Offer(
            config_type=msg.config_type,
            document=msg.document,
            sha256=msg.sha256,
            signature=msg.signature,
            origin=origin,
            config_version=msg.config_version,
        )
        self._config_offered(ConfigOffered(offer, "peer"), now, wall, out)

    def offer_config(
        self, offer: Offer, source: str, now: float, wall: float
    ) -> tuple[ConfigOutcome, list[Effect]]:
        """Judge a config and say how it went: for management (set_config, reload_config),
        which must answer with what was applied, refused, or needs a restart (F10)."""
        out: list[Effect] = []
        outcome = self._config_offered(ConfigOffered(offer, source), now, wall, out)
        return outcome, out

    def _config_offered(
        self, event: ConfigOffered, now: float, wall: float, out: list[Effect]
    ) -> ConfigOutcome:
        outcome = self.replica.offer(event.offer)
        where = {"source": event.source, "origin": event.offer.origin}
        if isinstance(outcome, Applied):
            self._config_applied(outcome, event.source, now, wall, out)
        elif isinstance(outcome, Conflict):
            self.counters["config_conflicts"] += 1
            out.append(
                Log(
                    "warning",
                    "config_conflict",
                    {
                        **where,
                        "version": outcome.version,
                        "kept": outcome.kept,
                        "dropped": outcome.dropped,
                    },
                )
            )
        elif isinstance(outcome, Refused):
            self.counters["configs_refused"] += 1
            out.append(
                Log(
                    "warning",
                    "config_refused",
                    {
                        **where,
                        "reason": outcome.reason,
                        "version": event.offer.config_version,
                        "sha256": event.offer.sha256,
                    },
                )
            )
        return outcome

    def _config_applied(
        self, applied: Applied, source: str, now: float, wall: float, out: list[Effect]
    ) -> None:
        """F10: the new config runs; everything around it follows."""
        config = applied.config
        self.counters["configs_applied"] += 1
        if applied.conflict:
            self.counters["config_conflicts"] += 1
        was_joining = self.state == "joining"
        self._apply_network(config.network, config.signature or None)
        out.append(
            Log(
                "warning" if applied.conflict else "info",
                "config_applied",
                {
                    "source": source,
                    "origin": config.origin,
                    "version": config.version,
                    "previous": applied.previous_version,
                    "sha256": config.sha256,
                    "changed": list(applied.plan.changed),
                    "conflict": applied.conflict,
                },
            )
        )
        if applied.plan.restart_needed:
            out.append(
                Log(
                    "warning",
                    "config_needs_restart",
                    {"settings": list(applied.plan.restart_needed)},
                )
            )
        if self.identity not in {b.identity for b in config.network.brokers}:
            out.append(Log("error", "not_a_member", {"version": config.version}))
        mismatches = self._endpoint_mismatches(config.network)
        if mismatches:
            # Clients and workers would be sent where this broker does not listen (issue 11 #7).
            out.append(Log("error", "own_endpoint_mismatch", {"problems": mismatches}))
        if source != "disk" and config.signature:
            out.append(Persist(config.document(), config.sha256, config.signature, config.origin))
        self._plan_links(config.network, applied.plan, out)
        if was_joining:
            self.state = self._wanted
            self._started = now  # give workers a request timeout to show up (R7)
            for link in self._seeds:
                # Say goodbye first: the seed then frees our broker_id for our real link (F2).
                out.append(Send(Channel.LINK, link.encode(), Disconnect(protocol=SIG_BROKER)))
                out.append(Close(link))
            self._seeds.clear()
            self._seed_linked.clear()
            out.append(
                Log("info", "broker_state", {"from": "joining", "to": self.state, "by": "config"})
            )
        self._resubscribe(out)
        if self.config_source:
            self._publish(out)
        for channel, sessions in self._sessions.items():
            for rid in sessions:
                out.append(
                    Send(
                        channel,
                        rid,
                        ForceNegotiate(
                            reason=f"config_version {config.version} is current",
                            protocol=_PROTOCOL[channel],
                        ),
                    )
                )
        self._say_hello(now, wall, out)

    def _resubscribe(self, out: list[Effect]) -> None:
        mine = next((b for b in self.network.brokers if b.identity == self.identity), None)
        sources = [
            b.config_pub
            for b in self.network.brokers
            if b.config_source
            and b.identity != self.identity
            and (mine is None or b.config_pub != mine.config_pub)
        ]
        endpoints = tuple(sorted(set(self._config_subs) | set(sources)))
        if endpoints != self._subscribed:
            self._subscribed = endpoints
            out.append(Subscribe(endpoints))

    def _publish(self, out: list[Effect]) -> None:
        current = self.replica.current
        if not self.config_source or current is None or not current.signature:
            return
        out.append(
            Publish(
                PublishedConfig(
                    family=current.network.family,
                    config_version=current.version,
                    config_type=ConfigType.JSON,
                    sha256=current.sha256,
                    origin=self.identity,
                    signature=current.signature,
                    document=current.document(),
                )
            )
        )

    def fetch_config(self, wall: float, out: list[Effect]) -> list[str]:
        """CHECKCONFIG on every linked peer (or seed, while joining) now; returns whom."""
        asked: list[str] = []
        for broker_id, peer in self._peers.items():
            if peer.linked:
                out.append(Send(Channel.LINK, broker_id.encode(), self._check_config_message()))
                asked.append(broker_id)
        for seed in self._seed_linked:
            out.append(Send(Channel.LINK, seed.encode(), self._check_config_message()))
            asked.append(self._seed_names.get(seed, self._seeds.get(seed, seed)))
        return sorted(asked)

    # ---- views for management and tests ----------------------------------------------------

    def peers_view(self) -> list[JsonValue]:
        return [self._peers[b].view() for b in sorted(self._peers)]

    def config_view(self) -> dict[str, JsonValue]:
        current = self.replica.current
        return {
            "state": self.state,
            "config_version": self.replica.version,
            "sha256": current.sha256 if current else None,
            "origin": current.origin if current else None,
            "conflicts": [
                {"version": c.version, "kept": c.kept, "dropped": c.dropped, "origin": c.origin}
                for c in self.replica.conflicts
            ],
        }
