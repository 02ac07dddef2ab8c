"""Dispatch: requests and the workers that run them (R4-R11, R14, R15 of scale0/core/broker.py,
and R20's per-client cap: ``max_requests_per_client`` unanswered, more get 429).

What waits for a worker, what runs (in flight by ticket), a request's identity across retries
(client_id, request_id, R10), the reply cache and the worker pool (least recently used first)
are the ledger's (scale0/core/ledger.py): Dispatch holds the rules and reaches that state only
by the ledger's operations (:class:`~scale0.core.ports.LedgerPort`). A request with no ready
worker here may go to a peer (F6, scale0/core/family.py).

The hot path (docs/performance.md) is :meth:`Dispatch.client_request` and
:meth:`Dispatch.worker_reply`: the typed ``Broker.handle`` and the raw-frame entry points
``Broker.handle_request`` / ``handle_reply`` both end here, so there is one copy of the rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scale0.core.connections import touch
from scale0.core.context import Core
from scale0.core.effects import Channel, Effect, Log, Send
from scale0.core.ports import (
    FamilyPort,
    ForwardingPort,
    LedgerPort,
    LifecyclePort,
    MajordomoPort,
    SessionsPort,
)
from scale0.core.records import refused, request_done
from scale0.core.requests import Pending
from scale0.core.timers import BEAT_SLOTS, BeatRound, RequestDue
from scale0.core.trust import may
from scale0.core.workers import Worker
from scale0.wire.client import ClientPartial, ClientReply, DisconnectError, Heartbeat
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, is_reserved_service
from scale0.wire.mdp import MdpClientReply, MdpWorkerRequest
from scale0.wire.peer import BrokerState, ForwardPartial, ForwardReply
from scale0.wire.worker import Ready, WorkerIdRequest, WorkerPartial, WorkerRequest

__all__ = ["Dispatch"]

INF = float("inf")


class Dispatch:
    """Requests waiting, in flight and answered; the worker pool; the failover grace (R7)."""

    family: FamilyPort
    forwarding: ForwardingPort
    lifecycle: LifecyclePort
    majordomo: MajordomoPort
    sessions: SessionsPort

    def __init__(self, core: Core, ledger: LedgerPort) -> None:
        self.core = core
        #: The requests, tickets, reply cache, workers and queues (scale0/core/ledger.py).
        self.ledger = ledger
        self.service_left: dict[str, float] = {}  # service -> when its last worker went (R7)
        #: The last HEARTBEAT sent to a worker (R11), reused while its fields are the same.
        self._beat = Heartbeat(time=-1.0, config_version=-1, protocol=SIG_WORKER)
        #: R11: the workers of each slot of each enforced interval, beaten together once per
        #: interval by one BeatRound timer (a round is here exactly while its entry is armed).
        self._rounds: dict[BeatRound, dict[bytes, None]] = {}
        self._round_of: dict[bytes, BeatRound] = {}  # a worker's round in _rounds
        self._round_at: dict[BeatRound, float] = {}  # when each round is due next

    # ---- workers (R4, R8, R11, R15) --------------------------------------------------------

    def ready(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: Ready,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        core = self.core
        sessions = self.sessions
        session = sessions.session(Channel.BACKEND, routing_id, now, out)
        if session is None or sessions.skewed(
            Channel.BACKEND, routing_id, msg.time, now, wall, out
        ):
            return
        routes = core.routes
        refused = [
            s
            for s in msg.services
            if is_reserved_service(s) or (routes is not None and s not in routes)
        ]
        if refused:
            why = f"services not offered here or reserved: {', '.join(refused)}"
            out.append(
                Send(Channel.BACKEND, routing_id, DisconnectError(400, why, protocol=SIG_WORKER))
            )
            sessions.forget(Channel.BACKEND, routing_id, now, out, "refused")
            return
        grant = session.allowed  # its CURVE key's (scale0/core/trust.py, T1-T4)
        if grant != "all":
            denied = [s for s in msg.services if not may(grant, s)]
            if denied:
                why = f"CURVE key {session.key} may not serve {', '.join(denied)}"
                sessions.refuse(Channel.BACKEND, routing_id, why, out)
                sessions.forget(Channel.BACKEND, routing_id, now, out, "key_refused")
                return
        network = core.network
        interval_s = max(msg.hbeatinterval_ms, network.default_heartbeat_interval_ms) / 1000
        services = tuple(dict.fromkeys(msg.services))
        worker = Worker(routing_id, services, msg.capacity, msg.heartbeat, interval_s)
        worker.ids = msg.request_ids
        old = self.ledger.enroll(worker)
        if self.family.peers:
            self.family.table_changed(old.services if old is not None else (), now)
        sessions.unpromise(session)  # a READY starts at the negotiated interval (§3.4)
        sessions.set_timeout(session, interval_s * network.liveness if msg.heartbeat else INF)
        self._join_round(routing_id, interval_s, now)
        details = {"worker": routing_id.hex(), "services": list(services), "capacity": msg.capacity}
        out.append(Log("info", "worker_ready", details))
        self.worker_free(worker, now, out)

    def worker_free(self, worker: Worker, now: float, out: list[Effect]) -> None:
        """Give queued requests to a worker with spare capacity, then list it as ready."""
        if self.family.peers:
            self.family.table_changed(worker.services, now)
        ledger = self.ledger
        waiting = ledger.waiting_count
        for service in worker.services:
            while waiting(service) and ledger.spare(worker) > 0:
                pending = ledger.next_waiting(service, True)  # (the lane's head lent: ledger.py)
                if pending is None:
                    break
                self.dispatch_to(worker, pending, now, out)
        list_ready = ledger.list_ready  # (through a local: see client_request)
        list_ready(worker)

    def worker_lost(
        self, routing_id: bytes, now: float, out: list[Effect], reason: str, silent_s: float = 0.0
    ) -> None:
        """R8: a worker is gone; each of its requests is dispatched again or answered 504."""
        ledger = self.ledger
        worker = ledger.worker(routing_id)
        if worker is None:
            return
        tickets = ledger.tickets_of(worker)
        ledger.dismiss(routing_id)
        self.core.counters["workers_lost"] += 1
        family = self.family
        if family.peers:
            family.table_changed(worker.services, now)
        gone = [s for s in worker.services if not ledger.offers(s)]
        for service in gone:
            self.service_left[service] = now
        silent_ms = round(silent_s * 1000)
        details = {"worker": routing_id.hex(), "reason": reason, "silent_ms": silent_ms}
        out.append(Log("warning", "worker_lost", details))
        for ticket in tickets:
            pending = ledger.settle(ticket)
            if pending is not None:
                self.route_again(pending, now, out, 504, "worker lost")
        if gone and family.peers:
            self.forwarding.orphaned(gone, now, out)

    def _join_round(
        self, routing_id: bytes, interval_s: float, now: float, promise_s: float = 0.0
    ) -> None:
        """R11: ``routing_id`` is beaten with the workers of ``interval_s`` (and ``promise_s``,
        an idle worker's promise, §3.4; 0: none) that joined in the same slot (a tenth of the
        period): first at most one period from now, then every period. A READY with the
        interval it has keeps its round."""
        before = self._round_of.get(routing_id)
        if before is not None:
            if before.interval_s == interval_s and before.promise_s == promise_s:
                return
            self._rounds[before].pop(routing_id, None)
        period_s = promise_s or interval_s
        slot_s = period_s / BEAT_SLOTS
        tick = math.floor(now / slot_s)
        key = BeatRound(interval_s, tick % BEAT_SLOTS, promise_s)
        self._round_of[routing_id] = key
        members = self._rounds.get(key)
        if members is None:
            members = self._rounds[key] = {}
            # The slot's start plus one period: within one period of now, never after it.
            at = self._round_at[key] = min(tick * slot_s + period_s, now + period_s)
            self.core.timers.push(at, key)
        members[routing_id] = None

    def promised(
        self, worker: Worker, promise_s: float, now: float, wall: float, out: list[Effect]
    ) -> None:
        """§3.4: ``worker`` promised to beat every ``promise_s`` (0: its interval): the broker
        beats it at that period from now on, saying it (R11's round of that promise). A new
        idle promise is answered at once with a HEARTBEAT saying it, so the worker holds the
        broker to it from now, not from the round's first beat (up to a period away)."""
        self._join_round(worker.routing_id, worker.interval_s, now, promise_s)
        if promise_s:
            beat = Heartbeat(
                time=wall,
                config_version=self.core.network.config_version,
                hbeatinterval_ms=round(worker.interval_s * 1000),
                interval_ms=round(promise_s * 1000),
                protocol=SIG_WORKER,
            )
            out.append(Send(Channel.BACKEND, worker.routing_id, beat))

    def _wake(self, worker: Worker, now: float) -> None:
        """§3.4: a request goes to a worker that promised the idle interval: it is held to its
        own interval again from now (expiry now + liveness x interval), and beaten at it."""
        session = self.sessions.workers.get(worker.routing_id)
        if session is not None:
            self.sessions.unpromise(session)
            touch(session, now)
            if worker.heartbeat:
                self.sessions.set_timeout(session, worker.interval_s * self.core.network.liveness)
        self._join_round(worker.routing_id, worker.interval_s, now)

    def beat(self, key: BeatRound, now: float, wall: float, out: list[Effect]) -> None:
        """R11: the broker's HEARTBEAT to every worker of one round, carrying the interval it
        enforces; the round is armed again while it has workers."""
        interval_s = key.interval_s
        members = self._rounds.get(key)
        if members is None:
            return
        sessions = self.sessions.workers
        worker = self.ledger.worker
        round_of = self._round_of
        # The beats of one round share wall, version and interval: one message for all of
        # them, which the net layer encodes once.
        beat = self._beat
        version = self.core.network.config_version
        interval_ms = round(interval_s * 1000)
        promise_ms = round(key.promise_s * 1000) or None  # §3.4: an idle worker's round
        if (
            beat.time != wall
            or beat.config_version != version
            or beat.hbeatinterval_ms != interval_ms
            or beat.interval_ms != promise_ms
        ):
            beat = self._beat = Heartbeat(
                time=wall,
                config_version=version,
                hbeatinterval_ms=interval_ms,
                interval_ms=promise_ms,
                protocol=SIG_WORKER,
            )
        gone: list[bytes] = []
        for routing_id in members:
            if routing_id in sessions and worker(routing_id) is not None:
                out.append(Send(Channel.BACKEND, routing_id, beat))
            else:  # lost or forgotten since the last round
                gone.append(routing_id)
        for routing_id in gone:
            del members[routing_id]
            del round_of[routing_id]
        if members:
            # One interval after it was due (not after it fired: a late timer does not move the
            # slot); after a stall of more than an interval, one interval from now (not at
            # once: no worker is beaten twice in a row).
            period_s = key.promise_s or interval_s
            at = self._round_at[key] + period_s
            if at <= now:
                at = now + period_s
            self._round_at[key] = at
            self.core.timers.push(at, key)
        else:
            del self._rounds[key]
            del self._round_at[key]

    # ---- requests (R5, R6, R7, R9, R10) ----------------------------------------------------

    def client_request(
        self,
        routing_id: bytes,
        service: str,
        request_id: bytes,
        body: tuple[bytes, ...],
        now: float,
        out: list[Effect],
    ) -> None:
        core = self.core
        session = self.sessions.clients.get(routing_id)
        if session is None:
            self.sessions.session(Channel.FRONTEND, routing_id, now, out)  # R1: FORCENEGOTIATE
            return
        session.last_seen = now  # touch(session, now) inline: the hot path (as sessions.seen)
        order = session.order
        if order is not None:
            del order[routing_id]
            order[routing_id] = session
        if session.promise_ms:
            # §3.4: a client that promised the idle interval is active by its REQUEST: held to
            # the negotiated interval again from now, as the client library beats once busy.
            self.sessions.unpromise(session)
            self.sessions.set_timeout(session, core.interval_s * core.network.liveness)
        if core.state is not BrokerState.ACTIVE:
            refusal = self.family.not_accepting(SIG_CLIENT, Channel.FRONTEND)
            out.append(Send(Channel.FRONTEND, routing_id, refusal))
            return
        grant = session.allowed  # its CURVE key's (scale0/core/trust.py, T1-T4)
        if grant != "all" and not may(grant, service):
            why = f"this client's CURVE key may not call {service!r}"
            out.append(
                Send(
                    Channel.FRONTEND, routing_id, ClientReply.failure(service, request_id, 403, why)
                )
            )
            details = {"routing_id": routing_id.hex(), "key": session.key, "service": service}
            out.append(Log("warning", "request_refused", details))
            return
        core.counters["requests"] += 1
        key = (session.client_id.encode(), request_id)
        ledger = self.ledger
        # The ledger's lookups are bound methods of its structures, called through a local:
        # CPython specializes that load, not a method call on the ledger (docs/performance.md).
        lookup = ledger.cached
        cached = lookup(key, now)
        if cached is not None:
            core.counters["cache_hits"] += 1
            core.metrics.reply(cached.status)
            out.append(Send(Channel.FRONTEND, routing_id, cached))
            return
        joinable = ledger.joinable
        live = joinable(key)
        if live is not None:
            core.counters["duplicates_joined"] += 1
            if live.origin is None:
                ledger.redirect(live, routing_id)  # answer wherever the client asks from now
            else:
                live.join(routing_id, None)  # a peer forwarded it here with its ids (§5.4)
            return
        if is_reserved_service(service):
            self._reserved(routing_id, service, request_id, body, out)
            return
        if not self._known(service, now):
            core.counters["errors_404"] += 1
            core.metrics.reply(404)
            if core.event_log is not None:
                refused(out, service, routing_id, body, now, 404)
            failure = ClientReply.failure(service, request_id, 404, f"no service {service!r}")
            out.append(Send(Channel.FRONTEND, routing_id, failure))
            return
        client = key[0]
        count = ledger.held
        held = count(client)
        if held >= core.network.max_requests_per_client:
            core.counters["errors_429"] = core.counters.get("errors_429", 0) + 1
            core.metrics.reply(429)
            why = f"{held} requests of this client are not answered yet (max_requests_per_client)"
            out.append(
                Send(
                    Channel.FRONTEND, routing_id, ClientReply.failure(service, request_id, 429, why)
                )
            )
            return
        deadline = now + core.timeout_s
        pending = Pending(
            core.next_seq(),
            routing_id,
            key,
            service,
            request_id,
            body,
            deadline,
            started=now,
            caller=session.key,
        )
        speaks = self.majordomo.speaks
        if speaks and (Channel.FRONTEND, routing_id) in speaks:
            pending.ids = False  # a Majordomo client's ids are ours (mdp.N), not its own
        ledger.open(pending)
        core.timers.push(deadline, pending.seq)
        self.route(pending, now, out, front=False)

    def take(self, pending: Pending, now: float, out: list[Effect]) -> None:
        """A request a peer forwarded us (F7): held and routed like our own, never forwarded.
        With the client's ids (FORWARDWITH, F15) a resend joins it however it comes (R10)."""
        self.ledger.open(pending)
        self.core.timers.push(pending.deadline, pending.seq)
        self.route(pending, now, out, front=False)

    def _known(self, service: str, now: float) -> bool:
        """R7: a service with a worker, or one that had one within the failover grace."""
        core = self.core
        if core.routes is not None:
            return service in core.routes  # listed services wait for a worker (R6)
        offers = self.ledger.offers  # (through a local: see client_request)
        if offers(service) or now - core.started < core.timeout_s:
            return True
        if any(peer.offers(service) for peer in self.family.peers.values() if peer.usable()):
            return True
        left = self.service_left.get(service)
        return left is not None and now - left < core.timeout_s

    def route(self, pending: Pending, now: float, out: list[Effect], *, front: bool) -> None:
        """R5, R6, F6: a ready worker here; else a peer; else wait here (bounded)."""
        ledger = self.ledger
        if pending.prefer is not None:
            if now < pending.prefer_until:  # F15: back to the peer that held it, or wait
                if not self.forwarding.send_back(pending, out):
                    ledger.wait(pending, True)
                return
            pending.prefer = None
        take_worker = ledger.take_worker  # (through a local: see client_request)
        worker = take_worker(pending.service)
        if worker is not None:
            self.dispatch_to(worker, pending, now, out)
            return
        core = self.core
        service = pending.service
        family = self.family
        if family.peers and pending.origin is None and core.state is BrokerState.ACTIVE:
            # F6: a peer with free slots; else wait here if we offer it; else any peer that does.
            forwarding = self.forwarding
            peer = forwarding.pick_peer(service, free=True)
            if peer is None and not ledger.offers(service):
                peer = forwarding.pick_peer(service, free=False)
            if peer is not None:
                forwarding.forward_to(peer, pending, out)
                return
        elif pending.origin is not None and not ledger.offers(service):
            self.fail(pending, 404, f"no worker for {service!r} on {core.identity}", out)
            return
        waiting = ledger.waiting_count(service)
        if waiting >= core.network.max_queued_requests and not front:
            self.fail(pending, 503, f"{waiting} requests already wait for {service!r}", out)
            return
        ledger.wait(pending, front)

    def route_again(
        self, pending: Pending, now: float, out: list[Effect], status: int, why: str
    ) -> None:
        """Its worker or peer is lost (R8, F3, F8): dispatch again within max_retries, else fail."""
        ledger = self.ledger
        ledger.unassign(pending)
        if pending.attempt <= self.core.network.max_retries:
            self.core.counters["retries"] += 1
            ledger.reschedule(pending, min(now + self.core.timeout_s, pending.limit))
            self.core.timers.push(pending.deadline, pending.seq)
            self.route(pending, now, out, front=True)
        else:
            self.fail(pending, status, f"{why} after {pending.attempt} attempt(s)", out)

    def dispatch_to(self, worker: Worker, pending: Pending, now: float, out: list[Effect]) -> None:
        ticket = self.core.next_ticket()
        ledger = self.ledger
        ledger.dispatched(worker, ticket, pending)  # its ticket, worker and attempt set
        if pending.attempt > 1:
            # A retry gets a whole deadline of its own on the new worker.
            deadline = max(pending.deadline, min(now + self.core.timeout_s, pending.limit))
            ledger.reschedule(pending, deadline)
        beats = self._round_of.get(worker.routing_id)
        if beats is not None and beats.promise_s:
            self._wake(worker, now)
        if self.family.peers:
            self.family.table_changed(worker.services, now)
        request: WorkerRequest | WorkerIdRequest | MdpWorkerRequest | None = None
        if self.majordomo.speaks:  # a Majordomo worker: its REQUEST built here, not rewritten
            request = self.majordomo.worker_request(worker.routing_id, ticket, pending.body)
        if request is not None:
            pass
        elif worker.ids:
            # §4.3: the client's ids, so an idempotent handler (and the worker library's
            # recent-requests memory) can tell a request it already ran. A forwarded request
            # names its client when FORWARDWITH carried the ids (F15), else empty ids.
            own = pending.origin is None or pending.ids
            request = WorkerIdRequest(
                ticket,
                pending.service,
                pending.key[0].decode("utf-8", "replace") if own else "",
                pending.request_id if own else b"",
                pending.body,
            )
        else:
            request = WorkerRequest(ticket, pending.service, pending.body)  # (positional: faster)
        out.append(Send(Channel.BACKEND, worker.routing_id, request))

    def worker_reply(
        self,
        routing_id: bytes,
        ticket: bytes,
        status: int,
        body: tuple[bytes, ...],
        now: float,
        out: list[Effect],
    ) -> None:
        session = self.sessions.workers.get(routing_id)
        if session is not None:  # touch(session, now) inline: the hot path (as sessions.seen)
            session.last_seen = now
            order = session.order
            if order is not None:
                del order[routing_id]
                order[routing_id] = session
        ledger = self.ledger
        pending = ledger.answer(ticket, routing_id)  # out of flight, slot free, retired
        find = ledger.worker  # (through a local: see client_request)
        worker = find(routing_id)
        if pending is None:
            self.core.counters["dropped"] += 1  # R14: unknown ticket, silently
            if worker is not None and ledger.release(worker, ticket):
                # A late answer to a request already given 504 (R9): the slot is free again.
                self.worker_free(worker, now, out)
            return
        reply = ClientReply(pending.service, pending.request_id, status, body)  # (positional)
        self.finish(pending, reply, out, now)
        if worker is not None:
            if self.core.state is not BrokerState.ACTIVE and not ledger.used(worker):
                self.lifecycle.move_worker(
                    routing_id, now, out
                )  # R18: its last request is answered
            else:
                self.worker_free(worker, now, out)

    def worker_partial(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: WorkerPartial,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.sessions.seen(Channel.BACKEND, routing_id, now)
        ledger = self.ledger
        pending = ledger.running(msg.ticket)
        if pending is None or pending.worker != routing_id:
            self.core.counters["dropped"] += 1
            return
        ledger.reschedule(pending, now + self.core.timeout_s)  # progress: it moves on (R9)
        if pending.origin is not None:
            pending.limit = pending.deadline  # so does the origin's, on our FORWARDPARTIAL
        self.relay_partial(pending, msg.body, out)

    def relay_partial(self, pending: Pending, body: tuple[bytes, ...], out: list[Effect]) -> None:
        partial: ClientPartial | None = None
        if pending.origin is not None:
            out.append(Send(Channel.PEER, pending.client, ForwardPartial(pending.origin, body)))
        else:
            partial = ClientPartial(
                service=pending.service, request_id=pending.request_id, body=body
            )
            out.append(Send(Channel.FRONTEND, pending.client, partial))
        for routing_id, ticket in pending.also or ():
            if ticket is not None:
                out.append(Send(Channel.PEER, routing_id, ForwardPartial(ticket, body)))
            else:
                if partial is None:
                    partial = ClientPartial(
                        service=pending.service, request_id=pending.request_id, body=body
                    )
                out.append(Send(Channel.FRONTEND, routing_id, partial))

    def finish(self, pending: Pending, reply: ClientReply, out: list[Effect], now: float) -> None:
        core = self.core
        if not pending.done:  # (a worker's REPLY was retired by ledger.answer)
            self.ledger.retire(pending)
        if core.event_log is not None:
            request_done(out, pending, reply.status, reply.body, now)
        core.metrics.observe(pending.service, reply.status, now - pending.started)
        core.counters["replies"] += 1
        if pending.origin is not None:  # F7: the origin broker caches; so do we, with its ids
            if pending.ids:
                self.ledger.cache(pending.key, reply, now)  # F15: a resend via any broker finds it
            answer = ForwardReply(pending.origin, reply.status, reply.body)
            out.append(Send(Channel.PEER, pending.client, answer))
        else:
            answer_to: ClientReply | MdpClientReply | None = None
            if self.majordomo.speaks:  # a Majordomo client's answer, built here (D3)
                answer_to = self.majordomo.client_reply(pending.client, reply)
            if answer_to is None:
                cache = self.ledger.cache  # (through a local: see client_request)
                cache(pending.key, reply, now)
                answer_to = reply
            # else not cached: a Majordomo request has no id a retry could repeat (D1)
            out.append(Send(Channel.FRONTEND, pending.client, answer_to))
        if pending.also is not None:
            self._answer_also(pending, reply, out)
        if core.draining:
            self.lifecycle.answered(pending, out)

    def fail(self, pending: Pending, status: int, message: str, out: list[Effect]) -> None:
        core = self.core
        core.counters[f"errors_{status}"] = core.counters.get(f"errors_{status}", 0) + 1
        self.ledger.retire(pending)
        if core.event_log is not None:
            request_done(out, pending, status, (), core.clock)
        core.metrics.observe(pending.service, status, core.clock - pending.started)
        failure = ClientReply.failure(pending.service, pending.request_id, status, message)
        if pending.origin is not None:
            answer = ForwardReply(pending.origin, status, failure.body)
            out.append(Send(Channel.PEER, pending.client, answer))
        else:
            out.append(Send(Channel.FRONTEND, pending.client, failure))
        if pending.also is not None:
            self._answer_also(pending, failure, out)
        if core.draining:
            self.lifecycle.answered(pending, out)

    def _answer_also(self, pending: Pending, reply: ClientReply, out: list[Effect]) -> None:
        """The same final answer to everyone who joined ``pending`` (R10, F15): a peer's
        forward as FORWARDREPLY, our own client's other connection as REPLY. Each is one
        reply to one request taken on (docs/management.md "Counters")."""
        metrics = self.core.metrics
        for routing_id, ticket in pending.also or ():
            metrics.reply(reply.status)
            if ticket is not None:
                answer = ForwardReply(ticket, reply.status, reply.body)
                out.append(Send(Channel.PEER, routing_id, answer))
            else:
                out.append(Send(Channel.FRONTEND, routing_id, reply))

    def let_go(self, pending: Pending, why: str, out: list[Effect]) -> None:
        """R18: our own client's waiting request leaves (the client resends it elsewhere);
        peers' forwards that joined it get FORWARDREPLY 503 so their origins route them again."""
        joined = pending.also
        pending.also = None
        self.ledger.retire(pending)
        for routing_id, ticket in joined or ():
            if ticket is not None:
                failure = ClientReply.failure(pending.service, pending.request_id, 503, why)
                out.append(Send(Channel.PEER, routing_id, ForwardReply(ticket, 503, failure.body)))

    def _reserved(
        self,
        routing_id: bytes,
        service: str,
        request_id: bytes,
        body: tuple[bytes, ...],
        out: list[Effect],
    ) -> None:
        """Reserved names (protocol.md §7.3): the MMI services from the live state of the whole
        family (our workers and every usable peer's table), the rest refused."""
        name = body[0].decode("utf-8", "replace") if body else ""
        if service == "mmi.service":
            answer: tuple[bytes, ...] = (b"200" if self._workers_of(name) else b"404",)
        elif service == "mmi.workers":
            answer = (b"%d" % self._workers_of(name),)
        elif service == "mmi.services":
            names = set(self.ledger.offered())
            for peer in self.family.peers.values():
                if peer.usable():
                    names.update(peer.table)
            answer = tuple(sorted(n.encode() for n in names))
        else:
            answer = ()
        if service in ("mmi.service", "mmi.workers", "mmi.services"):
            reply = ClientReply(service=service, request_id=request_id, status=200, body=answer)
        elif service.startswith("mmi."):
            reply = ClientReply.failure(service, request_id, 501, "MMI service unknown")
        else:
            reply = ClientReply.failure(service, request_id, 404, "no broker service")
        self.core.metrics.reply(reply.status)
        out.append(Send(Channel.FRONTEND, routing_id, reply))

    def _workers_of(self, service: str) -> int:
        """Workers offering ``service`` here and at every usable peer (its table's rows)."""
        count = self.ledger.workers_of(service)
        for peer in self.family.peers.values():
            if peer.usable():
                count += len(peer.table.get(service, ()))
        return count

    def deadline(self, key: RequestDue, now: float, out: list[Effect]) -> None:
        """R6, R9: a request past its deadline is answered 503 (waiting) or 504 (running)."""
        ledger = self.ledger
        pending = ledger.open_at(key)
        if pending is None or pending.done:
            return
        if pending.deadline > now:
            self.core.timers.push(pending.deadline, key)  # moved on by a PARTIAL or a retry
            if pending.prefer is not None and now >= pending.prefer_until:
                # F15: its peer did not come back in time: it may go anywhere now.
                pending.prefer = None
                if pending.ticket is None and ledger.take_out(pending):
                    self.route(pending, now, out, front=True)
            return
        if pending.ticket is None:
            ledger.stop_waiting(pending)
            why = f"no worker for {pending.service!r} before the deadline"
            self.fail(pending, 503, why, out)
            return
        if pending.peer is not None:
            peer = self.family.peers.get(pending.peer)
            if peer is not None:
                peer.forwarded.discard(pending.ticket)
        # The worker keeps the slot: it may still be running the request. Its late REPLY finds
        # no ticket (R14) and gives the slot back; so does losing the worker.
        ledger.settle(pending.ticket)
        self.fail(pending, 504, f"no reply within {self.core.timeout_s:g} s", out)

    def services_left(self, services: Iterable[str], now: float) -> None:
        """R7: services a peer (or our last worker) no longer offers stay known for a while."""
        for service in services:
            self.service_left[service] = now

    def sweep(self, now: float) -> None:
        """Bound memory: forget services gone past the failover grace, and old cached replies."""
        timeout_s = self.core.timeout_s
        for service in [s for s, t in self.service_left.items() if now - t >= timeout_s]:
            del self.service_left[service]
        self.ledger.prune_cache(now)

    def client_busy(self, routing_id: bytes) -> bool:
        """Whether our own client ``routing_id`` has a request not answered yet."""
        return self.ledger.client_busy(routing_id)
