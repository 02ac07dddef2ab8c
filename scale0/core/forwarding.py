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
from scale0.core.effects import Channel, Effect, Send
from scale0.core.peers import Peer
from scale0.core.ports import DispatchPort, FamilyPort
from scale0.core.requests import Pending
from scale0.wire.client import ClientReply
from scale0.wire.peer import BrokerState, Forward, ForwardPartial, ForwardReply

__all__ = ["Forwarding"]


class Forwarding:
    """Requests this broker forwards to peers, and those peers forward to it."""

    dispatch: DispatchPort
    family: FamilyPort

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
        pending.ticket = ticket
        pending.peer = peer.broker_id
        pending.attempt += 1
        peer.forwarded.add(ticket)
        peer.free[pending.service] = peer.free.get(pending.service, 0) - 1
        self.dispatch.inflight[ticket] = pending
        self.core.counters["forwarded"] += 1
        forward = Forward(ticket, pending.service, self.core.identity, pending.body)
        out.append(Send(Channel.LINK, peer.broker_id.encode(), forward))

    def drain_to_peers(self, now: float, out: list[Effect]) -> None:
        """F9: requests waiting here go to peers whose tables now show free slots.

        Requests forwarded to us stay (F6: never forwarded again) without holding up the
        ones behind them; the first request no peer can take ends the pass, in order.
        """
        if self.core.state is not BrokerState.ACTIVE:
            return
        waiting = self.dispatch.waiting
        offers = self.dispatch.pool.offers
        for service in waiting.queued():
            if not any(p.usable() and p.offers(service) for p in self.family.peers.values()):
                continue
            kept: list[Pending] = []
            while (pending := waiting.pop(service)) is not None:
                if pending.origin is not None:
                    kept.append(pending)
                    continue
                peer = self.pick_peer(service, free=True)
                if peer is None and not offers(service):
                    peer = self.pick_peer(service, free=False)
                if peer is None:
                    kept.append(pending)
                    break
                self.forward_to(peer, pending, out)
            waiting.put_back(service, kept)

    def orphaned(self, services: Sequence[str], now: float, out: list[Effect]) -> None:
        """F7, F9: the last local worker of ``services`` is gone. What peers forwarded to us
        and waits for one goes back to its origin (404, so it routes it again, F8); what our
        own clients asked goes to a peer that offers the service."""
        identity = self.core.identity
        for service in services:
            for pending in list(self.dispatch.waiting.forwarded_to_us(service)):
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
        core.counters["forwards_served"] += 1
        core.counters["requests"] += 1  # one definition: docs/management.md "Counters"
        pending = Pending(
            core.next_seq(),
            routing_id,
            (b"\x00" + peer.broker_id.encode(), msg.ticket),
            msg.service,
            b"",
            msg.body,
            now + core.timeout_s,
            origin=msg.ticket,
            started=now,
        )
        self.dispatch.take(pending, now, out)

    def reply_in(self, peer: Peer, msg: ForwardReply, now: float, out: list[Effect]) -> None:
        dispatch = self.dispatch
        pending = dispatch.inflight.get(msg.ticket)
        if pending is None or pending.peer != peer.broker_id:
            self.core.counters["dropped"] += 1  # unknown ticket: dropped silently (§5.4)
            return
        del dispatch.inflight[msg.ticket]
        peer.forwarded.discard(msg.ticket)
        if msg.status in (404, 503) and not pending.done:
            # F8: it could not take it after all. Count its slots as none until its next table.
            peer.free[pending.service] = 0
            if msg.status == 404:
                peer.table.pop(pending.service, None)
            why = f"peer {peer.broker_id} refused"
            dispatch.route_again(pending, now, out, msg.status, why)
            return
        service = pending.service
        peer.free[service] = peer.free.get(service, 0) + 1
        reply = ClientReply(
            service=service, request_id=pending.request_id, status=msg.status, body=msg.body
        )
        dispatch.finish(pending, reply, out, now)
        if dispatch.waiting.count(service):
            # F9: the answer is the peer's credit: its slot is free now, so what waits here
            # goes at once, not at its next table (no request waits for a periodic message).
            self.drain_to_peers(now, out)

    def partial_in(self, peer: Peer, msg: ForwardPartial, now: float, out: list[Effect]) -> None:
        pending = self.dispatch.inflight.get(msg.ticket)
        if pending is None or pending.peer != peer.broker_id:
            self.core.counters["dropped"] += 1
            return
        pending.deadline = now + self.core.timeout_s
        self.dispatch.relay_partial(pending, msg.body, out)
