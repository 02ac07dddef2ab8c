"""Majordomo clients and workers (docs/protocol.md §10): 7/MDP (MDPC01, MDPW01), 18/MDP (MDP*02).

An adapter at the edge of the core. What a Majordomo sender says becomes what an S0P sender
would have said (a REQUEST, a READY with capacity 1, a REPLY with status 200, a HEARTBEAT,
a DISCONNECT), handled by the same rules; what the rules answer is rewritten, at the end of the
event, into the Majordomo message of the receiver's version (:meth:`Majordomo.translate`),
except the two messages of every request, the worker's REQUEST and the client's final reply,
which the rules build in that form at once (:meth:`Majordomo.worker_request`,
:meth:`Majordomo.client_reply`, through MajordomoPort: the hot path, docs/performance.md). So a
Majordomo client reaches S0P and Majordomo workers, here or on a peer, and an S0P client reaches
Majordomo workers, with one copy of the routing rules.

 D1  Majordomo senders have no CHECKCONFIG: their first valid message opens their session
     (client_id "<broker>.<routing id>"); a broker that is not active refuses a worker with
     DISCONNECT and drops a client's request (a Majordomo client has no error command: it
     times out and retries as its library does).
     Majordomo has no request id: each request is new (no R10 join), so its answer is not
     kept in the reply cache (no retry could ask for it).
 D2  A Majordomo worker serves its one service with capacity 1 and heartbeats at
     default_heartbeat_interval_ms; liveness applies as for S0P workers (R8). Its replies carry
     no status: they are 200.
 D3  A Majordomo client gets every answer as a reply (MDPC01) or FINAL (MDPC02) on the service
     it asked; a broker-made error is that reply with the one-frame JSON error body (§3.3).
     MDPC02 clients get PARTIALs as they come; an MDPC01 client gets the PARTIAL bodies, in
     order, ahead of the final body in its one reply.
 D4  What a Majordomo peer cannot be told is not sent: no FORCENEGOTIATE (it has no config), no
     DISCONNECTERROR to a client; a worker gets DISCONNECT of its version instead of
     DISCONNECTERROR or S0P DISCONNECT.
"""

from __future__ import annotations

from typing import NamedTuple

from scale0.core.context import Core
from scale0.core.effects import Channel, Effect, Send
from scale0.core.ports import DispatchPort, FamilyPort, SessionsPort
from scale0.wire.client import ClientPartial, ClientReply, Disconnect, DisconnectError, Heartbeat
from scale0.wire.frames import Message
from scale0.wire.mdp import (
    MDP_SIGNATURES,
    MDPC01,
    MdpClientPartial,
    MdpClientReply,
    MdpClientRequest,
    MdpWorkerDisconnect,
    MdpWorkerHeartbeat,
    MdpWorkerPartial,
    MdpWorkerReady,
    MdpWorkerReply,
    MdpWorkerRequest,
)
from scale0.wire.peer import BrokerState
from scale0.wire.worker import Ready, WorkerPartial, WorkerRequest

__all__ = ["Majordomo"]


class Reading(NamedTuple):
    """How one Majordomo peer frames its messages: its signature, whether frame 0 is the empty
    delimiter (18/MDP's text has none), and majortomo's client command numbers (§10)."""

    protocol: bytes
    delimited: bool = True
    majortomo: bool = False


