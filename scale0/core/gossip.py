"""SWIM-style membership of a gossip family (``family_topology: gossip``, docs/protocol.md §5.6).

A full mesh costs each broker a HEARTBEAT and a table pull per peer per interval, and a config
change costs the family N² messages at once (docs/scaling.md). Here each broker probes one
member per interval, asks a few others to probe it when it does not answer, suspects before it
declares dead, and spreads what it learns on the probes themselves, a bounded number of rows per
message: per broker, the cost stays flat as the family grows (docs/scaling.md measures both).
Links still open with HELLO (F1, F2) and carry forwarded requests (F6-F9) and CHECKCONFIG.

Pure, like every room: the probe order comes from a generator seeded with the broker's identity,
time from the caller. :class:`Gossip` is owned by scale0/core/family.py, which performs what
membership decides about a peer (its table, its forwarded requests, the logs).

Rules (tests/core/test_gossip.py names a test after each):
 G1  Each interval a broker probes ONE member: the next in its shuffled list of the members it is
     linked to and does not hold dead (shuffled again after each pass). PING goes on our link;
     the member answers ACK with the same seq on its ROUTER.
 G2  A member's status moves only by MEMBER_TRANSITIONS (scale0/core/states.py).
 G3  A row counts by its incarnation: alive only above ours; suspect at ours or above while we
     hold the member alive, above ours while we hold it suspect; dead at ours or above while we
     do not hold it dead, above ours while we do. Any other row is stale and changes nothing.
 G4  No ACK half an interval after the PING: PINGREQ to up to INDIRECT other linked members we
     hold alive; one that gets the target's ACK relays an ACK to us. No ACK, direct or
     relayed, by the next probe: the target is suspect (PROBE_FAILED).
 G5  A suspect not refuted within liveness x interval x max(1, log10 N) is dead: F3 follows (its
     table dropped, peer_lost, what we forwarded to it routed again, but only once every member
     found dead in the same pass, a period's verdicts or one message's rows, is down).
 G6  A row saying we are suspect or dead, at our incarnation or above, is refuted: our
     incarnation goes past it, and our alive row goes out with every message.
 G7  Our own row (state, config version, the services we offer with their capacity) is in every
     PING, PINGREQ and ACK we send; any change to it raises our incarnation. The first
     incarnation is the wall clock at start in ms, so a restarted broker outranks its past.
 G8  A message carries at most PIGGYBACK rows besides our own: first what we hold of the
     receiver if it is not alive (so it can refute), then the rows sent the fewest times; each
     row we learn is sent RETRANSMIT x ceil(log10(N + 1)) times. While rows wait to be sent,
     each half interval also PINGs up to FANOUT random linked members (their ACKs carry their
     rows back). Nothing goes to every peer at once: a config change is one row each.
 G9  A row naming a config version above ours makes us CHECKCONFIG the member it is about (else
     the sender), once per version per interval (F4).
 G10 A member's alive row replaces our copy of its table: one entry per service, its capacity
     less our requests it holds or has not received yet counted as free slots (F6, as F16);
     then waiting requests may go to it (F9).
 G11 No HEARTBEAT on links and no TABLE: F3's silence rule and F5 are replaced by G1-G10. HELLO
     still opens every link (F1, F2); once answered, a PING goes on it at once (join).
 G12 A member whose link has not answered HELLO for liveness x interval since we first held it
     (it never started, or cannot be reached from here) is probed in its turn too: no PING can
     go, so others are asked (G4) and, unanswered, the probe fails as any other: a member of
     the config that never came up ends dead, not alive for ever. Its first alive row, at the
     incarnation it starts with (G7), brings it back.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from scale0.core.context import Core
from scale0.core.effects import Channel, Effect, Log, Send
from scale0.core.peers import Peer
from scale0.core.states import MEMBER_TRANSITIONS, MemberInput
from scale0.core.timers import Periodic
from scale0.wire.gossip import Ack, MemberRow, MemberStatus, Ping, PingReq

__all__ = ["FANOUT", "INDIRECT", "PIGGYBACK", "RETRANSMIT", "Gossip", "GossipHost", "news"]

#: Members asked to probe a target that did not answer (G4); SWIM's k.
INDIRECT: Final = 3
#: Rows a message carries besides the sender's own (G8).
PIGGYBACK: Final = 6
#: Each row learnt is sent this many times x ceil(log10(N + 1)) (G8; memberlist's default).
RETRANSMIT: Final = 4
#: Members PINGed each half interval while rows wait to be spread (G8; memberlist's gossip).
FANOUT: Final = 3

AL, SU, DE = MemberStatus.ALIVE, MemberStatus.SUSPECT, MemberStatus.DEAD


def news(row: MemberRow, held: MemberStatus, incarnation: int) -> MemberInput | None:
    """G3: what ``row`` means to a member we hold as ``held`` at ``incarnation`` (None: stale)."""
    if row.status is AL:
        return MemberInput.ALIVE_NEWER if row.incarnation > incarnation else None
    if row.status is SU:
        if held is AL and row.incarnation >= incarnation:
            return MemberInput.SUSPECT_NEWS
        if held is SU and row.incarnation > incarnation:
            return MemberInput.SUSPECT_NEWS
        return None
    if row.incarnation > incarnation or (held is not DE and row.incarnation == incarnation):
        return MemberInput.DEAD_NEWS
    return None


class GossipHost(Protocol):
    """What membership asks of the family (scale0/core/family.py)."""

    peers: dict[str, Peer]

    def member_down(
        self, peer: Peer, now: float, out: list[Effect], reason: str, *, reroute: bool
    ) -> None: ...

    def member_reroute(self, peer: Peer, now: float, out: list[Effect]) -> None: ...

    def member_back(self, peer: Peer, now: float, out: list[Effect]) -> None: ...

    def services_in(
        self, peer: Peer, offered: tuple[tuple[str, int], ...], now: float, out: list[Effect]
    ) -> None: ...

    def config_version(self) -> int: ...

    def check_config(self, peer: Peer, out: list[Effect]) -> None: ...


@dataclass(slots=True)
class _Probe:
    target: str
    seq: int
    acked: bool = False


@dataclass(slots=True)
class _Relay:
    """A PINGREQ we act on: whom to tell (its routing id at our ROUTER, its seq), and when."""

    requester: bytes
    requester_id: str
    seq: int
    target: str
    at: float


class Gossip:
    """This broker's side of SWIM: its incarnation, probes, relays and rows to spread."""

    def __init__(self, core: Core, host: GossipHost) -> None:
        self.core = core
        self.host = host
        seed = int.from_bytes(hashlib.sha256(core.identity.encode()).digest()[:8], "big")
        self.rng = random.Random(seed)  # noqa: S311 (probe order, not secrets)
        self.incarnation = 0
        self.offered: tuple[tuple[str, int], ...] = ()  # our services and their capacity
        self._facts: tuple[object, ...] | None = None  # what our row said last (G7)
        self._order: list[str] = []
        self._seq = 0
        self.probe: _Probe | None = None
        self.relays: dict[int, _Relay] = {}
        self.rows: dict[str, tuple[MemberRow, int]] = {}  # broker_id -> (row, times sent)
        self.suspects: dict[str, float] = {}  # broker_id -> since
        self._asked: dict[int, float] = {}  # config version -> when we CHECKCONFIGed for it
        self._held_since: dict[str, float] = {}  # broker_id -> when a period first held it (G12)
        # Members declared dead in one pass (a period's verdicts, one message's rows): what
        # they held is routed again only once all are down (F3), never to one of them.
        self._downed: list[Peer] | None = None

    def _begin(self) -> None:
        self._downed = []

    def _end(self, now: float, out: list[Effect]) -> None:
        downed, self._downed = self._downed or [], None
        for peer in downed:
            self.host.member_reroute(peer, now, out)

    # ---- our own row (G6, G7) ----------------------------------------------------------------

    def own_row(self, wall: float) -> MemberRow:
        core = self.core
        facts = (core.state, self.host.config_version(), self.offered)
        if self.incarnation == 0:
            self.incarnation = max(1, int(wall * 1000))
        elif facts != self._facts:
            self.incarnation += 1
        self._facts = facts
        return MemberRow(core.identity, AL, self.incarnation, core.state, facts[1], self.offered)

    def _refute(self, row: MemberRow, wall: float) -> None:
        if row.status is not AL and row.incarnation >= self.incarnation:
            self.own_row(wall)
            self.incarnation = row.incarnation + 1

    # ---- rows to spread (G8) -----------------------------------------------------------------

    def _limit(self) -> int:
        return RETRANSMIT * max(1, math.ceil(math.log10(len(self.host.peers) + 2)))

    def _row_of(self, peer: Peer) -> MemberRow:
        return MemberRow(
            peer.broker_id,
            peer.member,
            peer.incarnation,
            peer.state,
            peer.config_version,
            peer.offered,
        )

    def _spread(self, peer: Peer) -> None:
        self.rows[peer.broker_id] = (self._row_of(peer), 0)

    def _rows_for(self, receiver: str, wall: float) -> tuple[MemberRow, ...]:
        rows = [self.own_row(wall)]
        peer = self.host.peers.get(receiver)
        if peer is not None and peer.member is not AL:
            rows.append(self._row_of(peer))
        if self.rows:
            limit = self._limit()
            # Fewest times sent first; ties by name, so a run is reproducible.
            chosen = sorted(self.rows.items(), key=lambda item: (item[1][1], item[0]))
            for broker_id, (row, sent) in chosen[:PIGGYBACK]:
                if broker_id == receiver and peer is not None and peer.member is not AL:
                    continue  # already first
                rows.append(row)
                if sent + 1 >= limit:
                    del self.rows[broker_id]
                else:
                    self.rows[broker_id] = (row, sent + 1)
        return tuple(rows)

    # ---- rows received (G2, G3, G9, G10) ---------------------------------------------------

    def merge(
        self, sender: Peer, rows: Sequence[MemberRow], now: float, wall: float, out: list[Effect]
    ) -> None:
        identity = self.core.identity
        peers = self.host.peers
        self._begin()
        for row in rows:
            if row.broker_id == identity:
                self._refute(row, wall)
                continue
            peer = peers.get(row.broker_id)
            if peer is None:
                continue  # not a member of our config
            change = news(row, peer.member, peer.incarnation)
            if change is None:
                continue
            self.step(peer, change, now, out, row=row)
            self._spread(peer)
            if row.status is AL:
                self._config_seen(peer, sender, row.config_version, now, out)
        self._end(now, out)

    def step(
        self,
        peer: Peer,
        change: MemberInput,
        now: float,
        out: list[Effect],
        *,
        row: MemberRow | None = None,
        reason: str = "silent",
    ) -> None:
        """G2: move ``peer`` by the table; what the move means for the family follows."""
        before = peer.member
        after = MEMBER_TRANSITIONS[before, change]
        if row is not None:
            peer.incarnation = row.incarnation
        if after is DE and before is not DE:
            self.suspects.pop(peer.broker_id, None)
            deferred = self._downed is not None
            self.host.member_down(peer, now, out, reason, reroute=not deferred)  # DEAD by LEFT
            if self._downed is not None:
                self._downed.append(peer)
        peer.member = after
        if after is SU:
            if before is not SU:
                self.suspects[peer.broker_id] = now
                details = {"peer": peer.broker_id, "incarnation": peer.incarnation}
                out.append(Log("info", "peer_suspect", details))
        else:
            self.suspects.pop(peer.broker_id, None)
        if row is not None and row.status is AL:
            peer.state = row.state
            peer.config_version = row.config_version
            if before is DE:
                self.host.member_back(peer, now, out)
            if row.services != peer.offered or before is DE:
                self.host.services_in(peer, row.services, now, out)

    def left(self, peer: Peer) -> None:
        """The family's own verdict (DISCONNECT, restart, clock skew, removal): dead now."""
        peer.member = MEMBER_TRANSITIONS[peer.member, MemberInput.LEFT]
        self.suspects.pop(peer.broker_id, None)

    def _config_seen(
        self, peer: Peer, sender: Peer, version: int, now: float, out: list[Effect]
    ) -> None:
        """G9: a member runs a newer config: CHECKCONFIG it (else the sender), once a while."""
        if version <= self.host.config_version():
            return
        asked = self._asked.get(version)
        if asked is not None and now - asked < self.core.interval_s:
            return
        ask = peer if peer.linked else sender
        if ask.linked:
            self._asked = {version: now}
            self.host.check_config(ask, out)

    # ---- probing (G1, G4, G5) --------------------------------------------------------------

    def _next_target(self, now: float) -> Peer | None:
        """G1, G12: the next member in the shuffled order we may probe now."""
        peers = self.host.peers
        held = self._held_since
        for broker_id in peers:
            held.setdefault(broker_id, now)
        for broker_id in [b for b in held if b not in peers]:
            del held[broker_id]
        grace = self.core.network.liveness * self.core.interval_s
        for _ in range(2):
            while self._order:
                peer = peers.get(self._order.pop())
                if peer is None or peer.member is DE:
                    continue
                if peer.linked or now - held[peer.broker_id] >= grace:
                    return peer
            self._order = sorted(peers)
            self.rng.shuffle(self._order)
        return None

    def _ping(self, peer: Peer, wall: float, out: list[Effect]) -> int:
        self._seq += 1
        ping = Ping(
            self.core.identity,
            self._seq,
            peer.broker_id,
            wall,
            self._rows_for(peer.broker_id, wall),
        )
        out.append(Send(Channel.LINK, peer.broker_id.encode(), ping))
        return self._seq

    def join(self, peer: Peer, wall: float, out: list[Effect]) -> None:
        """G11: a link just answered our HELLO: exchange rows with the peer at once."""
        self._ping(peer, wall, out)

    def period(self, now: float, wall: float, out: list[Effect]) -> None:
        """Every interval: judge the last probe, expire suspicions, probe the next member."""
        self._begin()
        probe = self.probe
        if probe is not None and not probe.acked:
            peer = self.host.peers.get(probe.target)
            if peer is not None and peer.member is not DE:
                self.step(peer, MemberInput.PROBE_FAILED, now, out)
                self._spread(peer)
        timeout = self.suspicion_s()
        for broker_id, since in list(self.suspects.items()):
            peer = self.host.peers.get(broker_id)
            if peer is None:
                del self.suspects[broker_id]
            elif now - since >= timeout:
                self.step(peer, MemberInput.SUSPICION_EXPIRED, now, out)
                self._spread(peer)
        self._end(now, out)
        for seq in [s for s, r in self.relays.items() if now - r.at >= self.core.interval_s]:
            del self.relays[seq]
        self.probe = None
        target = self._next_target(now)
        if target is not None:
            if target.linked:
                seq = self._ping(target, wall, out)
            else:  # G12: no link to PING on; the others are asked at half interval (G4)
                self._seq += 1
                seq = self._seq
            self.probe = _Probe(target.broker_id, seq)
            self.core.timers.push(now + self.core.interval_s / 2, Periodic.GOSSIP)
        self._fan_out(wall, out)

    def _fan_out(self, wall: float, out: list[Effect]) -> None:
        """G8: rows wait to be spread: PING up to FANOUT random members (not the target)."""
        if not self.rows:
            return
        probe = self.probe.target if self.probe is not None else None
        others = [
            b for b, p in self.host.peers.items() if b != probe and p.linked and p.member is AL
        ]
        if len(others) > FANOUT:
            others = self.rng.sample(sorted(others), FANOUT)
        for broker_id in others:
            if not self.rows:
                return
            self._ping(self.host.peers[broker_id], wall, out)

    def suspicion_s(self) -> float:
        """G5: liveness x interval, longer in a larger family (as memberlist scales it)."""
        core = self.core
        scale = max(1.0, math.log10(len(self.host.peers) + 1))
        return core.network.liveness * core.interval_s * scale

    def indirect(self, now: float, wall: float, out: list[Effect]) -> None:
        """G4: half an interval and no ACK: ask up to INDIRECT others to probe the target."""
        self._fan_out(wall, out)
        probe = self.probe
        if probe is None or probe.acked:
            return
        helpers = [
            p
            for b, p in self.host.peers.items()
            if b != probe.target and p.linked and p.member is AL
        ]
        if len(helpers) > INDIRECT:
            helpers = self.rng.sample(sorted(helpers, key=lambda p: p.broker_id), INDIRECT)
        identity = self.core.identity
        for helper in helpers:
            rows = self._rows_for(helper.broker_id, wall)
            ask = PingReq(identity, probe.seq, probe.target, wall, rows)
            out.append(Send(Channel.LINK, helper.broker_id.encode(), ask))

    # ---- what peers say (G1, G4) -----------------------------------------------------------

    def ping_in(
        self,
        peer: Peer,
        routing_id: bytes,
        msg: Ping,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.merge(peer, msg.members, now, wall, out)
        ack = Ack(
            self.core.identity,
            msg.seq,
            self.core.identity,
            wall,
            self._rows_for(peer.broker_id, wall),
        )
        out.append(Send(Channel.PEER, routing_id, ack))

    def ping_req_in(
        self,
        peer: Peer,
        routing_id: bytes,
        msg: PingReq,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        self.merge(peer, msg.members, now, wall, out)
        target = self.host.peers.get(msg.target)
        if target is None or not target.linked or msg.target == self.core.identity:
            return
        seq = self._ping(target, wall, out)
        self.relays[seq] = _Relay(routing_id, peer.broker_id, msg.seq, msg.target, now)

    def ack_in(self, peer: Peer, msg: Ack, now: float, wall: float, out: list[Effect]) -> None:
        self.merge(peer, msg.members, now, wall, out)
        probe = self.probe
        if probe is not None and msg.seq == probe.seq and msg.target == probe.target:
            probe.acked = True
            return
        relay = self.relays.get(msg.seq)
        if relay is not None and relay.target == peer.broker_id == msg.target:
            del self.relays[msg.seq]
            rows = self._rows_for(relay.requester_id, wall)
            ack = Ack(self.core.identity, relay.seq, relay.target, wall, rows)
            out.append(Send(Channel.PEER, relay.requester, ack))
