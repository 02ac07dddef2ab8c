"""The broker state machine: negotiation, LRU routing by service, deadlines, retries, liveness.

Pure: ``Broker.handle(event, now, wall)`` returns effects; ``now`` is a monotonic clock for
timers and deadlines, ``wall`` is UNIX time for clock-skew checks. No sockets, no clock reads, no
randomness (the per-boot ``boot_id`` that prefixes tickets is passed in).

Rules (docs/protocol.md; tests/core/test_broker.py names a test after each):
 R1  A client or worker must CHECKCONFIG first; any other command from a sender with no
     negotiation on record gets FORCENEGOTIATE (and is not acted on).
 R2  CHECKCONFIG naming our config_version gets CONFIGACK, anything else gets CONFIG: the
     client view of the network config in the asked config_type, with its sha256; a
     ``signed`` one also gets the view's signature and the whole config's sha256 (never the
     whole config: docs/protocol.md §2.5).
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
     in flight: it is never executed a second time. The key is the client's (client_id,
     request_id), here and for a request a peer forwarded with those ids (F15).
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
     in flight here, and says Drained once no request is in flight at all. A draining broker
     is not enabled again (503), and a joining one that drains becomes disabled, not active,
     if its config comes.
 R20 Limits (docs/protocol.md §8.1): CHECKCONFIG (or a Majordomo sender's first message) that
     would open more than max_sessions sessions on its channel gets DISCONNECTERROR 503 (MDP:
     dropped, or DISCONNECT to a worker); a REQUEST from a client that already has
     max_requests_per_client unanswered here gets REPLY 429 at once and is not held; a
     frontend or backend connection that has no session negotiate_timeout_ms after it opened
     is hung up, and so is the oldest such connection whenever more than max_unnegotiated wait.
     A connection is negotiated once a message over it leaves its sender with a session.
 R21 A CHECKCONFIG from a sender whose session already holds the running config_version,
     less than one heartbeat interval after its previous CHECKCONFIG, is answered as ever and
     counts one error towards the sender's score (R13): a CHECKCONFIG flood ends in a ban
     (DISCONNECTERROR 429). A sender told FORCENEGOTIATE asks with an older version: not
     counted.
 R22 The peer port has limits too (docs/protocol.md §8.1): a peer connection that has carried
     no message from a routing id whose HELLO was accepted (F2; while joining, a HELLO of our
     family) negotiate_timeout_ms after it opened is hung up, and so is the oldest such one
     whenever more than max_unnegotiated wait (a pool apart from the frontend's and
     backend's). A HELLO refused with 401 and an undecodable message from a routing id with
     no accepted HELLO count one error against the connection's source address (R13's
     threshold, window and ban): the ban says DISCONNECTERROR 429 once, and until it ends
     that address's peer connections that have not negotiated are read for HELLO only (the
     rest dropped unread) and refusals are not answered.
     A member's accepted HELLO is never refused for its address, and its link, once heard,
     is never hung up or scored by address.
 R23 Idle beating (docs/protocol.md §3.4): a client's or worker's HEARTBEAT may promise with
     interval_ms that its next message comes within that many ms: its negotiated interval up
     to idle_heartbeat_interval_ms (any other value, or any value while that is 0, is
     malformed: R13). Its session expires after liveness x its last promise (absent: the
     negotiated interval); a client's HEARTBEAT is answered with its promise, and an idle
     worker is beaten at its promise, each beat saying it (the first at once). A request
     dispatched to a worker that promised more than its interval, or a REQUEST from such a
     client, holds it to its interval again from that moment (expiry now + liveness x
     interval); a worker holding requests is held to its interval whatever it promises.

The family (docs/protocol.md §5-6; tests/core/test_family.py names a test after each):
 F1  Start connects a link to every other member of the family (to each seed while joining)
     and says HELLO on it; a link whose HELLO is not answered says HELLO again every interval.
 F2  A HELLO on the peer ROUTER from a member of our family is answered with our HELLO; another
     family, a non-member, or (CURVE) a link whose key is not the entry's curve_public_key of
     the broker_id it names gets DISCONNECTERROR 401; a broker_id whose link spoke within the
     last interval from another routing id gets 409 (an older one is taken over: the peer
     restarted). Anything else from a routing id that has not said HELLO is ignored (a
     message that does not decode is scored by address, R22).
 F3  Any message from a peer is a heartbeat; a peer silent for liveness x interval is down: its
     table is dropped and the requests forwarded to it are routed again or answered 504 (peers
     found silent in the same round are all down before any of those requests moves). Its
     link's routing id is kept: when it speaks again on the same link it is up again.
 F4  A peer HELLO or HEARTBEAT naming a newer config_version makes us CHECKCONFIG it at once;
     a HEARTBEAT whose time is off by more than max_clock_skew_s gets DISCONNECTERROR 412.
 F5  Tables: we pull (TABLEREQ since our copy) when a link comes up and whenever a HEARTBEAT's
     table_seq is ahead of our copy; a peer that asked for push gets a full TABLE after its HELLO
     and a delta at each commit; a TABLEREQ gets the delta since since_seq, else a full TABLE.
 F6  A request with no ready local worker goes to the usable peer with the most free slots for
     its service; else it waits here if a local worker offers the service; else it goes to a
     usable peer that offers it at all. A forwarded request is never forwarded again.
 F7  A FORWARD is dispatched like a local request under our own deadline (F15: or the one it
     carries, if shorter); with no local worker offering the service it gets FORWARDREPLY 404
     at once, 503 if we are not active; its PARTIALs and REPLY go back as FORWARDPARTIAL and
     FORWARDREPLY.
 F8  A FORWARDREPLY 404 or 503 routes the request again (within max_retries; the peer's slots
     for it count as none until its next table), else the client gets that status.
 F9  Requests waiting for a service are forwarded as soon as a peer's table shows free slots
     or its FORWARDREPLY frees one (the answer is its credit: nothing waits for a periodic
     table), or as soon as the last local worker of the service is lost; then requests
     forwarded to us that wait for it get FORWARDREPLY 404 at once (their origin routes them
     again).
 F10 A config offered (config SUB, a peer's CONFIG, the disk, the file, an admin) is judged by
     the replica (scale0/core/replica.py, K1-K6). An applied config is persisted, published by a
     config source, its plan performed (links, subscriptions), every client and worker is told
     FORCENEGOTIATE, and a joining broker becomes active. A refusal is logged, nothing changes.
 F11 CHECKCONFIG from a peer gets CONFIGACK or CONFIG with the whole config and its signatures;
     503 while we are not active. A config source republishes every config_republish_s.
 F12 DISCONNECT from a peer marks it down at once.
 F13 A disabled broker keeps saying HELLO and HEARTBEAT (state disabled) and forwards nothing.
 F14 A family whose config says family_topology: gossip keeps F1, F2, F4 and F6-F12, but its
     links carry no HEARTBEAT and no TABLE: liveness (F3) and tables (F5) are SWIM membership,
     G1-G12 of scale0/core/gossip.py (tests/core/test_gossip.py).
 F15 Every HELLO says `understands: ["FORWARDWITH"]`; a request goes to a peer whose last HELLO
     said so as FORWARDWITH, carrying the client's client_id and request_id (not a Majordomo
     client's), what is left of its deadline and its CURVE key; to any other peer as FORWARD
     or FORWARDAS. The target holds it until min(request_timeout_ms, the carried deadline) (0
     left: FORWARDREPLY 504 at once, not run), under the client's own key: a resend reaching
     it by any way (another origin, or the client itself) joins it while it waits or runs,
     every asker answered, or gets its cached worker REPLY (R10); an IDREQUEST worker is told
     the client's ids. A FORWARDREPLY 404/503 arriving past the request's deadline is relayed,
     not routed again (F8). What a lost FORWARDWITH peer held under the client's ids (F3) goes
     back to that peer alone when it is usable again within min(liveness x interval,
     request_timeout_ms / 2) (it joins them to its run), and only after that anywhere.
 F16 Every TABLE says, in `slots`, how many of the receiver's forwards the sender would hold at
     once as it sends it, per service it offers: its free slots, less its queue, plus the
     receiver's requests it holds. The receiver's free slots at that peer are then those
     slots less its own requests the peer holds or has not received yet (the TABLE travels
     behind every FORWARDREPLY sent before it, after every FORWARD received before it), and
     move by one per forward and per answer (F6, F9) until the next TABLE. A table that
     crossed a FORWARD never counts that forward's slot free again, and one committed
     before the peer's last answer never hides the slot that answer freed. A TABLE without
     `slots` (an older peer) sets them from its rows' free capacity, as before.

Management (MANAGEMENTREQ and the HTTP server) has its own rules, M1-M6, in
scale0/core/admin.py; it sees the broker through the narrow ``Managed`` interface of commands.py
(its queries, ``status``, ``client_table``, ..., and ``change_state`` for disable/enable, §6.4).

Where each rule lives. ``Broker`` is a façade: it holds the rooms below, wires them to each other
and routes every event by a {type: handler} table (``handle``), every message by a table per
channel, and every timer by the type of its key (scale0/core/timers.py):
  scale0/core/context.py      Core: identity, the running config and its documents, state, clock,
                              timers, counters and metrics, shared by every room
  scale0/core/sessions.py     sessions and negotiation (R1-R3, R12, R16)
  scale0/core/dispatch.py     requests and workers: waiting, in flight, answered, the pool
                              (R4-R11, R14, R15); the hot path
  scale0/core/ledger.py       the hot path's state (requests, tickets, reply cache, workers,
                              queues) behind LedgerPort's operations; every room reads it so
  scale0/core/guard.py        error scores and bans (R13)
  scale0/core/family.py       links, HELLO, heartbeat tables (F1-F5, F12, F13, F16)
  scale0/core/gossip.py       a gossip family's membership, owned by family.py (G1-G12, F14)
  scale0/core/forwarding.py   requests forwarded to peers and from them (F6-F9, F15)
  scale0/core/replication.py  config offers, what an applied config does (F4, F10, F11)
  scale0/core/lifecycle.py    the broker's state and moving work away (R3, R17-R19)
  scale0/core/majordomo.py    Majordomo clients and workers, an adapter at the edge (D1-D4)
  scale0/core/states.py       the two state machines as tables: broker state, peer link
  scale0/core/views.py        status and the management tables
  scale0/core/admin.py        management requests (M1-M6); commands.py, the command table
  scale0/core/records.py      what the event log gets: RequestDone, heartbeat_gap (docs/trend.md)
The rooms never import each other: each names what it asks of the others by a Protocol in
scale0/core/ports.py, and only this façade wires them (import-linter contract core-rooms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.config.canonical import config_sha256
from scale0.config.model import NetworkConfig
from scale0.core import views
from scale0.core.admin import Management
from scale0.core.context import Core
from scale0.core.dispatch import Dispatch
from scale0.core.effects import (
    Authenticated,
    Channel,
    ConfigOffered,
    ConfigRead,
    Connected,
    Disconnected,
    Drain,
    Effect,
    Event,
    FanOutDone,
    Log,
    Malformed,
    ManagementCall,
    ManagementSubmit,
    Received,
    Send,
    Shutdown,
    Start,
    Tick,
)
from scale0.core.entries import HotEntries
from scale0.core.family import Family
from scale0.core.forwarding import Forwarding
from scale0.core.guard import Guard, address_key
from scale0.core.ledger import Ledger
from scale0.core.lifecycle import Lifecycle
from scale0.core.majordomo import Majordomo
from scale0.core.metrics import Metrics
from scale0.core.ports import LanePort, MirrorPort
from scale0.core.replica import Offer, Replica, SignedConfig, Verdict
from scale0.core.replication import Replication
from scale0.core.sessions import Sessions
from scale0.core.states import BrokerInput, Change
from scale0.core.timers import BeatRound, ConnDue, ExpiryDue, Periodic
from scale0.wire.admin import ManagementRequest
from scale0.wire.client import CheckConfig, ClientRequest, Disconnect, DisconnectError, Heartbeat
from scale0.wire.frames import ConfigType, JsonValue, Message
from scale0.wire.mdp import (
    MDP_SIGNATURES,
    MdpClientRequest,
    MdpWorkerDisconnect,
    MdpWorkerHeartbeat,
    MdpWorkerPartial,
    MdpWorkerReady,
    MdpWorkerReply,
)
from scale0.wire.peer import BrokerState, Hello
from scale0.wire.worker import Ready, WorkerPartial, WorkerReply

__all__ = ["SWEEP_INTERVAL_S", "Broker"]

#: The channels of other brokers: what the lane heard there is the family's, not a session's.
_PEER_CHANNELS = frozenset({Channel.PEER, Channel.LINK})

SWEEP_INTERVAL_S = 1.0

E = TypeVar("E", bound=Event)
M = TypeVar("M", bound=Message)
#: A message from a client or worker: (channel, routing id, message, now, wall, out).
Handler = Callable[[Channel, bytes, Any, float, float, list[Effect]], None]


class Broker(HotEntries):
    """One broker's decisions. Feed it events; perform the effects it returns, in order.

    The hot path's entry points (``handle_request`` ... ``handle_mdp_reply``) are inherited
    from :class:`scale0.core.entries.HotEntries`."""

    def __init__(
        self,
        identity: str,
        network: NetworkConfig | None,
        *,
        state: BrokerState | str,
        boot_id: bytes,
        signature: str | None,
        now: float,
        view_signature: str | None = None,
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
        asked = BrokerState(state)
        wanted = BrokerState.DISABLED if asked is BrokerState.DISABLED else BrokerState.ACTIVE
        current = None
        if network is not None:
            current = SignedConfig(
                network, config_sha256(network), signature or "", identity, view_signature
            )
        else:
            network = NetworkConfig(family=family or "unknown", config_version=0, brokers=())
            asked = BrokerState.JOINING
        core = self.core = Core(
            identity,
            network,
            signature,
            view_signature=view_signature,
            state=asked,
            wanted=wanted,
            boot_id=boot_id,
            now=now,
        )
        #: The hot path's state (scale0/core/ledger.py), which the rooms share by its operations.
        self.ledger = ledger = Ledger()
        self.sessions = Sessions(core)
        self.dispatch = Dispatch(core, ledger)
        self.family = Family(core, seeds)
        ledger.watch_forwarded(self.family.lane_forwarded)  # (phase 4b: the lane's forwards)
        self.guard = Guard(core, self.sessions.forget, self.family.broker_of.__contains__)
        self._conn = -1  # the connection of the message being handled (R20, R22, §8)
        self.family.refuse = self._peer_refused
        self.forwarding = Forwarding(core)
        self.replication = Replication(
            core,
            trusted_keys=trusted_keys,
            family=family,
            current=current,
            config_subs=config_subs,
            config_source=config_source,
            own_ports=own_ports or {},
        )
        self.lifecycle = Lifecycle(core)
        self.majordomo = Majordomo(core)
        # The rooms know each other only here: each asks the others, through the Protocols of
        # scale0/core/ports.py, for what it does not own.
        sessions, dispatch, peers = self.sessions, self.dispatch, self.family
        forwarding, lifecycle, replication = self.forwarding, self.lifecycle, self.replication
        sessions.dispatch = peers.dispatch = forwarding.dispatch = dispatch
        lifecycle.dispatch = dispatch
        dispatch.sessions = peers.sessions = lifecycle.sessions = sessions
        replication.sessions = sessions
        sessions.family = dispatch.family = forwarding.family = peers
        sessions.guard = self.guard
        lifecycle.family = replication.family = peers
        dispatch.forwarding = peers.forwarding = lifecycle.forwarding = forwarding
        dispatch.lifecycle = replication.lifecycle = lifecycle
        peers.replication = replication
        mdp = self.majordomo
        mdp.dispatch, mdp.family, mdp.sessions = dispatch, peers, sessions
        dispatch.majordomo = sessions.majordomo = mdp
        sessions.ledger = peers.ledger = forwarding.ledger = lifecycle.ledger = ledger
        self.management = Management(self)
        #: The net layer's own counters (received, sent, dropped...), shared for ``status``.
        self.io_counters: dict[str, int] = {}
        core.timers.push(now + SWEEP_INTERVAL_S, Periodic.SWEEP)

        self._on_event: dict[type[Any], Callable[[Any, float, float, list[Effect]], None]] = {}
        self._event(Received, self._received)
        self._event(Authenticated, self._authenticated)
        self._event(Tick, self._tick)
        self._event(Malformed, lambda e, now, wall, out: self.guard.malformed(e, now, out))
        self._event(Connected, lambda e, now, wall, out: self.guard.connected(e, now, out))
        self._event(Disconnected, lambda e, now, wall, out: self.guard.disconnected(e))
        self._event(ConfigOffered, self._config_offered)
        self._event(Start, lambda e, now, wall, out: self._start(now, wall, out))
        self._event(Shutdown, lambda e, now, wall, out: self._shutdown(out))
        self._event(Drain, lambda e, now, wall, out: self.lifecycle.drain(e.grace_ms, now, out))
        self._event(ManagementCall, self.management.checked)
        self._event(ManagementSubmit, self.management.submitted)
        self._event(ConfigRead, self.management.config_read)
        self._event(FanOutDone, lambda e, now, wall, out: self.management.fanned_out(e, out))

        # What clients and workers may say, per channel (peers: scale0/core/family.py).
        self._on_message: dict[Channel, dict[type[Message], Handler]] = {
            Channel.FRONTEND: {},
            Channel.BACKEND: {},
        }
        for channel in (Channel.FRONTEND, Channel.BACKEND):
            self._message(channel, Heartbeat, sessions.heartbeat)
            self._message(channel, CheckConfig, self._check_config)
            self._message(channel, Disconnect, sessions.disconnect)
            self._message(channel, ManagementRequest, self._management_request)
        self._message(Channel.FRONTEND, ClientRequest, self._client_request)
        self._message(Channel.BACKEND, WorkerReply, self._worker_reply)
        self._message(Channel.BACKEND, WorkerPartial, dispatch.worker_partial)
        self._message(Channel.BACKEND, Ready, dispatch.ready)
        self._message(Channel.FRONTEND, MdpClientRequest, mdp.client_request)
        self._message(Channel.BACKEND, MdpWorkerReady, mdp.worker_ready)
        self._message(Channel.BACKEND, MdpWorkerReply, mdp.worker_reply)
        self._message(Channel.BACKEND, MdpWorkerPartial, mdp.worker_partial)
        self._message(Channel.BACKEND, MdpWorkerHeartbeat, mdp.worker_heartbeat)
        self._message(Channel.BACKEND, MdpWorkerDisconnect, mdp.worker_disconnect)

        # A RequestDue is the request's number: its type at run time is int.
        self._on_timer: dict[
            type[Any] | Periodic, Callable[[Any, float, float, list[Effect]], None]
        ] = {
            int: lambda key, now, wall, out: dispatch.deadline(key, now, out),
            ExpiryDue: lambda key, now, wall, out: sessions.expire(key, now, out),
            BeatRound: dispatch.beat,
            ConnDue: lambda key, now, wall, out: self.guard.conn_due(key, out),
            Periodic.SWEEP: lambda key, now, wall, out: self._sweep(now, wall, out),
            Periodic.PEERS: lambda key, now, wall, out: self.family.round(now, wall, out),
            Periodic.TABLE: lambda key, now, wall, out: self.family.commit_table(now, wall, out),
            Periodic.REPUBLISH: lambda key, now, wall, out: self.replication.republish(now, out),
            Periodic.GOSSIP: lambda key, now, wall, out: self.family.gossip.indirect(
                now, wall, out
            ),
        }

    @property
    def event_log(self) -> Mapping[str, int] | None:
        """The node's event log counters while it writes one (docs/trend.md): set, the core
        reports a RequestDone for every request answered here (scale0/core/records.py)."""
        return self.core.event_log

    @event_log.setter
    def event_log(self, stats: Mapping[str, int] | None) -> None:
        self.core.event_log = stats

    def _event(
        self, kind: type[E], handler: Callable[[E, float, float, list[Effect]], None]
    ) -> None:
        self._on_event[kind] = handler

    def _message(
        self,
        channel: Channel,
        kind: type[M],
        handler: Callable[[Channel, bytes, M, float, float, list[Effect]], None],
    ) -> None:
        self._on_message[channel][kind] = cast(Handler, handler)

    # ---- the entry points ------------------------------------------------------------------

    def handle(self, event: Event, now: float, wall: float) -> list[Effect]:
        out: list[Effect] = []
        self.core.clock = now
        self.core.wall = wall
        handler = self._on_event.get(type(event))
        if handler is not None:
            handler(event, now, wall, out)
        if self.majordomo.speaks:
            self.majordomo.translate(out)
        return out

    def _authenticated(
        self, event: Authenticated, now: float, wall: float, out: list[Effect]
    ) -> None:
        """A connection's CURVE key: a peer's for its HELLO (F2), else its session's (T1-T4)."""
        if event.channel is Channel.PEER:
            keys = self.core.peer_keys
            if len(keys) >= 10_000:  # routing ids of links long gone; the node says it again
                keys.clear()
            keys[event.routing_id] = event.key
            return
        self.sessions.authenticated(event, wall, out)

    def _received(self, event: Received, now: float, wall: float, out: list[Effect]) -> None:
        channel, routing_id, message = event.channel, event.routing_id, event.message
        if channel is Channel.PEER or channel is Channel.LINK:
            self._conn = event.conn
            self.family.received(channel, routing_id, message, now, wall, out)
            if (
                event.conn >= 0
                and channel is Channel.PEER
                and self._peer_negotiated(routing_id, message)
            ):
                self.guard.negotiated(channel, event.conn)  # R22: a member's link stays
            return
        if self.majordomo.speaks and message.protocol not in MDP_SIGNATURES:
            self.majordomo.speaks.pop((channel, routing_id), None)  # it speaks S0P now
        table = self._on_message.get(channel)
        handler = table.get(type(message)) if table is not None else None
        if handler is None:
            # Decoded, but not a message this channel takes (protocol.md §2.4): dropped, counted.
            self.core.counters["dropped"] += 1
            details = {"command": message.COMMAND.decode(), "channel": channel.value}
            out.append(Log("info", "unsupported_message", details))
            return
        self._conn = event.conn
        handler(channel, routing_id, message, now, wall, out)
        if event.conn >= 0 and routing_id in self.sessions.by_channel.get(channel, {}):
            self.guard.negotiated(channel, event.conn)  # R20: it stays

    def _peer_negotiated(self, routing_id: bytes, message: Message) -> bool:
        """R22: whether the peer-port message just handled leaves its connection negotiated:
        its routing id's HELLO was accepted (now, or before a reconnect that kept the routing
        id), or, while we are joining and cannot judge members, it was a HELLO of our family."""
        if routing_id in self.family.broker_of:
            return True
        core = self.core
        return (
            core.state is BrokerState.JOINING
            and isinstance(message, Hello)
            and message.family == core.network.family
        )

    def _peer_refused(
        self, routing_id: bytes, refusal: DisconnectError, now: float, out: list[Effect]
    ) -> None:
        """F2/R22: a HELLO refused with 401. From a routing id that has not said an accepted
        HELLO, over a connection whose address we know, it counts against that address (a
        stranger reconnects for every try); otherwise the refusal is simply sent."""
        address = self.guard.address(Channel.PEER, self._conn)
        if address is None or routing_id in self.family.broker_of:
            out.append(Send(Channel.PEER, routing_id, refusal))
            return
        self.guard.peer_error(address, routing_id, refusal, now, out)

    def _client_request(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: ClientRequest,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.dispatch.client_request(routing_id, msg.service, msg.request_id, msg.body, now, out)

    def _worker_reply(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: WorkerReply,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.dispatch.worker_reply(routing_id, msg.ticket, msg.status, msg.body, now, out)

    def _check_config(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: CheckConfig,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.sessions.check_config(channel, routing_id, msg, now, out)

    def _management_request(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: ManagementRequest,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        # Credentials first (scale0/core/admin.py, M1). The sender whose score a failure
        # raises is the connection's address when the I/O layer told it (§8: a guesser who
        # reconnects for every try is one sender), else the routing id.
        sender = routing_id
        address = self.guard.address(channel, self._conn)
        if address is not None:
            sender = address_key(address)
            if self.guard.is_banned(sender, now):
                self.core.counters["banned_dropped"] = (
                    self.core.counters.get("banned_dropped", 0) + 1
                )
                return  # §8: silence while the ban lasts
        self.management.submit(
            channel, routing_id, sender, msg, session_ok=False, now=now, wall=wall, out=out
        )

    def _config_offered(
        self, event: ConfigOffered, now: float, wall: float, out: list[Effect]
    ) -> None:
        self.replication.offered(event, now, wall, out)

    def _tick(self, event: Tick, now: float, wall: float, out: list[Effect]) -> None:
        on_timer = self._on_timer
        for key in self.core.timers.pop_due(now):
            on_timer[key if isinstance(key, Periodic) else type(key)](key, now, wall, out)

    def _start(self, now: float, wall: float, out: list[Effect]) -> None:
        """F1: links to every member (seeds while joining), subscriptions, HELLO, publishing."""
        self.replication.start(now, out)
        self.family.connect_seeds(out)
        self.replication.resubscribe(out)
        self.family.say_hello(now, wall, out)
        self.core.timers.push(now + self.core.interval_s, Periodic.PEERS)
        self.replication.serve(now, out)

    def _shutdown(self, out: list[Effect]) -> None:
        """R17: DISCONNECT to every client, worker and link."""
        self.sessions.disconnect_all(out)
        self.family.shutdown(out)
        out.append(Log("info", "broker_stopping", {"identity": self.core.identity}))

    def _sweep(self, now: float, wall: float, out: list[Effect]) -> None:
        self.guard.sweep(now)
        self.sessions.regrant(now, wall, out)  # key grants that ended (scale0/core/trust.py)
        self.dispatch.sweep(now)
        self.majordomo.sweep()
        ledger = self.ledger
        self.core.metrics.maybe_sample(
            now,
            wall,
            {
                "requests": self.core.counters["requests"],
                "clients": len(self.sessions.clients),
                "workers": ledger.worker_count(),
                "queued": ledger.waiting_total(),
                "in_flight": ledger.in_flight_count(),
            },
        )
        self.core.timers.push(now + SWEEP_INTERVAL_S, Periodic.SWEEP)

    # ---- queries for the I/O layer ---------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When :meth:`handle` next wants a ``Tick``.

        A request that got its answer leaves its deadline entry in the heap (lazy deletion):
        such entries are dropped here when they reach the head, so under steady load the
        broker's timer waits for the next live deadline instead of firing for each answered
        request, and the heap holds about one entry per request still running.
        """
        timers = self.core.timers
        is_open = self.ledger.is_open
        while True:
            key = timers.head()
            if not isinstance(key, int) or is_open(key):
                break
            timers.drop_head()
        due = timers.next_due()
        lane_due = self.ledger.lane_due()  # a request the lane holds times out too (R9)
        if lane_due is not None and (due is None or lane_due < due):
            return lane_due
        return due

    def is_banned(self, routing_id: bytes, now: float) -> bool:
        return self.guard.is_banned(routing_id, now)

    @property
    def banned(self) -> Mapping[bytes, float]:
        """The bans on record (routing id -> until when), read only: while it is empty no
        sender is banned, and the node skips :meth:`is_banned` for each message."""
        return self.guard.banned

    def peer_unread(self, routing_id: bytes, conn: int, command: bytes, now: float) -> bool:
        """R22: drop this peer-port message unread (frame 2 is ``command``): it comes over a
        connection that has not negotiated, from a banned address, and is not a HELLO."""
        return self.guard.peer_unread(routing_id, conn, command, now)

    def mark_negotiated(self, channel: Channel, routing_id: bytes, conn: int) -> bool:
        """R20 for the fast path (a Majordomo client's first REQUEST opens its session there):
        if ``routing_id`` has a session, its connection ``conn`` is negotiated; True if so."""
        if routing_id in self.sessions.by_channel.get(channel, {}):
            self.guard.negotiated(channel, conn)
            return True
        return False

    def mirror_sessions(self, mirror: MirrorPort | None) -> None:
        """The C lane takes plain HEARTBEATs from now on (None: it stopped): ``mirror`` is told
        every session now and each change after (scale0/core/sessions.py)."""
        self.sessions.mirror_all(mirror)

    def attach_lane(self, lane: LanePort | None) -> None:
        """The C lane dispatches Majordomo requests from now on, sharing the ledger's C pool
        (None: it stopped, and every request it still holds becomes the ledger's). Raises
        ValueError when the ledger keeps a Python pool (``SCALE0_POOL=python``)."""
        core = self.core
        if lane is None:
            self.ledger.attach_lane(None, core.timers.push)
            core.share_seq(None)
        else:
            core.share_seq(lane)
            self.ledger.attach_lane(lane, core.timers.push)

    def lane_serves(self, records: bool = False) -> tuple[bool, float, int, bytes, int, bool]:
        """What the lane is told it may do with requests (its ``serve``): whether it may take
        one at all (the broker active and not draining, no event log to write each request's
        record unless the lane ``records`` what it answers for it, no ``routes`` to hold
        unknown services to), the request timeout, R20's cap, the prefix of every ticket (the
        core's boot id), R6's cap on what waits per service, and whether it may queue a
        request no worker is ready for (no peer: F6 would forward it)."""
        core = self.core
        network = core.network
        on = (
            core.state is BrokerState.ACTIVE
            and not core.draining
            and (core.event_log is None or records)
            and core.routes is None
        )
        return (
            on,
            core.timeout_s,
            network.max_requests_per_client,
            core.boot_id,
            network.max_queued_requests,
            not self.family.peers,
        )

    def adopt_due(self, now: float) -> None:
        """The lane's requests past their deadline become the ledger's, so this Tick's
        deadline timers answer them (R9)."""
        self.ledger.adopt_due(now)

    def adopt_lane(self) -> None:
        """Every request the lane holds becomes the ledger's (before the lane is told it may
        take no more: a change of state, draining, the event log)."""
        self.ledger.adopt_lane()

    def lane_did(
        self,
        requests: int,
        replies: int,
        latencies: Sequence[tuple[str, int, Sequence[int], float]],
        changed: Sequence[str],
        now: float,
        forwards: int = 0,
        forwarded: int = 0,
    ) -> None:
        """What the lane did since it was last asked (its ``drain``): the requests it took and
        answered (counters), the latency of its answers per service and status (metrics; a
        Majordomo answer is 200), the services whose free slots changed (the heartbeat table
        the peers read, F2), how many of its requests were peers' FORWARDs (phase 4a) and how
        many it forwarded to peers itself (phase 4b)."""
        counters = self.core.counters
        counters["requests"] += requests
        counters["replies"] += replies
        if forwards:
            counters["forwards_served"] += forwards
        if forwarded:
            counters["forwarded"] += forwarded
        metrics = self.core.metrics
        for service, status, counts, sum_s in latencies:
            metrics.merge(service, status, counts, sum_s)
        if changed and self.family.peers:
            self.family.table_changed(changed, now)

    def heard_elsewhere(self, heard: Sequence[tuple[Channel, bytes, float]]) -> None:
        """The plain HEARTBEATs the lane took since the last call, (channel, routing id,
        when) in order of when: their sessions are heard then, before this round's rules read
        them. No effects: the lane answered them. A peer's (channel PEER: a FORWARD the lane
        took) is heard by the family."""
        if any(channel in _PEER_CHANNELS for channel, _, _ in heard):
            family = self.family
            for channel, routing_id, when in heard:
                if channel is Channel.PEER:
                    family.heard_elsewhere(routing_id, when)
                elif channel is Channel.LINK:  # a FORWARDREPLY the lane took (phase 4b)
                    family.heard_on_link(routing_id, when)
            heard = [entry for entry in heard if entry[0] not in _PEER_CHANNELS]
        self.sessions.heard_elsewhere(heard)

    def lane_peers(self) -> dict[bytes, bytes]:
        """The peer links whose FORWARDs the lane may take: routing id -> broker id (F3)."""
        return self.family.lane_peers()

    def lane_forward_peers(self) -> dict[bytes, tuple[bool, bool, dict[str, int]]]:
        """The peers the lane may forward to, as it must know them (phase 4b): per broker id,
        whether it may be sent work, whether it understands FORWARDWITH, and our estimate of
        its free slots per service it offers (``Family.lane_forward_peers``)."""
        return self.family.lane_forward_peers()

    def lane_moved(self, deltas: Sequence[tuple[bytes, str, int]]) -> None:
        """How the lane moved our estimate of each peer's free slots since it was last asked
        (its ``peer_deltas``: -1 per request it forwarded, +1 per answer it took)."""
        if deltas:
            self.family.lane_moved(deltas)

    def auth_wait_s(self, auth_id: str, sender: bytes, now: float) -> float:
        """M1: how long ``sender`` must wait before trying ``auth_id`` again (0: now)."""
        return self.guard.auth.wait_s(auth_id, sender, now)

    def auth_done(self, auth_id: str, sender: bytes, ok: bool, now: float) -> None:
        """M1: a credential check for ``auth_id`` from ``sender`` ended ``ok`` or not."""
        if ok:
            self.guard.auth.succeeded(auth_id, sender, now)
        else:
            admins = {a.auth_id for a in self.core.network.admins}
            self.guard.auth.failed(auth_id, admins, now)

    def count_error(
        self, channel: Channel, sender: bytes, reply_to: bytes, now: float, out: list[Effect]
    ) -> bool:
        """One error towards ``sender``'s score (R13); True if it banned the sender."""
        return self.guard.count_error(channel, sender, reply_to, now, out)

    # ---- what the broker is: read by the I/O layer, management and tests -------------------

    @property
    def identity(self) -> str:
        return self.core.identity

    @property
    def network(self) -> NetworkConfig:
        return self.core.network

    @property
    def signature(self) -> str | None:
        return self.core.signature

    @property
    def sha256(self) -> str:
        return self.core.sha256

    @property
    def max_frame_bytes(self) -> int:
        return self.core.max_frame_bytes

    @property
    def state(self) -> BrokerState:
        return self.core.state

    @property
    def draining(self) -> bool:
        return self.core.draining

    @property
    def counters(self) -> dict[str, int]:
        return self.core.counters

    @property
    def metrics(self) -> Metrics:
        return self.core.metrics

    @property
    def replica(self) -> Replica:
        return self.replication.replica

    @property
    def config_source(self) -> bool:
        return self.replication.config_source

    @property
    def config_version(self) -> int:
        """The version of the config this broker runs (0: none yet)."""
        return self.replication.replica.version

    def client_view(self, config_type: ConfigType) -> bytes:
        return self.core.client_view(config_type)

    @property
    def client_view_sha256(self) -> str:
        return self.core.client_view_sha256

    def stats(self) -> dict[str, int]:
        return views.stats(self)

    def services(self) -> dict[str, dict[str, int]]:
        return views.services(self)

    def service_table(self) -> list[JsonValue]:
        return views.service_table(self)

    def client_table(self, now: float) -> list[JsonValue]:
        return views.client_table(self, now)

    def worker_table(self, now: float) -> list[JsonValue]:
        return views.worker_table(self, now)

    def status(self, now: float, wall: float) -> dict[str, JsonValue]:
        return views.status(self, now, wall)

    def peers_view(self) -> list[JsonValue]:
        peers = self.family.peers
        lane_forwarded_to = self.ledger.lane_forwarded_to
        return [peers[b].view(sum(lane_forwarded_to(b).values())) for b in sorted(peers)]

    def config_view(self) -> dict[str, JsonValue]:
        return self.replication.view()

    # ---- what management does (scale0/core/admin.py) ---------------------------------------

    def change_state(self, change: BrokerInput, now: float, by: str, out: list[Effect]) -> Change:
        """``disable`` / ``enable`` (§6.4) by the table in scale0/core/states.py."""
        return self.lifecycle.change(change, now, by, out)

    def fetch_config(self, wall: float, out: list[Effect]) -> list[str]:
        """CHECKCONFIG on every linked peer (or seed, while joining) now; returns whom."""
        return self.replication.fetch_config(out)

    def offer_config(
        self, offer: Offer, source: str, now: float, wall: float
    ) -> tuple[Verdict, list[Effect]]:
        """Judge a config and say how it went: for management (set_config, reload_config),
        which must answer with what was applied, refused, or needs a restart (F10)."""
        out: list[Effect] = []
        outcome = self.replication.offered(ConfigOffered(offer, source), now, wall, out)
        return outcome, out