class Majordomo:
    """Which connections speak Majordomo (and which version), and the rewriting of answers."""

    dispatch: DispatchPort
    family: FamilyPort
    sessions: SessionsPort

    def __init__(self, core: Core) -> None:
        self.core = core
        #: (channel, routing id) -> the Majordomo signature it speaks. Kept past its session
        #: while a request of its is still answered (a client is silent while it waits).
        self.speaks: dict[tuple[Channel, bytes], Reading] = {}
        self._held: dict[tuple[bytes, bytes], list[bytes]] = {}  # MDPC01 PARTIALs (D3)
        self._ids = 0

    # ---- what Majordomo senders say --------------------------------------------------------

    def _open(
        self, channel: Channel, routing_id: bytes, reading: Reading, now: float, out: list[Effect]
    ) -> bool:
        """D1: the sender's session, opened by its first valid message; False if refused."""
        core = self.core
        speaks = self.speaks
        new = speaks.get((channel, routing_id)) != reading
        speaks[channel, routing_id] = reading
        if core.state is not BrokerState.ACTIVE or self.sessions.full(channel, routing_id):
            if channel is Channel.BACKEND:  # not active, or past max_sessions (R20)
                bye = MdpWorkerDisconnect(protocol=reading.protocol, delimited=reading.delimited)
                out.append(Send(channel, routing_id, bye))
                self.sessions.forget(channel, routing_id, now, out, "not_active")
            else:
                core.counters["dropped"] += 1
            return False
        self.sessions.adopt(channel, routing_id, now)
        if new:  # the lane passes an S0P HEARTBEAT from it now (it would stop speaking MDP),
            # and answers it in this reading
            self.sessions.remirror(channel, routing_id)
        return True

    def client_request(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: MdpClientRequest,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        reading = Reading(msg.protocol, msg.delimited, msg.majortomo)
        self.request(routing_id, reading, msg.service, msg.body, now, out)

    def request(
        self,
        routing_id: bytes,
        reading: Reading,
        service: str,
        body: tuple[bytes, ...],
        now: float,
        out: list[Effect],
    ) -> None:
        """A Majordomo client's REQUEST, given its fields: the one copy for the typed path and
        the raw-frame one (Broker.handle_mdp_request)."""
        if not self._open(Channel.FRONTEND, routing_id, reading, now, out):
            return
        self._ids += 1  # Majordomo has no request id: each request is new (no R10 join)
        request_id = b"mdp.%d" % self._ids
        self.dispatch.client_request(routing_id, service, request_id, body, now, out)

    def worker_ready(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: MdpWorkerReady,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        if not self._open(channel, routing_id, Reading(msg.protocol, msg.delimited), now, out):
            return
        network = self.core.network
        ready = Ready(
            services=(msg.service,),
            heartbeat=True,
            hbeatinterval_ms=network.default_heartbeat_interval_ms,
            time=wall,
            config_version=network.config_version,
            capacity=1,
        )
        self.dispatch.ready(channel, routing_id, ready, now, wall, out)

    def worker_reply(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: MdpWorkerReply,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.dispatch.worker_reply(routing_id, msg.ticket, 200, msg.body, now, out)

    def worker_partial(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: MdpWorkerPartial,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        partial = WorkerPartial(ticket=msg.ticket, body=msg.body)
        self.dispatch.worker_partial(channel, routing_id, partial, now, wall, out)

    def worker_heartbeat(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: MdpWorkerHeartbeat,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        if routing_id in self.sessions.workers:
            self.sessions.seen(channel, routing_id, now)
            return
        # A heartbeat from a worker we do not know (it was forgotten): tell it to start over.
        bye = MdpWorkerDisconnect(protocol=msg.protocol, delimited=msg.delimited)
        out.append(Send(channel, routing_id, bye))

    def worker_disconnect(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: MdpWorkerDisconnect,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.sessions.forget(channel, routing_id, now, out, "disconnect")
        self.speaks.pop((channel, routing_id), None)

    # ---- what they are told (D3, D4) -------------------------------------------------------

    def translate(self, out: list[Effect]) -> None:
        """Rewrite, in place, each Send to a Majordomo peer into its Majordomo form (or drop
        it). Called by the façade at the end of every event while any peer speaks Majordomo.

        The two messages of every request are built in Majordomo form where they are made
        (:meth:`worker_request`, :meth:`client_reply`), so on the hot path this is one look
        over ``out`` that finds nothing to rewrite and allocates nothing."""
        speaks = self.speaks
        for index, effect in enumerate(out):
            if (
                type(effect) is Send
                and (effect.channel, effect.routing_id) in speaks
                and effect.message.protocol not in MDP_SIGNATURES
            ):
                self._translate_from(out, index)
                return

    def _translate_from(self, out: list[Effect], start: int) -> None:
        speaks = self.speaks
        kept: list[Effect] = out[:start]
        for effect in out[start:]:
            if type(effect) is Send:
                reading = speaks.get((effect.channel, effect.routing_id))
                if reading is not None:
                    message = self._rewrite(
                        effect.channel, effect.routing_id, effect.message, reading
                    )
                    if message is not None:
                        kept.append(Send(effect.channel, effect.routing_id, message))
                    continue
            kept.append(effect)
        out[:] = kept

    def worker_request(
        self, routing_id: bytes, ticket: bytes, body: tuple[bytes, ...]
    ) -> MdpWorkerRequest | None:
        """The REQUEST to worker ``routing_id`` in its Majordomo form, or None if it speaks S0P
        (Dispatch.dispatch_to builds it where it is made: no rewrite at the end of the event)."""
        reading = self.speaks.get((Channel.BACKEND, routing_id))
        if reading is None:
            return None
        return MdpWorkerRequest(ticket, body, protocol=reading[0], delimited=reading[1])

    def client_reply(self, routing_id: bytes, reply: ClientReply) -> MdpClientReply | None:
        """The final answer to client ``routing_id`` in its Majordomo form, or None if it speaks
        S0P (Dispatch.finish builds it where it is made)."""
        reading = self.speaks.get((Channel.FRONTEND, routing_id))
        if reading is None:
            return None
        return self._client_reply(routing_id, reply, reading)

    def _client_reply(
        self, routing_id: bytes, reply: ClientReply, reading: Reading
    ) -> MdpClientReply:
        body = reply.body
        if reply.status != 200 and reply.service.startswith("mmi."):
            body = (b"%d" % reply.status,)  # the MMI convention (8/MMI): a bare code
        if self._held:
            held = self._held.pop((routing_id, reply.request_id), None)
            if held is not None:
                body = (*held, *body)
        protocol, delimited, majortomo = reading
        return MdpClientReply(
            reply.service, body, protocol=protocol, delimited=delimited, majortomo=majortomo
        )

    def _rewrite(
        self, channel: Channel, routing_id: bytes, message: Message, reading: Reading
    ) -> Message | None:
        if message.protocol in MDP_SIGNATURES:
            return message  # already Majordomo (this room's own DISCONNECT, a built answer)
        protocol, delimited, majortomo = reading
        if channel is Channel.BACKEND:
            if isinstance(message, WorkerRequest):
                body = message.body
                return MdpWorkerRequest(
                    message.ticket, body, protocol=protocol, delimited=delimited
                )
            if isinstance(message, Heartbeat):
                return MdpWorkerHeartbeat(protocol=protocol, delimited=delimited)
            if isinstance(message, (DisconnectError, Disconnect)):
                return MdpWorkerDisconnect(protocol=protocol, delimited=delimited)
            return None  # FORCENEGOTIATE, CONFIG...: nothing a Majordomo worker knows
        if isinstance(message, ClientReply):
            return self._client_reply(routing_id, message, reading)
        if isinstance(message, ClientPartial):
            if protocol == MDPC01:  # 7/MDP has no partial replies: they go with the final one
                key = (routing_id, message.request_id)
                self._held.setdefault(key, []).extend(message.body)
                return None
            return MdpClientPartial(
                message.service, message.body, delimited=delimited, majortomo=majortomo
            )
        return None  # DISCONNECTERROR, FORCENEGOTIATE, HEARTBEAT...: no such Majordomo command

    def sweep(self) -> None:
        """Forget who spoke Majordomo once its session is gone and nothing of its is answered."""
        sessions = {Channel.FRONTEND: self.sessions.clients, Channel.BACKEND: self.sessions.workers}
        for key in [k for k in self.speaks if k[1] not in sessions[k[0]]]:
            if key[0] is Channel.BACKEND or not self.dispatch.client_busy(key[1]):
                del self.speaks[key]
        live = {key[1] for key in self.speaks if key[0] is Channel.FRONTEND}
        for held in [k for k in self._held if k[0] not in live]:
            del self._held[held]
