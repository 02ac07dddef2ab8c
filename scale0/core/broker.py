"""The broker state machine: negotiation, LRU routing by service, deadlines, retries, liveness.

Pure: ``Broker.handle(event, now, wall)`` returns effects; ``now`` is a monotonic clock for
timers and deadlines, ``wall`` is UNIX time for clock-skew checks. No sockets, no clock reads, no
randomness (the per-boot ``boot_id`` that prefixes tickets is passed in).

Rules (docs/protocol.md; tests/core/test_broker.py names a test after each):
 R1  A client or worker must CHECKCONFIG first; any other command from a sender with no
     negotiation on record gets FORCENEGOTIATE (and is not acted on).
 R2  CHECKCONFIG naming our config_version gets CONFIGACK, anything else gets CONFIG: the
     client view of the network config in the asked config_type, with sha256 and signature.
 R3  A broker that is not active answers CHECKCONFIG and REQUEST with DISCONNECTERROR 503.
 R4  READY puts the worker in the LRU queue of each of its services; a new READY replaces them.
 R5  A REQUEST goes to the least recently used ready worker of its service; a worker of
     capacity N takes up to N requests at once.
 R6  With no ready worker a request waits (at most max_queued_requests per service, else 503 at
     once) until a worker is ready, or until its deadline: 503.
 R7  A request for a service no worker offers gets 404 at once, unless the service had a
     worker within the last request_timeout_ms, the broker started less than that ago, or
     the config lists it in `services`; mmi.service is answered from live state, other mmi.*
     get 501 and scale0.* 404.
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
 R17 Shutdown tells every client and worker DISCONNECT.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from scale0.config.canonical import config_sha256, tree_sha256
from scale0.config.formats import Format, render
from scale0.config.model import NetworkConfig
from scale0.config.schema import to_tree
from scale0.core.effects import (
    Channel,
    Effect,
    Event,
    Log,
    Malformed,
    Received,
    Send,
    Shutdown,
    Tick,
)
from scale0.core.requests import Pending, ReplyCache, RequestKey
from scale0.core.timers import TimerHeap
from scale0.core.workers import Worker, WorkerPool
from scale0.wire.admin import ManagementReply, ManagementRequest
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
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType, Message, is_reserved_service
from scale0.wire.worker import Ready, WorkerPartial, WorkerReply, WorkerRequest

State = Literal["joining", "active", "disabled"]

REPLY_CACHE_ENTRIES = 10_000
REPLY_CACHE_BYTES = 64 << 20
REPLY_CACHE_AGE_S = 60.0
SWEEP_INTERVAL_S = 1.0

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
# ("request", seq), ("sweep",).
TimerKey = tuple[object, ...]


class Broker:
    """One broker's decisions. Feed it events; perform the effects it returns, in order."""

    def __init__(
        self,
        identity: str,
        network: NetworkConfig,
        *,
        state: State,
        boot_id: bytes,
        signature: str | None,
        now: float,
    ) -> None:
        self.identity = identity
        self.state: State = state
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
            ),
            0,
        )
        self._apply_network(network, signature)
        self._timers.push(now + SWEEP_INTERVAL_S, ("sweep",))

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
        return self._timers.next_due()

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

    # ---- the one entry point ---------------------------------------------------------------

    def handle(self, event: Event, now: float, wall: float) -> list[Effect]:
        out: list[Effect] = []
        if isinstance(event, Received):
            self._received(event.channel, event.routing_id, event.message, now, wall, out)
        elif isinstance(event, Tick):
            self._tick(now, wall, out)
        elif isinstance(event, Malformed):
            self._malformed(event, now, out)
        elif isinstance(event, Shutdown):
            self._shutdown(out)
        return out

    # ---- the hot path's entry points (docs/performance.md) ---------------------------------
    # The same rules as handle(Received(...)) for the two messages of every request, fed the
    # fields scale0.wire.hot reads from raw frames, so no message or event object is built.

    def handle_request(
        self, rid: bytes, service: str, request_id: bytes, body: tuple[bytes, ...], now: float
    ) -> list[Effect]:
        """Exactly ``handle(Received(FRONTEND, rid, ClientRequest(service, request_id, body)))``."""
        out: list[Effect] = []
        self._client_request(rid, service, request_id, body, now, out)
        return out

    def handle_reply(
        self, rid: bytes, ticket: bytes, status: int, body: tuple[bytes, ...], now: float
    ) -> list[Effect]:
        """Exactly ``handle(Received(BACKEND, rid, WorkerReply(ticket, status, body)))``."""
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
        elif isinstance(message, Heartbeat):
            self._heartbeat(channel, rid, message, now, wall, out)
        elif isinstance(message, CheckConfig):
            self._check_config(channel, rid, message, now, out)
        elif isinstance(message, Ready):
            self._ready(rid, message, now, wall, out)
        elif isinstance(message, Disconnect):
            self._forget(channel, rid, now, out, reason="disconnect")
        elif isinstance(message, ManagementRequest):
            # Management commands arrive with the management work (README, "Missing").
            out.append(
                Send(
                    channel,
                    rid,
                    ManagementReply(
                        request_id=message.request_id,
                        code=501,
                        message="management commands are not built yet",
                    ),
                )
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
        session.last_seen = now
        return session

    def _check_config(
        self, channel: Channel, rid: bytes, msg: CheckConfig, now: float, out: list[Effect]
    ) -> None:
        protocol = _PROTOCOL[channel]
        if self.state != "active":
            out.append(Send(channel, rid, self._not_accepting(protocol)))
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

    def _not_accepting(self, protocol: bytes) -> DisconnectError:
        return DisconnectError(
            code=503, message=f"broker {self.identity} is {self.state}", protocol=protocol
        )

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
        known = rid in self._pool.workers
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
        for service in worker.services:
            queue = self._queues.get(service)
            while queue and worker.spare > 0:
                pending = queue.popleft()
                if pending.done:
                    continue
                self._queued[service] -= 1
                self._dispatch_to(worker, pending, now, out)
        self._pool.list_ready(worker)

    def _worker_lost(self, rid: bytes, now: float, out: list[Effect], reason: str) -> None:
        worker = self._pool.remove(rid)
        if worker is None:
            return
        self.counters["workers_lost"] += 1
        for service in worker.services:
            if not self._pool.offers(service):
                self._service_left[service] = now
        out.append(Log("warning", "worker_lost", {"worker": rid.hex(), "reason": reason}))
        for ticket in sorted(worker.in_flight):
            pending = self._inflight.pop(ticket, None)
            if pending is None:
                continue
            pending.ticket = pending.worker = None
            if pending.attempt <= self.network.max_retries:
                self.counters["retries"] += 1
                pending.deadline = now + self._timeout_s
                self._timers.push(pending.deadline, ("request", pending.seq))
                self._route(pending, now, out, front=True)
            else:
                self._fail(pending, 504, f"worker lost after {pending.attempt} attempt(s)", out)

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
            out.append(Send(Channel.FRONTEND, rid, self._not_accepting(SIG_CLIENT)))
            return
        self.counters["requests"] += 1
        key = (session.client_id.encode(), request_id)
        cached = self._cache.get(key, now)
        if cached is not None:
            self.counters["cache_hits"] += 1
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
        self._requests[pending.seq] = pending
        self._live[key] = pending
        self._timers.push(pending.deadline, ("request", pending.seq))
        self._route(pending, now, out, front=False)

    def _known(self, service: str, now: float) -> bool:
        if self._routes is not None:
            return service in self._routes  # listed services wait for a worker (R6)
        if self._pool.offers(service) or now - self._started < self._timeout_s:
            return True
        left = self._service_left.get(service)
        return left is not None and now - left < self._timeout_s

    def _route(self, pending: Pending, now: float, out: list[Effect], *, front: bool) -> None:
        worker = self._pool.take(pending.service)
        if worker is not None:
            self._dispatch_to(worker, pending, now, out)
            return
        service = pending.service
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
        out.append(
            Send(
                Channel.FRONTEND,
                pending.client,
                ClientPartial(
                    service=pending.service, request_id=pending.request_id, body=msg.body
                ),
            )
        )

    def _retire(self, pending: Pending) -> None:
        """The request has its final answer: forget it everywhere but the reply cache."""
        pending.done = True
        self._requests.pop(pending.seq, None)
        self._live.pop(pending.key, None)

    def _finish(self, pending: Pending, reply: ClientReply, out: list[Effect], now: float) -> None:
        self._retire(pending)
        self.counters["replies"] += 1
        self._cache.put(pending.key, reply, now)
        out.append(Send(Channel.FRONTEND, pending.client, reply))

    def _fail(self, pending: Pending, status: int, message: str, out: list[Effect]) -> None:
        self.counters[f"errors_{status}"] = self.counters.get(f"errors_{status}", 0) + 1
        self._retire(pending)
        out.append(
            Send(
                Channel.FRONTEND,
                pending.client,
                ClientReply.failure(pending.service, pending.request_id, status, message),
            )
        )

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
                self._timers.push(now + SWEEP_INTERVAL_S, ("sweep",))

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
            self._worker_lost(rid, now, out, reason)

    def _malformed(self, event: Malformed, now: float, out: list[Effect]) -> None:
        self.counters["malformed"] += 1
        rid = event.routing_id
        if self.is_banned(rid, now):
            return
        protocol = _PROTOCOL.get(event.channel, SIG_CLIENT)
        window = self._errors.setdefault(rid, deque())
        window.append(now)
        while window and window[0] <= now - self.network.error_window_s:
            window.popleft()
        if len(window) > self.network.error_threshold:
            self.counters["banned"] += 1
            self._banned[rid] = now + self.network.error_ban_s
            del self._errors[rid]
            self._forget(event.channel, rid, now, out, reason="banned")
            out.append(
                Log(
                    "warning",
                    "sender_banned",
                    {"sender": rid.hex(), "ban_s": self.network.error_ban_s},
                )
            )
            out.append(
                Send(
                    event.channel,
                    rid,
                    DisconnectError(
                        code=429, message="too many errors: ignored for a while", protocol=protocol
                    ),
                )
            )
            return
        out.append(
            Send(
                event.channel,
                rid,
                DisconnectError(code=event.error.code, message=str(event.error), protocol=protocol),
            )
        )
        self._forget(event.channel, rid, now, out, reason="malformed")  # §2.4: session ends

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
        out.append(Log("info", "broker_stopping", {"identity": self.identity}))
