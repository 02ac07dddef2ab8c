"""The family: links to the other brokers, HELLO, heartbeat tables, forwarding (F1-F9, F12, F13).

In a gossip family (``family_topology: gossip``) liveness and tables are scale0/core/gossip.py's
(G1-G12): links still open with HELLO, but carry no HEARTBEAT and no TABLE.

Each other member is a :class:`~scale0.core.peers.Peer`, whose link state moves by the table in
scale0/core/states.py. Messages from peers arrive on two channels: our peer ROUTER
(``Channel.PEER``: what peers send on their links to us) and our own links
(``Channel.LINK``: what peers answer on the links we opened). Each channel has its own
{message type: handler} table, so adding a peer message is one entry, not another ``elif``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

from scale0.config.model import NetworkConfig
from scale0.core.context import PROTOCOL, Core
from scale0.core.effects import Channel, Close, Connect, Effect, Log, Send
from scale0.core.gossip import Gossip
from scale0.core.peers import LocalTable, Peer
from scale0.core.ports import (
    DispatchPort,
    ForwardingPort,
    LedgerPort,
    ReplicationPort,
    SessionsPort,
)
from scale0.core.replica import Plan
from scale0.core.requests import Pending
from scale0.core.states import PeerInput, PeerLink
from scale0.core.timers import Periodic
from scale0.wire.client import (
    CheckConfig,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
)
from scale0.wire.frames import SIG_BROKER, Message
from scale0.wire.gossip import Ack, MemberStatus, Ping, PingReq
from scale0.wire.peer import (
    FORWARD_WITH_NAME,
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

__all__ = ["TABLE_COMMIT_S", "Family"]

#: Worker changes are gathered this long into one table version before peers hear of them.
TABLE_COMMIT_S = 0.05
#: The peer commands beyond the brief's that this broker decodes, said in every HELLO (§5.1).
UNDERSTANDS = frozenset({FORWARD_WITH_NAME})

M = TypeVar("M", bound=Message)
#: A message from a peer that said HELLO: (peer, its routing id here, message, now, wall, out).
PeerHandler = Callable[[Peer, bytes, Any, float, float, list[Effect]], None]
#: An answer on our own link to a peer: (peer, message, now, wall, out).
LinkHandler = Callable[[Peer, Any, float, float, list[Effect]], None]
#: Answers a refused HELLO: (routing id, the DISCONNECTERROR 401, now, out).
Refuse = Callable[[bytes, DisconnectError, float, list[Effect]], None]


class Family:
    """What this broker knows of the other members, and what it says to them."""

    dispatch: DispatchPort
    forwarding: ForwardingPort
    ledger: LedgerPort
    replication: ReplicationPort
    sessions: SessionsPort

    def __init__(self, core: Core, seeds: Sequence[str]) -> None:
        self.core = core
        #: How a HELLO refused with 401 is answered; the façade scores it by the connection's
        #: address (R22 of scale0/core/broker.py), alone it is just sent.
        self.refuse: Refuse = lambda routing_id, refusal, now, out: out.append(
            Send(Channel.PEER, routing_id, refusal)
        )
        self.peers: dict[str, Peer] = {}
        self.broker_of: dict[bytes, str] = {}  # our peer ROUTER's routing ids -> broker_id
        # A joining broker's seed links: link name -> endpoint; the ones that answered HELLO;
        # the broker_id each one's HELLO gave.
        self.seeds = {f"seed:{i}": endpoint for i, endpoint in enumerate(seeds)}
        self.seed_linked: set[str] = set()
        self.seed_names: dict[str, str] = {}
        self.table = LocalTable()
        self._table_armed = False
        self._on_peer: dict[type[Message], PeerHandler] = {}
        self._on_link: dict[type[Message], LinkHandler] = {}
        self._peer_handles(Forward, self._forward_in)
        self._peer_handles(PeerHeartbeat, self._peer_heartbeat)
        self._peer_handles(TableReq, self._table_req_in)
        self._peer_handles(
            Table, lambda peer, _, msg, now, wall, out: self._table_in(peer, msg, now, out)
        )
        self._peer_handles(CheckConfig, self._check_config_in)
        self._peer_handles(
            Disconnect, lambda peer, _, msg, now, wall, out: self._lost(peer, now, out)
        )
        self._link_handles(Table, self._link_table)
        self._link_handles(Config, self._link_config)
        self._link_handles(ConfigAck, self._link_config)
        self._link_handles(Disconnect, lambda peer, msg, now, wall, out: self._lost(peer, now, out))
        self.gossip = Gossip(core, self)
        self._peer_handles(Ping, self._ping_in)
        self._peer_handles(PingReq, self._ping_req_in)
        self._link_handles(Ack, self._ack_in)

    @property
    def gossiping(self) -> bool:
        """The running config says ``family_topology: gossip`` (G1-G12)."""
        return self.core.network.family_topology == "gossip"

    def _peer_handles(
        self, kind: type[M], handler: Callable[[Peer, bytes, M, float, float, list[Effect]], None]
    ) -> None:
        self._on_peer[kind] = cast(PeerHandler, handler)

    def _link_handles(
        self, kind: type[M], handler: Callable[[Peer, M, float, float, list[Effect]], None]
    ) -> None:
        self._on_link[kind] = cast(LinkHandler, handler)

    # ---- start, links and HELLO (F1, F2, F3, F12, F13) -------------------------------------

    def connect_seeds(self, out: list[Effect]) -> None:
        """F1: a joining broker links to its seeds, to fetch the family's config."""
        if self.core.state is BrokerState.JOINING:
            out.extend(Connect(link, endpoint) for link, endpoint in self.seeds.items())

    def plan_links(self, network: NetworkConfig, plan: Plan, out: list[Effect]) -> None:
        """Perform ``plan``'s links (K5): one per other member of ``network`` (F1); refresh how
        each peer's table reaches us from the config's links."""
        wants: dict[str, tuple[bool, TableMode]] = {}
        for link in network.peers or ():
            if link.target == self.core.identity:
                wants[link.source] = (True, TableMode(link.table_mode))
        for broker_id in plan.close:
            peer = self.peers.pop(broker_id, None)
            if peer is not None and peer.routing_id is not None:
                self.broker_of.pop(peer.routing_id, None)
            out.append(Close(broker_id))
            out.append(Log("info", "peer_removed", {"peer": broker_id}))
        for broker_id, endpoint in plan.connect.items():
            known = self.peers.get(broker_id)
            if known is not None and known.routing_id is not None:
                self.broker_of.pop(known.routing_id, None)
            self.peers[broker_id] = Peer(broker_id, endpoint, TableMode.PULL, False)
            out.append(Connect(broker_id, endpoint))
        gossiping = network.family_topology == "gossip"
        for broker_id, peer in self.peers.items():
            peer.pull, peer.wants = wants.get(broker_id, (not network.peers, TableMode.PULL))
            peer.gossip = gossiping
            if not gossiping:
                peer.member = MemberStatus.ALIVE  # back to a mesh: the link's state says all

    def joined(self, out: list[Effect]) -> None:
        """A joining broker's first config applied: its seed links are done with."""
        for link in self.seeds:
            # Say goodbye first: the seed then frees our broker_id for our real link (F2).
            out.append(Send(Channel.LINK, link.encode(), Disconnect(protocol=SIG_BROKER)))
            out.append(Close(link))
        self.seeds.clear()
        self.seed_linked.clear()

    def _endpoints(self) -> dict[str, str]:
        entry = self.core.entry
        if entry is None:
            return {}
        return {
            "frontend": entry.frontend,
            "backend": entry.backend,
            "peer": entry.peer,
            "config_pub": entry.config_pub,
        }

    def _hello(self, mode: TableMode) -> Hello:
        core = self.core
        return Hello(
            broker_id=core.identity,
            family=self.replication.replica.family or core.network.family,
            state=core.state,
            config_version=self.replication.replica.version,
            endpoints=self._endpoints(),
            table_mode=mode,
            understands=UNDERSTANDS,
        )

    def say_hello(self, now: float, wall: float, out: list[Effect]) -> None:
        """HELLO on every link not answered yet; HEARTBEAT on the others (F1, F13; not in a
        gossip family, G11)."""
        gossiping = self.gossiping
        for broker_id, peer in self.peers.items():
            if not peer.linked:
                mode = peer.wants if peer.pull else TableMode.PULL
                out.append(Send(Channel.LINK, broker_id.encode(), self._hello(mode)))
            elif not gossiping:
                out.append(Send(Channel.LINK, broker_id.encode(), self._heartbeat_message(wall)))
        if self.core.state is BrokerState.JOINING:
            check = self.replication.check_config_message()
            for seed in self.seeds:
                if seed in self.seed_linked:
                    out.append(Send(Channel.LINK, seed.encode(), check))
                else:
                    out.append(Send(Channel.LINK, seed.encode(), self._hello(TableMode.PULL)))

    def _heartbeat_message(self, wall: float) -> PeerHeartbeat:
        return PeerHeartbeat(
            broker_id=self.core.identity,
            time=wall,
            state=self.core.state,
            config_version=self.replication.replica.version,
            table_seq=self.table.seq,
        )

    def round(self, now: float, wall: float, out: list[Effect]) -> None:
        """Every interval: expire silent peers (F3), then HELLO or HEARTBEAT on every link.
        A gossip family: HELLO on links not answered, then one probe (G1, G11)."""
        if self.gossiping:
            self.say_hello(now, wall, out)
            self.gossip.period(now, wall, out)
            self.core.timers.push(now + self.core.interval_s, Periodic.PEERS)
            return
        limit = self.core.interval_s * self.core.network.liveness
        silent = [
            peer
            for peer in self.peers.values()
            if peer.link is not PeerLink.DOWN and now - peer.last_seen > limit
        ]
        # Every silent peer is down before what any of them held moves (F3): a request must
        # not be re-forwarded to a peer found silent in the same round, where it would wait in
        # a dead link and run when the network heals, after its client was answered.
        for peer in silent:
            self._peer_down(peer, now, out, PeerInput.SILENT, "silent", reroute=False)
        for peer in silent:
            self._route_forwarded_again(peer, now, out, sticky=True)
        self.say_hello(now, wall, out)
        self.core.timers.push(now + self.core.interval_s, Periodic.PEERS)

    def _heard(self, peer: Peer, now: float, out: list[Effect]) -> None:
        peer.last_seen = now
        # A member gossip holds dead is back only when gossip says so (G2): not by a message.
        if peer.step(PeerInput.HEARD) is PeerLink.DOWN and peer.member is not MemberStatus.DEAD:
            out.append(Log("info", "peer_up", {"peer": peer.broker_id}))

    def lane_peers(self) -> dict[bytes, bytes]:
        """The peers whose FORWARDs the C lane may take (phase 4a): routing id on our peer
        ROUTER -> broker id, for each peer that said HELLO on it and is not down, so that
        hearing it again changes nothing but its time (F3: the lane says when it heard it)."""
        return {
            peer.routing_id: peer.broker_id.encode()
            for peer in self.peers.values()
            if peer.routing_id is not None and peer.link is not PeerLink.DOWN
        }

    def lane_forward_peers(self) -> dict[bytes, tuple[bool, bool, dict[str, int]]]:
        """What the C lane must know to forward as ``Forwarding.pick_peer`` picks (phase 4b):
        per peer, in the order of ``peers`` (pick_peer's ties), whether it may be sent work,
        whether it understands FORWARDWITH (F15), and our estimate of its free slots per
        service it offers."""
        return {
            peer.broker_id.encode(): (
                peer.usable(),
                FORWARD_WITH_NAME in peer.understands,
                {service: peer.free.get(service, 0) for service in peer.table},
            )
            for peer in self.peers.values()
        }

    def lane_moved(self, deltas: Sequence[tuple[bytes, str, int]]) -> None:
        """The lane forwarded (-1) and took answers (+1) since it was last asked (phase 4b):
        our estimate of each peer's free slots moves as ``forward_to`` and ``reply_in`` move
        it."""
        for broker_id, service, delta in deltas:
            peer = self.peers.get(broker_id.decode("utf-8", "replace"))
            if peer is not None:
                peer.free[service] = peer.free.get(service, 0) + delta

    def lane_forwarded(self, pending: Pending) -> None:
        """A request the lane forwarded is the ledger's now: in flight at its peer (F3, F16)."""
        peer = self.peers.get(pending.peer or "")
        if peer is not None and pending.ticket is not None:
            peer.forwarded.add(pending.ticket)

    def heard_on_link(self, link: bytes, when: float) -> None:
        """The lane took a FORWARDREPLY on our link to ``link`` at ``when``: that peer is heard
        then (F3), as ``_link_message`` hears it."""
        self._heard_by_lane(self.peers.get(link.decode("utf-8", "replace")), when)

    def heard_elsewhere(self, routing_id: bytes, when: float) -> None:
        """The lane took a FORWARD from the link ``routing_id`` at ``when``: that peer is heard
        then (F3), as :meth:`_heard` hears it; a peer down since is left to its next word."""
        broker_id = self.broker_of.get(routing_id)
        self._heard_by_lane(self.peers.get(broker_id) if broker_id is not None else None, when)

    @staticmethod
    def _heard_by_lane(peer: Peer | None, when: float) -> None:
        """``peer`` heard at ``when`` by what the lane took: its time raised, as ``_heard``
        raises it (a peer down since is left to its next word: hearing it would log it up)."""
        if peer is not None and peer.link is not PeerLink.DOWN and when > peer.last_seen:
            peer.last_seen = when

    def _peer_down(
        self,
        peer: Peer,
        now: float,
        out: list[Effect],
        event: PeerInput,
        reason: str,
        *,
        reroute: bool = True,
    ) -> None:
        was = peer.step(event)
        peer.push_to = False
        if peer.routing_id is not None and event is not PeerInput.SILENT:
            # Silence is only a suspicion: the peer's link is still the same connection and it
            # does not know we dropped it, so it will not say HELLO again. Keep its routing id,
            # so that what it says next on that link counts (F3) instead of being ignored as
            # "before HELLO" (F2) for good. A restart (new HELLO) or DISCONNECT replaces it.
            self.broker_of.pop(peer.routing_id, None)
            peer.routing_id = None
        if self.gossiping:
            up = peer.member is not MemberStatus.DEAD  # G5: gossip's verdict, not the link's
            self.gossip.left(peer)
        else:
            up = was is not PeerLink.DOWN
        self.dispatch.services_left(peer.table, now)
        peer.forget_table()
        if up:
            self.core.counters["peers_lost"] += 1
            # A member gossip declares dead before we ever heard it (G12) has no silence to time.
            heard = math.isfinite(peer.last_seen)
            silent_ms = round((now - peer.last_seen) * 1000) if heard else None
            details = {"peer": peer.broker_id, "reason": reason, "silent_ms": silent_ms}
            out.append(Log("warning", "peer_lost", details))
        if reroute:
            self._route_forwarded_again(peer, now, out, sticky=event is PeerInput.SILENT)

    def _route_forwarded_again(
        self, peer: Peer, now: float, out: list[Effect], *, sticky: bool
    ) -> None:
        """F3: what ``peer`` (now down) held is routed again, or answered 504. F15: when it was
        only found silent (a suspicion, not a DISCONNECT or a restart), what it holds under the
        client's ids goes back to it alone for a while (it may still run it, and would join
        the resend), so a link that flaps does not run a request twice."""
        sticky = sticky and FORWARD_WITH_NAME in peer.understands
        self.ledger.adopt_peer(peer.broker_id)  # (what the lane forwarded there is ours now)
        core = self.core
        until = now + min(core.interval_s * core.network.liveness, core.timeout_s / 2)
        for ticket in sorted(peer.forwarded):
            pending = self.ledger.settle(ticket)
            if pending is not None:
                if sticky and pending.ids:
                    pending.prefer = peer.broker_id
                    pending.prefer_until = until
                    self.core.timers.push(until, pending.seq)  # then it may go anywhere
                self.dispatch.route_again(pending, now, out, 504, f"peer {peer.broker_id} lost")
        peer.forwarded.clear()

    def active_endpoint(self, channel: Channel) -> str | None:
        """The frontend or backend of an active peer we are linked to (the first by id)."""
        for broker_id in sorted(self.peers):
            if not self.peers[broker_id].usable():
                continue
            entry = self.core.member(broker_id)
            if entry is not None:
                return entry.frontend if channel is Channel.FRONTEND else entry.backend
        return None

    def not_accepting(self, protocol: bytes, channel: Channel) -> DisconnectError:
        """R3: 503, or (disabled, draining) 301 to an active peer's endpoint for this channel."""
        core = self.core
        state = core.state.value
        if core.state is BrokerState.DISABLED and channel in PROTOCOL:
            target = self.active_endpoint(channel)
            if target is not None:
                why = f"broker {core.identity} is {state}: go to {target}"
                return DisconnectError(301, why, endpoint=target, protocol=protocol)
        return DisconnectError(503, f"broker {core.identity} is {state}", protocol=protocol)

    def shutdown(self, out: list[Effect]) -> None:
        """R17: DISCONNECT on every link (peers' and seeds')."""
        for link in [*self.peers, *self.seeds]:
            out.append(Send(Channel.LINK, link.encode(), Disconnect(protocol=SIG_BROKER)))

    # ---- what peers say (F2, F3, F4, F12) --------------------------------------------------

    def received(
        self,
        channel: Channel,
        routing_id: bytes,
        message: Message,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        """A message on our peer ROUTER (``Channel.PEER``) or on one of our links (``LINK``)."""
        if channel is Channel.LINK:
            link = routing_id.decode("utf-8", "replace")
            if link in self.seeds:
                self._seed_message(link, message, now, wall, out)
                return
            peer = self.peers.get(link)
            if peer is not None:  # else a link we closed: its last messages are of no interest
                self._link_message(peer, message, now, wall, out)
            return
        if isinstance(message, Hello):
            self._hello_in(routing_id, message, now, wall, out)
            return
        broker_id = self.broker_of.get(routing_id)
        peer = self.peers.get(broker_id) if broker_id is not None else None
        if peer is None:
            self.core.counters["peer_ignored"] += 1  # F2: nothing counts before HELLO
            return
        claimed = getattr(message, "broker_id", peer.broker_id)
        if claimed != peer.broker_id:
            self.core.counters["peer_ignored"] += 1
            details = {"peer": peer.broker_id, "claimed": str(claimed)}
            out.append(Log("warning", "peer_spoof", details))
            return
        self._heard(peer, now, out)
        handler = self._on_peer.get(type(message))
        if handler is None:
            self.core.counters["peer_ignored"] += 1
            return
        handler(peer, routing_id, message, now, wall, out)

    def _hello_in(
        self, routing_id: bytes, msg: Hello, now: float, wall: float, out: list[Effect]
    ) -> None:
        """F2: a peer's link says HELLO on our ROUTER."""
        core = self.core
        if core.state is BrokerState.JOINING:
            return  # nothing to check it against yet; it says HELLO again every interval
        family = core.network.family
        peer = self.peers.get(msg.broker_id)
        if msg.family != family or peer is None:
            why = (
                f"family {msg.family!r} is not {family!r}"
                if msg.family != family
                else f"{msg.broker_id!r} is not a broker of family {family!r}"
            )
            self.refuse(routing_id, DisconnectError(401, why, protocol=SIG_BROKER), now, out)
            out.append(Log("warning", "peer_refused", {"peer": msg.broker_id, "reason": why}))
            return
        key = core.peer_keys.get(routing_id)  # CURVE (docs/protocol.md §2.5): the link's key
        entry = core.member(msg.broker_id)
        if key is not None and entry is not None and entry.curve_public_key not in (None, key):
            why = f"this link's CURVE key is not the one of {msg.broker_id!r}"
            self.refuse(routing_id, DisconnectError(401, why, protocol=SIG_BROKER), now, out)
            out.append(Log("warning", "peer_refused", {"peer": msg.broker_id, "reason": why}))
            return
        if peer.routing_id is not None and peer.routing_id != routing_id:
            if now - peer.last_seen < core.interval_s:
                why = f"broker_id {msg.broker_id!r} is in use by a live link"
                out.append(
                    Send(Channel.PEER, routing_id, DisconnectError(409, why, protocol=SIG_BROKER))
                )
                return
            # A new link for a known broker: it restarted. What it held for us is gone.
            self.broker_of.pop(peer.routing_id, None)
            self._peer_down(peer, now, out, PeerInput.LOST, "restarted")
        peer.routing_id = routing_id
        self.broker_of[routing_id] = peer.broker_id
        peer.state = msg.state
        peer.config_version = msg.config_version
        peer.understands = msg.understands  # a restart may be a downgrade: replaced, not merged
        peer.push_to = msg.table_mode is TableMode.PUSH and not self.gossiping
        self._heard(peer, now, out)
        mode = peer.wants if peer.pull else TableMode.PULL
        out.append(Send(Channel.PEER, routing_id, self._hello(mode)))
        if peer.push_to:
            self._send_table(peer, None, out)
        if not peer.linked:  # say HELLO on our link now rather than at the next interval
            out.append(Send(Channel.LINK, peer.broker_id.encode(), self._hello(mode)))
        self.replication.newer_config(peer, msg.config_version, out)

    def _link_message(
        self, peer: Peer, message: Message, now: float, wall: float, out: list[Effect]
    ) -> None:
        """What comes back on our own link to ``peer``: answers to what we sent on it."""
        if isinstance(message, ForwardReply):
            self._heard(peer, now, out)
            self.forwarding.reply_in(peer, message, now, out)
        elif isinstance(message, ForwardPartial):
            self._heard(peer, now, out)
            self.forwarding.partial_in(peer, message, now, out)
        elif isinstance(message, Hello):
            self._link_hello(peer, message, now, wall, out)
        elif isinstance(message, DisconnectError):
            details = {"peer": peer.broker_id, "code": message.code, "reason": message.message}
            out.append(Log("warning", "peer_refused_us", details))
            peer.step(PeerInput.REFUSED)
        elif not peer.linked:
            self.core.counters["peer_ignored"] += 1
        else:
            self._heard(peer, now, out)
            handler = self._on_link.get(type(message))
            if handler is None:
                self.core.counters["peer_ignored"] += 1
                return
            handler(peer, message, now, wall, out)

    def _link_hello(
        self, peer: Peer, message: Hello, now: float, wall: float, out: list[Effect]
    ) -> None:
        """F1: the peer answered our HELLO: the link is up, and we may pull its table (F5)."""
        if message.broker_id != peer.broker_id or message.family != self.core.network.family:
            details = {"peer": peer.broker_id, "said": message.broker_id}
            out.append(Log("warning", "peer_wrong_hello", details))
            return
        self._heard(peer, now, out)
        peer.state = message.state
        peer.config_version = message.config_version
        peer.understands = message.understands
        if peer.step(PeerInput.HELLO_ANSWERED) is not PeerLink.LINKED:
            out.append(Log("info", "peer_linked", {"peer": peer.broker_id}))
            if self.gossiping:
                self.gossip.join(peer, wall, out)
            elif peer.pull and peer.wants is TableMode.PULL:
                self._send_table_req(peer, full=True, out=out)
        self.replication.newer_config(peer, message.config_version, out)

    def _link_table(
        self, peer: Peer, msg: Table, now: float, wall: float, out: list[Effect]
    ) -> None:
        if msg.broker_id == peer.broker_id:
            self._table_in(peer, msg, now, out)

    def _link_config(
        self, peer: Peer, msg: Config | ConfigAck, now: float, wall: float, out: list[Effect]
    ) -> None:
        self.replication.config_answer(peer.broker_id, msg, out, now, wall)

    def _lost(self, peer: Peer, now: float, out: list[Effect]) -> None:
        """F12: DISCONNECT from a peer, on its link or ours, marks it down at once."""
        self._peer_down(peer, now, out, PeerInput.LOST, "disconnect")

    def _forward_in(
        self,
        peer: Peer,
        routing_id: bytes,
        msg: Forward,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.forwarding.forward_in(peer, routing_id, msg, now, out)

    def _check_config_in(
        self,
        peer: Peer,
        routing_id: bytes,
        msg: CheckConfig,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.replication.peer_check_config(peer, routing_id, msg, out)

    def _seed_message(
        self, link: str, message: Message, now: float, wall: float, out: list[Effect]
    ) -> None:
        """A joining broker's seed links: HELLO, then CHECKCONFIG until a CONFIG applies."""
        if isinstance(message, Hello):
            self.seed_linked.add(link)
            self.seed_names[link] = message.broker_id
            if self.core.state is BrokerState.JOINING:
                check = self.replication.check_config_message()
                out.append(Send(Channel.LINK, link.encode(), check))
        elif isinstance(message, (Config, ConfigAck)):
            origin = self.seed_names.get(link, link)
            self.replication.config_answer(origin, message, out, now, wall)
        elif isinstance(message, DisconnectError):
            self.seed_linked.discard(link)
            details = {"seed": self.seeds[link], "code": message.code, "reason": message.message}
            out.append(Log("warning", "seed_refused_us", details))

    def _peer_heartbeat(
        self,
        peer: Peer,
        routing_id: bytes,
        msg: PeerHeartbeat,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        if self._skewed(peer, routing_id, msg.time, now, wall, out):
            return
        peer.state = msg.state
        peer.config_version = msg.config_version
        if msg.table_seq < peer.table_seq:
            peer.forget_table()  # its table started again (it restarted): pull all of it
        # Pull mode: its HEARTBEAT says our copy is stale. (Push mode repairs gaps in _table_in.)
        pulling = peer.pull and peer.linked and peer.wants is TableMode.PULL
        if pulling and msg.table_seq > peer.table_seq:
            self._send_table_req(peer, full=False, out=out)
        self.replication.newer_config(peer, msg.config_version, out)

    def _skewed(
        self, peer: Peer, routing_id: bytes, time: float, now: float, wall: float, out: list[Effect]
    ) -> bool:
        """F4: a peer whose clock is off by more than max_clock_skew_s gets 412 and is lost."""
        limit = self.core.network.max_clock_skew_s
        skew = abs(time - wall)
        if skew > limit:
            why = f"clock skew {skew:.1f} s is over {limit} s"
            out.append(
                Send(Channel.PEER, routing_id, DisconnectError(412, why, protocol=SIG_BROKER))
            )
            self._peer_down(peer, now, out, PeerInput.LOST, "clock_skew")
            return True
        return False

    # ---- gossip (G1-G12, scale0/core/gossip.py) ------------------------------------------

    def _ping_in(
        self, peer: Peer, routing_id: bytes, msg: Ping, now: float, wall: float, out: list[Effect]
    ) -> None:
        if not self.gossiping or msg.target != self.core.identity:
            self.core.counters["peer_ignored"] += 1
            return
        if not self._skewed(peer, routing_id, msg.time, now, wall, out):
            self.gossip.ping_in(peer, routing_id, msg, now, wall, out)

    def _ping_req_in(
        self,
        peer: Peer,
        routing_id: bytes,
        msg: PingReq,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        if not self.gossiping:
            self.core.counters["peer_ignored"] += 1
            return
        if not self._skewed(peer, routing_id, msg.time, now, wall, out):
            self.gossip.ping_req_in(peer, routing_id, msg, now, wall, out)

    def _ack_in(self, peer: Peer, msg: Ack, now: float, wall: float, out: list[Effect]) -> None:
        if not self.gossiping:
            self.core.counters["peer_ignored"] += 1
            return
        self.gossip.ack_in(peer, msg, now, wall, out)

    def member_down(
        self, peer: Peer, now: float, out: list[Effect], reason: str, *, reroute: bool
    ) -> None:
        """G5: gossip declared ``peer`` dead: what F3 does for a silent peer."""
        self._peer_down(peer, now, out, PeerInput.SILENT, reason, reroute=reroute)

    def member_reroute(self, peer: Peer, now: float, out: list[Effect]) -> None:
        self._route_forwarded_again(peer, now, out, sticky=True)

    def member_back(self, peer: Peer, now: float, out: list[Effect]) -> None:
        out.append(Log("info", "peer_up", {"peer": peer.broker_id}))

    def services_in(
        self, peer: Peer, offered: tuple[tuple[str, int], ...], now: float, out: list[Effect]
    ) -> None:
        """G10: a member's alive row is its whole table; services it no longer offers left."""
        before = list(peer.table)
        peer.apply_services(offered, self._in_flight_at(peer))
        self.dispatch.services_left([s for s in before if s not in peer.table], now)
        self.forwarding.drain_to_peers(now, out)

    def config_version(self) -> int:
        return self.replication.replica.version

    def check_config(self, peer: Peer, out: list[Effect]) -> None:
        check = self.replication.check_config_message()
        out.append(Send(Channel.LINK, peer.broker_id.encode(), check))

    # ---- tables (F5, F9) -------------------------------------------------------------------

    def _send_table_req(self, peer: Peer, *, full: bool, out: list[Effect]) -> None:
        since = None if full or peer.table_seq == 0 else peer.table_seq
        request = TableReq(broker_id=self.core.identity, since_seq=since)
        out.append(Send(Channel.LINK, peer.broker_id.encode(), request))

    def _send_table(self, peer: Peer, since: int | None, out: list[Effect]) -> None:
        if peer.routing_id is None:
            return
        identity = self.core.identity
        delta = self.table.since(since) if since is not None else None
        slots = self._slots_for(peer)
        if delta is None:
            table = Table(identity, self.table.seq, True, self.table.full(), slots)
        else:
            table = Table(identity, self.table.seq, False, delta, slots)
        out.append(Send(Channel.PEER, peer.routing_id, table))

    def _slots_for(self, peer: Peer) -> tuple[tuple[str, int], ...]:
        """F16: per service offered here, how many of ``peer``'s forwards we would hold at once
        now: our workers' free slots, less what waits here, plus ``peer``'s requests we hold
        (waiting or running). Counted as the TABLE leaves, behind every FORWARDREPLY sent
        before it and after every FORWARD received before it, so the peer can subtract what
        it has in flight to us and hold an exact count (forwarding.py ``pick_peer``)."""
        ledger = self.ledger
        sessions = self.sessions.workers
        free: dict[str, int] = {}
        for worker in ledger.workers():
            if worker.routing_id not in sessions:
                continue
            spare = max(ledger.spare(worker), 0)
            for service in worker.services:
                free[service] = free.get(service, 0) + spare
        held = ledger.held_from(peer.broker_id)
        waiting = ledger.waiting_count
        return tuple(
            (service, slots + held.get(service, 0) - waiting(service))
            for service, slots in sorted(free.items())
        )

    def _table_req_in(
        self,
        peer: Peer,
        routing_id: bytes,
        msg: TableReq,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self._send_table(peer, msg.since_seq, out)

    def _table_in(self, peer: Peer, msg: Table, now: float, out: list[Effect]) -> None:
        if not peer.pull:
            self.core.counters["peer_ignored"] += 1  # no link in the config shares its table
            return
        if not msg.full and msg.table_seq > peer.table_seq + 1 and peer.wants is TableMode.PUSH:
            # A pushed delta skipped a version we never saw: ask for everything.
            self._send_table_req(peer, full=True, out=out)
        elif msg.full or msg.table_seq > peer.table_seq:  # else old news: rows unchanged
            before = list(peer.table)
            peer.apply_table(msg.table_seq, msg.full, msg.services)
            self.dispatch.services_left([s for s in before if s not in peer.table], now)
        if msg.slots is not None:
            # F16: its count of our slots as it sent this, less what we sent since (in flight).
            peer.apply_slots(dict(msg.slots), self._in_flight_at(peer))
        elif not msg.full and msg.table_seq <= peer.table_seq:
            return
        self.forwarding.drain_to_peers(now, out)

    def _in_flight_at(self, peer: Peer) -> dict[str, int]:
        """Our requests ``peer`` holds or has not received yet, by service (the lane's too)."""
        running = self.ledger.running
        held: dict[str, int] = self.ledger.lane_forwarded_to(peer.broker_id)
        for ticket in peer.forwarded:
            pending = running(ticket)
            if pending is not None:
                held[pending.service] = held.get(pending.service, 0) + 1
        return held

    def table_changed(self, services: Sequence[str], now: float) -> None:
        """Workers of ``services`` changed: peers hear of it in the next table version."""
        self.table.mark(services)
        if not self._table_armed:
            self._table_armed = True
            self.core.timers.push(now + TABLE_COMMIT_S, Periodic.TABLE)

    def commit_table(self, now: float, wall: float, out: list[Effect]) -> None:
        """F5: the changes gathered become one table version, pushed to who asked for push."""
        self._table_armed = False
        if not self.table.dirty:
            return
        rows: dict[str, list[TableWorker]] = {}
        offered: dict[str, int] = {}
        sessions = self.sessions.workers
        ledger = self.ledger
        for worker in ledger.workers():
            session = sessions.get(worker.routing_id)
            if session is None:
                continue
            for service in worker.services:
                offered[service] = offered.get(service, 0) + worker.capacity
            row = TableWorker(
                worker_id=session.client_id,
                capacity=max(ledger.spare(worker), 0),
                last_heartbeat=max(wall - (now - session.last_seen), 0.0),
            )
            for service in worker.services:
                rows.setdefault(service, []).append(row)
        delta = self.table.commit({s: tuple(r) for s, r in rows.items()})
        if self.gossiping:
            self.gossip.offered = tuple(sorted(offered.items()))  # G7: in our next row
            return
        if not delta:
            return
        identity, seq = self.core.identity, self.table.seq
        for peer in self.peers.values():
            if peer.push_to and peer.routing_id is not None and peer.link is not PeerLink.DOWN:
                table = Table(identity, seq, False, delta, self._slots_for(peer))  # F16
                out.append(Send(Channel.PEER, peer.routing_id, table))

    def services(self) -> Iterable[str]:
        """The services some usable peer offers."""
        return {s for p in self.peers.values() if p.usable() for s in p.table}
