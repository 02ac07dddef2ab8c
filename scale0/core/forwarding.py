"""Forwarding: a request with no ready worker here goes to a peer (F6-F9 of scale0/core/broker.py).

The origin picks the usable peer with the most free slots for the service in its table (F6),
sends FORWARD on its own link and keeps the request in flight under a ticket; the peer runs it
like a local request and answers FORWARDPARTIAL / FORWARDREPLY on that link (F7). A 404 or 503
routes it again (F8); waiting requests go as soon as a table shows free slots, a peer's answer
to a forwarded request frees one, or the last local worker of their service is gone (F9).
"""

from __future__ import annotations

from collections.abc import Sequence

from scale0.core.context import Core
from scale0.core.effects import Channel, Effect, Log, Send
from scale0.core.peers import Peer
from scale0.core.ports import DispatchPort, FamilyPort, LedgerPort
from scale0.core.requests import Pending
from scale0.core.trust import allowed, may
from scale0.wire.client import ClientReply
from scale0.wire.peer import (
    FORWARD_WITH_NAME,
    BrokerState,
    Forward,
    ForwardPartial,
    ForwardReply,
)

__all__ = ["Forwarding"]


class Forwarding:
    """Requests this broker forwards to peers, and those peers forward to it."""

    dispatch: DispatchPort
    family: FamilyPort
    ledger: LedgerPort

    def __init__(self, core: Core) -> None:
        self.core = core

    def pick_peer(self, service: str, *, free: bool) -> Peer | None:
        """The usable peer offering ``service`` with the most free slots (F6); with ``free``,
        only one that has some. Our estimate of its slots drops by one per forward."""
        best: Peer | None = None
        best_slots = 0
        for peer in self.family.peers.values():
            if not peer.usable() or not peer.offers(service):
                continue
            slots = peer.free.get(service, 0)
            if (free and slots <= 0) or (best is not None and slots <= best_slots):
                continue
            best, best_slots = peer, slots
        return best

    def forward_to(self, peer: Peer, pending: Pending, out: list[Effect]) -> None:
        ticket = self.core.next_ticket()
        self.ledger.forwarded(ticket, pending, peer.broker_id)  # its ticket, peer and attempt set
        pending.prefer = None  # lost again, it prefers it again (F3); refused, it goes on (F8)
        peer.forwarded.add(ticket)
        peer.free[pending.service] = peer.free.get(pending.service, 0) - 1
        self.core.counters["forwarded"] += 1
        if FORWARD_WITH_NAME in peer.understands:
            # F15: the client's ids and what is left of its deadline travel with it.
            ids = pending.ids
            remaining_ms = max(0, int((pending.deadline - self.core.clock) * 1000))
            forward = Forward(
                ticket,
                pending.service,
                self.core.identity,
                pending.body,
                caller=pending.caller,
                client_id=pending.key[0].decode("utf-8", "replace") if ids else "",
                request_id=pending.request_id if ids else b"",
                deadline_ms=remaining_ms,
            )
        else:  # a peer of an older version: FORWARD, or FORWARDAS with a CURVE caller
            forward = Forward(
                ticket, pending.service, self.core.identity, pending.body, caller=pending.caller
            )
        out.append(Send(Channel.LINK, peer.broker_id.encode(), forward))

    def send_back(self, pending: Pending, out: list[Effect]) -> bool:
        """F15: forward ``pending`` to the peer that held it when that peer was lost, if it is
        usable again and offers the service (its slots do not matter: it joins the request
        to the run it may still be doing, or answers from its cache). True if sent."""
        peer = self.family.peers.get(pending.prefer or "")
        if peer is None or not peer.usable() or not peer.offers(pending.service):
            return False
        self.forward_to(peer, pending, out)
        return True

    def drain_to_peers(self, now: float, out: list[Effect]) -> None:
        """F9: requests waiting here go to peers whose tables now show free slots.

        Requests forwarded to us stay (F6: never forwarded again) without holding up the
        ones behind them; the first request no peer can take ends the pass, in order.
        """
        if self.core.state is not BrokerState.ACTIVE:
            return
        ledger = self.ledger
        offers = ledger.offers
        for service in ledger.queued_services():
            if not any(p.usable() and p.offers(service) for p in self.family.peers.values()):
                continue
            kept: list[Pending] = []
            while (pending := ledger.next_waiting(service)) is not None:
                if pending.origin is not None:
                    kept.append(pending)
                    continue
                if pending.prefer is not None:
                    if now < pending.prefer_until:  # F15: its own peer, or it keeps waiting
                        if not self.send_back(pending, out):
                            kept.append(pending)
                        continue
                    pending.prefer = None
                peer = self.pick_peer(service, free=True)
                if peer is None and not offers(service):
                    peer = self.pick_peer(service, free=False)
                if peer is None:
                    kept.append(pending)
                    break
                self.forward_to(peer, pending, out)
            ledger.put_back(service, kept)

    def orphaned(self, services: Sequence[str], now: float, out: list[Effect]) -> None:
        """F7, F9: the last local worker of ``services`` is gone. What peers forwarded to us
        and waits for one goes back to its origin (404, so it routes it again, F8); what our
        own clients asked goes to a peer that offers the service."""
        identity = self.core.identity
        for service in services:
            for pending in list(self.ledger.forwarded_waiting(service)):
                why = f"no worker for {service!r} on {identity}"
                self.dispatch.fail(pending, 404, why, out)
        self.drain_to_peers(now, out)

    def forward_in(
        self, peer: Peer, routing_id: bytes, msg: Forward, now: float, out: list[Effect]
    ) -> None:
        """F7: a peer forwards us a request; we run it here, or say why not at once."""
        core = self.core
        if core.state is not BrokerState.ACTIVE:
            why = f"broker {core.identity} is {core.state.value}"
            failure = ClientReply.failure(msg.service, b"", 503, why)
            out.append(Send(Channel.PEER, routing_id, ForwardReply(msg.ticket, 503, failure.body)))
            return
        if msg.caller and not may(
            allowed(core.network.clients, msg.caller, core.wall), msg.service
        ):
            # The client's key, judged here by the same rule as at its own broker (§5.4, T1-T4).
            why = f"the caller's CURVE key may not call {msg.service!r}"
            failure = ClientReply.failure(msg.service, b"", 403, why)
            out.append(Send(Channel.PEER, routing_id, ForwardReply(msg.ticket, 403, failure.body)))
            details = {"peer": peer.broker_id, "key": msg.caller, "service": msg.service}
            out.append(Log("warning", "request_refused", details))
            return
        limit = float("inf")
        if msg.deadline_ms is not None:
            if msg.deadline_ms == 0:
                # F15: the client's deadline passed on the way; 504, so the origin does not
                # route it again (a 503 would, F8).
                why = f"the request's deadline passed before it reached {core.identity}"
                self._refuse(routing_id, msg, 504, why, out)
                return
            limit = now + msg.deadline_ms / 1000
        deadline = min(now + core.timeout_s, limit)
        dispatch = self.dispatch
        if msg.client_id:
            # F15, R10 across brokers: the client's own ids find its request here however it
            # came (directly, or forwarded by any peer), running or answered.
            key = (msg.client_id.encode(), msg.request_id)
            cached = self.ledger.cached(key, now)
            if cached is not None:
                core.counters["requests"] += 1  # taken on and answered (docs/management.md)
                core.counters["cache_hits"] += 1
                core.metrics.reply(cached.status)
                answer = ForwardReply(msg.ticket, cached.status, cached.body)
                out.append(Send(Channel.PEER, routing_id, answer))
                return
            live = self.ledger.joinable(key)
            if live is not None and live.ids:
                core.counters["requests"] += 1  # answered with the one it joined
                core.counters["duplicates_joined"] += 1
                live.join(routing_id, msg.ticket)
                # The timer finds it moved (R9).
                self.ledger.reschedule(live, max(live.deadline, deadline))
                if live.origin is not None:
                    live.limit = max(live.limit, limit)
                return
        else:
            key = (b"\x00" + peer.broker_id.encode(), msg.ticket)
        core.counters["forwards_served"] += 1
        core.counters["requests"] += 1  # one definition: docs/management.md "Counters"
        pending = Pending(
            core.next_seq(),
            routing_id,
            key,
            msg.service,
            msg.request_id,
            msg.body,
            deadline,
            origin=msg.ticket,
            started=now,
            caller=msg.caller,
            ids=bool(msg.client_id),
            via=peer.broker_id,
            limit=limit,
        )
        dispatch.take(pending, now, out)

    def _refuse(
        self, routing_id: bytes, msg: Forward, status: int, why: str, out: list[Effect]
    ) -> None:
        """FORWARDREPLY ``status`` at once, with the broker's JSON body (§3.3); like the 503 of
        a broker that is not active, a request refused before it is taken (not counted)."""
        failure = ClientReply.failure(msg.service, msg.request_id, status, why)
        out.append(Send(Channel.PEER, routing_id, ForwardReply(msg.ticket, status, failure.body)))

    def reply_in(self, peer: Peer, msg: ForwardReply, now: float, out: list[Effect]) -> None:
        dispatch = self.dispatch
        ledger = self.ledger
        pending = ledger.running(msg.ticket)
        if pending is None or pending.peer != peer.broker_id:
            self.core.counters["dropped"] += 1  # unknown ticket: dropped silently (§5.4)
            return
        ledger.settle(msg.ticket)
        peer.forwarded.discard(msg.ticket)
        if msg.status in (404, 503) and not pending.done:
            # F8: it could not take it after all. Count its slots as none until its next table.
            peer.free[pending.service] = 0
            if msg.status == 404:
                peer.table.pop(pending.service, None)
            why = f"peer {peer.broker_id} refused"
            if pending.deadline <= now:  # F15: its deadline is spent: not routed again
                dispatch.fail(pending, msg.status, f"{why} at the request's deadline", out)
            else:
                dispatch.route_again(pending, now, out, msg.status, why)
            return
        service = pending.service
        peer.free[service] = peer.free.get(service, 0) + 1
        reply = ClientReply(
            service=service, request_id=pending.request_id, status=msg.status, body=msg.body
        )
        dispatch.finish(pending, reply, out, now)
        if ledger.waiting_count(service):
            # F9: the answer is the peer's credit: its slot is free now, so what waits here
            # goes at once, not at its next table (no request waits for a periodic message).
            self.drain_to_peers(now, out)

    def partial_in(self, peer: Peer, msg: ForwardPartial, now: float, out: list[Effect]) -> None:
        ledger = self.ledger
        pending = ledger.running(msg.ticket)
        if pending is None or pending.peer != peer.broker_id:
            self.core.counters["dropped"] += 1
            return
        ledger.reschedule(pending, now + self.core.timeout_s)
        self.dispatch.relay_partial(pending, msg.body, out)
