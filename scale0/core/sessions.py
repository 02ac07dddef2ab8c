"""Sessions and negotiation: who has said CHECKCONFIG, with which config, and when it last spoke.

Rules R1, R2, R3 (its first half), R12, R16 and R20 (the session cap) of
scale0/core/broker.py. A session is per
channel (frontend: clients, backend: workers) and routing id; its ``client_id`` is unique per
channel among live connections (409 otherwise).

A silent session expires (R8) at exactly ``last_seen + timeout_s``, by one sweep for all of
them (docs/performance.md, "Liveness"): the sessions of one channel and timeout are kept in a
dict in the order they were last heard (:func:`~scale0.core.connections.touch` moves one to the
end, as the core's ``now`` never goes back), so the longest-silent is first, and one
:class:`~scale0.core.timers.ExpiryDue` timer waits for the earliest first one. The sweep looks
only at sessions that are due; a thousand idle connections cost the timer heap nothing.

With the C lane (docs/architecture.md), the lane answers a session's plain HEARTBEATs without
this module: ``mirror`` (a :class:`~scale0.core.ports.MirrorPort`) is told everything of a
session that the lane's take rule reads (that it exists, its promise, its gap limit) whenever
it changes, and :meth:`Sessions.heard_elsewhere` hears what the lane heard, at the start of
every round of the node, before any rule reads ``last_seen``.
"""

from __future__ import annotations

from collections.abc import Sequence

from scale0.config.model import KeyGrant
from scale0.core.connections import Session, touch
from scale0.core.context import PROTOCOL, Core
from scale0.core.effects import Authenticated, Channel, Effect, Log, Malformed, Send
from scale0.core.ports import (
    DispatchPort,
    FamilyPort,
    GuardPort,
    LedgerPort,
    MajordomoPort,
    MirrorPort,
)
from scale0.core.records import GAP_INTERVALS, heartbeat_gap
from scale0.core.timers import ExpiryDue
from scale0.core.trust import allowed
from scale0.core.trust import may as may_service
from scale0.wire.client import (
    CheckConfig,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import FRAME_OPTIONS, SIG_CLIENT
from scale0.wire.hot import Beat
from scale0.wire.mdp import reading_code
from scale0.wire.peer import BrokerState

__all__ = ["Sessions"]

#: CURVE keys of connections that have not said CHECKCONFIG yet, at most this many (a flood of
#: connections that never negotiate must not grow it without bound; a key forgotten is said
#: again by the node when its connection next speaks and the node's own memory misses it).
MAX_PENDING_KEYS = 100_000


class Sessions:
    """The client and worker sessions of one broker, and the negotiation that opens them."""

    dispatch: DispatchPort
    family: FamilyPort
    guard: GuardPort
    ledger: LedgerPort
    majordomo: MajordomoPort

    def __init__(self, core: Core) -> None:
        self.core = core
        self.by_channel: dict[Channel, dict[bytes, Session]] = {
            Channel.FRONTEND: {},
            Channel.BACKEND: {},
        }
        self.clients = self.by_channel[Channel.FRONTEND]
        self.workers = self.by_channel[Channel.BACKEND]
        self._client_ids: dict[tuple[Channel, str], bytes] = {}
        self._gen = 0
        #: The last answer to a client's HEARTBEAT, reused while wall and version are the same.
        self._answer = Heartbeat(time=-1.0, config_version=-1, protocol=SIG_CLIENT)
        self._idle_answer = self._answer  # ...and to one that promised the idle interval (R23)
        self._keys: dict[tuple[Channel, bytes], str] = {}  # Authenticated, before a session
        #: (channel, timeout_s) -> its sessions in order of last_seen (the liveness sweep).
        self._orders: dict[tuple[Channel, float], dict[bytes, Session]] = {}
        #: When the live ExpiryDue entry fires (None: none armed).
        self._expiry_at: float | None = None
        #: The C lane's copy of each session (None: no lane), see the module's docstring.
        self.mirror: MirrorPort | None = None

    def session(
        self, channel: Channel, routing_id: bytes, now: float, out: list[Effect]
    ) -> Session | None:
        """R1: the sender's session, seen now; None (and FORCENEGOTIATE) if it has none."""
        session = self.by_channel[channel].get(routing_id)
        if session is None:
            message = ForceNegotiate(reason="send CHECKCONFIG first", protocol=PROTOCOL[channel])
            out.append(Send(channel, routing_id, message))
            return None
        if channel is Channel.BACKEND:
            interval_s = session.timeout_s / self.core.network.liveness
            heartbeat_gap(out, routing_id, now - session.last_seen, interval_s)
        touch(session, now)
        return session

    def full(self, channel: Channel, routing_id: bytes) -> bool:
        """R20: whether a new session for ``routing_id`` would pass ``max_sessions``."""
        sessions = self.by_channel[channel]
        return routing_id not in sessions and len(sessions) >= self.core.network.max_sessions

    def adopt(self, channel: Channel, routing_id: bytes, now: float) -> Session:
        """A Majordomo sender's session (§10, D1 of scale0/core/majordomo.py): it has no
        CHECKCONFIG, so its first valid message opens one, on the running config."""
        session = self.by_channel[channel].get(routing_id)
        if session is not None:
            touch(session, now)
            return session
        return self._open(channel, routing_id, f"{self.core.identity}.{routing_id.hex()}", now)

    def _open(
        self,
        channel: Channel,
        routing_id: bytes,
        client_id: str,
        now: float,
        timeout_s: float | None = None,
    ) -> Session:
        """A new session on the running config, its expiry armed; ``timeout_s`` None: liveness
        x interval."""
        core = self.core
        if timeout_s is None:
            timeout_s = core.interval_s * core.network.liveness
        self._gen += 1
        version = core.network.config_version
        session = Session(routing_id, channel, client_id, version, now, timeout_s, self._gen)
        old = self.by_channel[channel].get(routing_id)
        if old is not None:
            session.promise_ms = old.promise_ms  # its timeout's promise (§3.4) stands too
        key = self._keys.pop((channel, routing_id), old.key if old is not None else "")
        if key or core.curve:
            session.key = key
            session.allowed = allowed(self._grants(channel), key, core.wall)
        self.by_channel[channel][routing_id] = session
        self._client_ids[(channel, client_id)] = routing_id
        if old is not None:
            self._unorder(old)
        self._order(session, timeout_s)
        self._mirrored(session)
        return session

    # ---- liveness: the sweep (R8) ------------------------------------------------------------

    def set_timeout(self, session: Session, timeout_s: float) -> None:
        """R8, R11: ``session`` is silent too long after ``timeout_s`` (inf: never), from now on."""
        if timeout_s == session.timeout_s and session.order is not None:
            return
        self._unorder(session)
        self._order(session, timeout_s)
        self._mirrored(session)

    def unpromise(self, session: Session) -> None:
        """§3.4: ``session`` is held to its negotiated interval again (its promise is 0)."""
        if session.promise_ms:
            session.promise_ms = 0
            self._mirrored(session)

    def _mirrored(self, session: Session) -> None:
        """Tell the lane (if any) what its take rule reads of ``session``: it exists, its
        promise, and (a worker's) the silence after which a HEARTBEAT is a gap to log."""
        mirror = self.mirror
        if mirror is None:
            return
        gap_s = 0.0
        channel, routing_id = session.channel, session.routing_id
        if channel is Channel.BACKEND:
            gap_s = GAP_INTERVALS * session.timeout_s / self.core.network.liveness
        # It speaks Majordomo (an S0P HEARTBEAT from it would change that: not the lane's), and
        # how: the lane answers it in that reading (0: S0P)
        reading = self.majordomo.speaks.get((channel, routing_id))
        mirror.note(
            channel,
            routing_id,
            session.promise_ms,
            gap_s,
            session.last_seen,
            0 if reading is None else reading_code(reading),
            session.client_id.encode(),
            session.allowed == "all",
        )

    def remirror(self, channel: Channel, routing_id: bytes) -> None:
        """Tell the lane (if any) of ``routing_id``'s session again: it began to speak
        Majordomo (scale0/core/majordomo.py). When it stops, the lane learns it at the next
        change (until then it passes that session's S0P HEARTBEATs to the core: only slower)."""
        if self.mirror is not None:
            session = self.by_channel[channel].get(routing_id)
            if session is not None:
                self._mirrored(session)

    def mirror_all(self, mirror: MirrorPort | None) -> None:
        """From now on ``mirror`` is the lane's copy (None: no lane); every session is told."""
        self.mirror = mirror
        for sessions in self.by_channel.values():
            for session in sessions.values():
                self._mirrored(session)

    def heard_elsewhere(self, heard: Sequence[tuple[Channel, bytes, float]]) -> None:
        """The lane took these plain HEARTBEATs (channel, routing id, when: in order of when):
        each session is heard then, as :meth:`heard_many` would have heard it. A session ended
        since is not opened again."""
        by_channel = self.by_channel
        for channel, routing_id, when in heard:
            session = by_channel[channel].get(routing_id)
            if session is not None and when >= session.last_seen:
                touch(session, when)

    def _order(self, session: Session, timeout_s: float) -> None:
        """Put ``session`` (just heard) last in the order of its channel and ``timeout_s``."""
        session.timeout_s = timeout_s
        if timeout_s == float("inf"):
            return  # never expires (a worker with heartbeat: false)
        key = (session.channel, timeout_s)
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = {}
        order.pop(session.routing_id, None)
        order[session.routing_id] = session
        session.order = order
        self._arm(session.last_seen + timeout_s)

    @staticmethod
    def _unorder(session: Session) -> None:
        order = session.order
        if order is not None:
            session.order = None
            if order.get(session.routing_id) is session:
                del order[session.routing_id]

    def _arm(self, at: float) -> None:
        """The sweep runs at ``at`` at the latest (an entry already armed earlier stands)."""
        armed = self._expiry_at
        if armed is None or at < armed:
            self._expiry_at = at
            self.core.timers.push(at, ExpiryDue(at))

    def expire(self, key: ExpiryDue, now: float, out: list[Effect]) -> None:
        """R8: every session silent for its timeout ends, at exactly last_seen + timeout_s; then
        the sweep waits for the next one that can be due."""
        if key.at != self._expiry_at:
            return  # superseded by an earlier arming, which has swept already
        self._expiry_at = None
        first: float | None = None
        for (channel, timeout_s), order in list(self._orders.items()):
            while order:
                routing_id, session = next(iter(order.items()))
                expires = session.last_seen + timeout_s
                if expires > now:
                    if first is None or expires < first:
                        first = expires
                    break
                self.forget(channel, routing_id, now, out, "expired")
                if order.get(routing_id) is session:  # forget ends it; never loop on it
                    del order[routing_id]
                    session.order = None
            if not order:
                del self._orders[(channel, timeout_s)]
        if first is not None:
            self._arm(first)

    # ---- CURVE keys and what they may do (scale0/core/trust.py, T1-T4) ----------------------

    def _grants(self, channel: Channel) -> tuple[KeyGrant, ...]:
        network = self.core.network
        return network.clients if channel is Channel.FRONTEND else network.workers

    def authenticated(self, event: Authenticated, wall: float, out: list[Effect]) -> None:
        """The node names a connection's CURVE key: its session's, or the one it opens next."""
        channel = event.channel
        sessions = self.by_channel.get(channel)
        if sessions is None:
            return  # a peer's key: HELLO and ZAP judge peers (T5)
        session = sessions.get(event.routing_id)
        if session is not None:
            session.key = event.key
            session.allowed = allowed(self._grants(channel), event.key, wall)
            return
        if len(self._keys) >= MAX_PENDING_KEYS:
            self._keys.clear()
        self._keys[(channel, event.routing_id)] = event.key

    def regrant(self, now: float, wall: float, out: list[Effect]) -> None:
        """T2 over time: each keyed session's grants again (an ``until`` passed, a new config);
        a client or worker whose key may no longer do anything, or a worker whose key may no
        longer serve what it serves, gets DISCONNECTERROR 403 and its session ends."""
        for channel, sessions in self.by_channel.items():
            grants = self._grants(channel)
            ended: list[tuple[bytes, str]] = []
            for routing_id, session in sessions.items():
                if not session.key and not self.core.curve:
                    continue
                session.allowed = allowed(grants, session.key, wall)
                if not session.allowed:
                    ended.append((routing_id, "its grants have ended"))
                elif channel is Channel.BACKEND:
                    worker = self.ledger.worker(routing_id)
                    denied = (
                        [s for s in worker.services if not self.may(session, s)] if worker else []
                    )
                    if denied:
                        ended.append((routing_id, f"it may no longer serve {', '.join(denied)}"))
            for routing_id, why in ended:
                self.refuse(
                    channel, routing_id, f"CURVE key {sessions[routing_id].key}: {why}", out
                )
                self.forget(channel, routing_id, now, out, "key_refused")

    @staticmethod
    def may(session: Session, service: str) -> bool:
        """T4: whether ``session``'s key may call (serve) ``service``."""
        grant = session.allowed
        return grant == "all" or may_service(grant, service)

    def refuse(self, channel: Channel, routing_id: bytes, why: str, out: list[Effect]) -> None:
        """DISCONNECTERROR 403 to a client or worker, logged with its routing id and key."""
        session = self.by_channel[channel].get(routing_id)
        out.append(Send(channel, routing_id, DisconnectError(403, why, protocol=PROTOCOL[channel])))
        details = {
            "channel": channel.value,
            "routing_id": routing_id.hex(),
            "key": session.key if session is not None else "",
            "reason": why,
        }
        out.append(Log("warning", "key_refused", details))

    def seen(self, channel: Channel, routing_id: bytes, now: float) -> None:
        """Any message from ``routing_id`` keeps its session alive (a worker's REPLY, PARTIAL)."""
        session = self.by_channel[channel].get(routing_id)
        if session is not None:
            touch(session, now)

    def check_config(
        self, channel: Channel, routing_id: bytes, msg: CheckConfig, now: float, out: list[Effect]
    ) -> None:
        """R2, R3: CONFIGACK or CONFIG to an active broker's caller; 503 or 301 otherwise."""
        core = self.core
        protocol = PROTOCOL[channel]
        if core.state is not BrokerState.ACTIVE:
            out.append(Send(channel, routing_id, self.family.not_accepting(protocol, channel)))
            return
        client_id = msg.client_id or f"{core.identity}.{routing_id.hex()}"
        sessions = self.by_channel[channel]
        holder = self._client_ids.get((channel, client_id))
        if holder is not None and holder != routing_id:
            other = sessions.get(holder)
            if other is not None and now - other.last_seen < core.interval_s:
                why = f"client_id {client_id!r} is in use by a live connection"
                out.append(Send(channel, routing_id, DisconnectError(409, why, protocol=protocol)))
                return
            self.forget(channel, holder, now, out, "replaced")
        old = sessions.get(routing_id)
        if (
            old is not None
            and msg.config_version == core.network.config_version
            and now - old.checked < core.interval_s
        ):
            # R21: it holds the running config and asked again within one interval: a flood.
            # Answered as ever, but each one counts towards its error score (R13), so a flood
            # ends in a ban (429) while a client told FORCENEGOTIATE (older version) is not.
            core.counters["checkconfig_repeated"] = core.counters.get("checkconfig_repeated", 0) + 1
            if self.guard.count_error(channel, routing_id, routing_id, now, out):
                return
        if old is None and self.full(channel, routing_id):
            # R20: a new sender past max_sessions; it may try another broker of the family.
            core.counters["sessions_refused"] = core.counters.get("sessions_refused", 0) + 1
            why = f"this broker holds max_sessions ({core.network.max_sessions}) sessions"
            out.append(Send(channel, routing_id, DisconnectError(503, why, protocol=protocol)))
            return
        if old is not None and old.client_id != client_id:
            self._client_ids.pop((channel, old.client_id), None)
        # A renegotiating session keeps the timeout its READY set (R11).
        timeout_s = old.timeout_s if old is not None else None
        session = self._open(channel, routing_id, client_id, now, timeout_s)
        session.checked = now
        if not session.allowed:  # T2, T3: a key with no grant in force
            why = f"CURVE key {session.key or '(none)'} has no grant in force"
            self.refuse(channel, routing_id, why, out)
            self.forget(channel, routing_id, now, out, "key_refused")
            return
        version = session.config_version
        if msg.config_version == version:
            ack = ConfigAck(config_version=version, client_id=client_id, protocol=protocol)
            out.append(Send(channel, routing_id, ack))
            return
        # §3.2: the client view, whose sha256 is the view's. A client or worker that checks
        # signatures itself (``signed``) also gets the view's signature and the whole config's
        # sha256 it binds (§2.5, §6.2); never the whole config, whose admins' scrypt hashes
        # are for brokers only. A config whose source signed no view has no view_signature:
        # the client refuses it, naming that option (scale0/session/trust.py S1).
        signed = msg.signed and core.view_signature is not None
        config = Config(
            config_type=msg.config_type,
            config_version=version,
            sha256=core.client_view_sha256,
            client_id=client_id,
            document=core.client_view(msg.config_type),
            signature=None,
            view_signature=core.view_signature if signed else None,
            config_sha256=core.sha256 if msg.signed else None,
            protocol=protocol,
        )
        out.append(Send(channel, routing_id, config))

    def skewed(
        self,
        channel: Channel,
        routing_id: bytes,
        sent: float,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> bool:
        """R12: True (and DISCONNECTERROR 412, session ended) if ``sent`` is too far from ours."""
        limit = self.core.network.max_clock_skew_s
        skew = abs(sent - wall)
        if skew <= limit:
            return False
        why = f"clock skew {skew:.1f} s is over {limit} s"
        out.append(Send(channel, routing_id, DisconnectError(412, why, protocol=PROTOCOL[channel])))
        self.forget(channel, routing_id, now, out, "clock_skew")
        return True

    def heartbeat(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: Heartbeat,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        """A client's or worker's HEARTBEAT: liveness, skew (R12), its config version (R16),
        its promise (R23)."""
        promise = msg.interval_ms or 0
        self.heard(channel, routing_id, msg.time, msg.config_version, now, wall, out, promise)

    def heard(
        self,
        channel: Channel,
        routing_id: bytes,
        sent: float,
        config_version: int,
        now: float,
        wall: float,
        out: list[Effect],
        interval_ms: int = 0,
    ) -> None:
        """:meth:`heartbeat` given a HEARTBEAT's ``time``, ``config_version`` and
        ``interval_ms`` (0: none): the one copy of its rules, for the typed path and the
        raw-frame one (Broker.handle_heartbeat)."""
        session = self.session(channel, routing_id, now, out)
        if session is None:
            return
        if interval_ms != session.promise_ms and not self.promise(
            channel, session, interval_ms, now, wall, out
        ):
            return
        network = self.core.network
        # R12's check inline (skewed() says it and ends the session): thousands a second.
        if abs(sent - wall) > network.max_clock_skew_s and self.skewed(
            channel, routing_id, sent, now, wall, out
        ):
            return
        version = network.config_version
        if config_version < version:
            why = f"config_version {version} is current"
            out.append(
                Send(channel, routing_id, ForceNegotiate(reason=why, protocol=PROTOCOL[channel]))
            )
            return
        if channel is Channel.FRONTEND:
            # Workers get the broker's own heartbeats on their schedule; clients get an answer,
            # with the client's promise (§3.4). The answers of one batch share wall, version
            # and promise: one message, encoded once (the net layer reuses the frames of a
            # message it has just encoded).
            out.append(Send(channel, routing_id, self._answer_of(session.promise_ms, wall)))

    def _answer_of(self, promise_ms: int, wall: float) -> Heartbeat:
        """The HEARTBEAT answering a client whose promise is ``promise_ms`` (0: none)."""
        version = self.core.network.config_version
        promise = promise_ms or None
        beat = self._answer if promise is None else self._idle_answer
        if beat.time != wall or beat.config_version != version or beat.interval_ms != promise:
            beat = Heartbeat(
                time=wall, config_version=version, interval_ms=promise, protocol=SIG_CLIENT
            )
            if promise is not None:
                self._idle_answer = beat
            else:
                self._answer = beat
        return beat

    def promise(
        self,
        channel: Channel,
        session: Session,
        interval_ms: int,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> bool:
        """R23 (§3.4): a HEARTBEAT's ``interval_ms`` (0: none, the negotiated interval) is its
        sender's promise; the session expires after liveness x it, and an idle worker is beaten
        at it. A value that is not the negotiated interval up to ``idle_heartbeat_interval_ms``
        is malformed (R13: DISCONNECTERROR 400 naming it, the session ends, the sender's error
        score goes up) and False is returned. A worker holding requests is held to its own
        interval whatever it promises."""
        network = self.core.network
        routing_id = session.routing_id
        worker = self.ledger.worker(routing_id) if channel is Channel.BACKEND else None
        normal_s = worker.interval_s if worker is not None else self.core.interval_s
        normal_ms = round(normal_s * 1000)
        if interval_ms:
            idle_ms = network.idle_heartbeat_interval_ms
            why = ""
            if idle_ms == 0:
                why = (
                    f"interval_ms {interval_ms}: idle beating is off (idle_heartbeat_interval_ms 0)"
                )
            elif interval_ms < normal_ms:
                why = f"interval_ms {interval_ms} is below the negotiated interval ({normal_ms})"
            elif interval_ms > max(idle_ms, normal_ms):
                why = f"interval_ms {interval_ms} is above idle_heartbeat_interval_ms ({idle_ms})"
            if why:
                error = ProtocolError.malformed(FRAME_OPTIONS, why)
                event = Malformed(channel, routing_id, error, PROTOCOL[channel])
                self.guard.malformed(event, now, out)
                return False
        promise_ms = interval_ms if interval_ms != normal_ms else 0
        if worker is not None and self.ledger.used(worker):
            promise_ms = 0  # it has work: its own interval (the dispatch said so, §3.4)
        if promise_ms == session.promise_ms:
            return True
        session.promise_ms = promise_ms
        self._mirrored(session)
        if worker is None or worker.heartbeat:
            self.set_timeout(session, network.liveness * (promise_ms / 1000 or normal_s))
        if worker is not None:
            self.dispatch.promised(worker, promise_ms / 1000, now, wall, out)
        return True

    def heard_many(
        self,
        channel: Channel,
        beats: Sequence[Beat],
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        """:meth:`heard` for each ``(routing_id, sent, config_version, interval_ms)`` in order.
        The usual HEARTBEAT (a session, the clock within R12, the running version, the promise
        it made before, no gap) is taken here in a few steps; any other goes to :meth:`heard`
        itself, the one copy of the rules."""
        sessions = self.by_channel[channel]
        network = self.core.network
        limit = network.max_clock_skew_s
        version = network.config_version
        frontend = channel is Channel.FRONTEND
        liveness = network.liveness
        heard = self.heard
        answer_of = self._answer_of
        for routing_id, sent, config_version, interval_ms in beats:
            session = sessions.get(routing_id)
            if (
                session is None
                or abs(sent - wall) > limit
                or config_version < version
                or interval_ms != session.promise_ms
            ):
                heard(channel, routing_id, sent, config_version, now, wall, out, interval_ms)
                continue
            if frontend:
                touch(session, now)
                out.append(Send(channel, routing_id, answer_of(interval_ms, wall)))
            else:
                heartbeat_gap(
                    out, routing_id, now - session.last_seen, session.timeout_s / liveness
                )
                touch(session, now)

    def disconnect(
        self,
        channel: Channel,
        routing_id: bytes,
        msg: Disconnect,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.forget(channel, routing_id, now, out, "disconnect")

    def forget(
        self, channel: Channel, routing_id: bytes, now: float, out: list[Effect], reason: str
    ) -> None:
        """End ``routing_id``'s session on ``channel``; a worker's requests go elsewhere (R8)."""
        session = self.by_channel.get(channel, {}).pop(routing_id, None)
        if session is not None:
            self._unorder(session)
            if self.mirror is not None:
                self.mirror.forget(channel, routing_id)
        if session is not None and self._client_ids.get((channel, session.client_id)) == routing_id:
            del self._client_ids[(channel, session.client_id)]
        if session is not None and session.key:
            # The connection may negotiate again: with the same key (the node says it once).
            if len(self._keys) >= MAX_PENDING_KEYS:
                self._keys.clear()
            self._keys[(channel, routing_id)] = session.key
        if channel is Channel.BACKEND:
            silent_s = now - session.last_seen if session is not None else 0.0
            self.dispatch.worker_lost(routing_id, now, out, reason, silent_s)

    def renegotiate_all(self, why: str, out: list[Effect]) -> None:
        """F10: a new config runs; every client and worker is told FORCENEGOTIATE."""
        for channel, sessions in self.by_channel.items():
            message = ForceNegotiate(reason=why, protocol=PROTOCOL[channel])
            out.extend(Send(channel, routing_id, message) for routing_id in sessions)

    def disconnect_all(self, out: list[Effect]) -> None:
        """R17: shutdown tells every client and worker DISCONNECT."""
        for channel, sessions in self.by_channel.items():
            message = Disconnect(protocol=PROTOCOL[channel])
            out.extend(Send(channel, routing_id, message) for routing_id in sessions)
