"""The lane's take rule for plain HEARTBEATs is :meth:`Sessions.heard_many`'s fast path, and
what Sessions tells its mirror is all that rule needs (scale0/net/lane.py, docs/architecture.md).

Two brokers on the same fake clock hear the same clients and workers. Broker A handles every
message itself. Broker B has a mirror, :class:`ModelLane`, the lane's rule written in Python
from scale0/net/_lane.c's description: a HEARTBEAT the model takes never reaches B (B hears of
it through ``heard_elsewhere`` before its next event, as the node tells it at the start of every
round, and the model answers a client's as the lane does); every other message goes to B. At
every step both must give the same effects, and at the end the same sessions: a beat taken
from the core would otherwise answer, log or expire differently.

Majordomo workers (scale0/wire/mdp.py, 7/MDP and 18/MDP) play too: their READY, HEARTBEAT,
final reply and DISCONNECT, typed, from the same routing ids as the S0P peers. The lane takes a
Majordomo worker HEARTBEAT (the frames the decoder reads as one: tests/net/test_lane.py) from any
backend session, with no other check, because Majordomo.worker_heartbeat only marks it seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.core.effects import Channel, Effect, Send
from scale0.wire.client import Disconnect, Heartbeat
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER
from scale0.wire.mdp import (
    MDPW01,
    MDPW02,
    MdpWorkerDisconnect,
    MdpWorkerHeartbeat,
    MdpWorkerReady,
    MdpWorkerReply,
    MdpWorkerRequest,
)
from scale0.wire.worker import Ready, WorkerRequest
from tests.core.harness import BACK, FRONT, Harness, sends

RIDS = (b"\x00a", b"\x00b", b"\x00c")
#: The Majordomo readings a worker frames its messages in: (signature, empty frame 0?).
READINGS = ((MDPW01, True), (MDPW02, True), (MDPW02, False))


def dispatched(effects: list[Effect]) -> list[tuple[bytes, bytes]]:
    """(worker routing id, ticket) for every request handed to a worker, S0P or Majordomo."""
    return [
        (rid, message.ticket)
        for rid, message in sends(effects, BACK)
        if isinstance(message, (WorkerRequest, MdpWorkerRequest))
    ]


@dataclass
class Entry:
    promise_ms: int
    gap_s: float
    last_seen: float
    majordomo: bool = False


@dataclass
class ModelLane:
    """The lane's session table and take rule (a MirrorPort), in Python."""

    version: int = 0
    skew_s: float = 0.0
    table: dict[tuple[Channel, bytes], Entry] = field(default_factory=dict)
    heard: list[tuple[Channel, bytes, float]] = field(default_factory=list)
    notes: int = 0

    def note(
        self,
        channel: Channel,
        routing_id: bytes,
        promise_ms: int,
        gap_s: float,
        last_seen: float,
        majordomo: int,
        client_id: bytes,
        open: bool,
    ) -> None:
        self.notes += 1
        old = self.table.get((channel, routing_id))
        seen = last_seen if old is None else max(old.last_seen, last_seen)
        self.table[(channel, routing_id)] = Entry(promise_ms, gap_s, seen, bool(majordomo))

    def forget(self, channel: Channel, routing_id: bytes) -> None:
        self.table.pop((channel, routing_id), None)

    def receive(
        self,
        channel: Channel,
        rid: bytes,
        beat: Heartbeat | MdpWorkerHeartbeat | None,
        now: float,
        wall: float,
    ) -> list[Effect] | None:
        """A message from ``rid``: the lane's effects if it takes it (a plain HEARTBEAT
        ``beat``, S0P or a Majordomo worker's), None if it passes it on. Either way its entry
        was heard ``now``."""
        entry = self.table.get((channel, rid))
        if entry is None:
            return None
        previous, entry.last_seen = entry.last_seen, now
        if beat is None:
            return None
        if isinstance(beat, MdpWorkerHeartbeat):
            if channel is not BACK:
                return None
            self.heard.append((channel, rid, now))  # Majordomo.worker_heartbeat: seen, no more
            return []
        if (
            entry.majordomo  # it speaks Majordomo: the core would note it speaks S0P now
            or abs(beat.time - wall) > self.skew_s
            or beat.config_version < self.version
            or (beat.interval_ms or 0) != entry.promise_ms
            or (channel is BACK and entry.gap_s and now - previous > entry.gap_s)
        ):
            return None
        self.heard.append((channel, rid, now))
        if channel is BACK:
            return []
        answer = Heartbeat(
            time=wall,
            config_version=self.version,
            interval_ms=entry.promise_ms or None,
            protocol=SIG_CLIENT,
        )
        return [Send(FRONT, rid, answer)]


Op = tuple[object, ...]

OPS = st.one_of(
    st.tuples(st.just("client"), st.sampled_from(RIDS)),
    st.tuples(
        st.just("worker"),
        st.sampled_from(RIDS),
        st.sampled_from((1000, 2000)),
        st.booleans(),
    ),
    st.tuples(
        st.just("beat"),
        st.sampled_from((FRONT, BACK)),
        st.sampled_from(RIDS),
        st.sampled_from((None, 1000, 2000, 3000, 5000)),
        st.sampled_from((0.0, 0.0, 0.0, 100.0)),
        st.sampled_from((3, 3, 3, 2, 4)),
    ),
    st.tuples(
        st.just("ready"),
        st.sampled_from(RIDS),
        st.sampled_from((1000, 2000)),
        st.booleans(),
    ),
    st.tuples(st.just("request"), st.sampled_from(RIDS)),
    st.tuples(st.just("reply"), st.sampled_from(RIDS)),
    st.tuples(st.just("advance"), st.sampled_from((0.3, 1.0, 2.5, 6.0))),
    st.tuples(st.just("bye"), st.sampled_from((FRONT, BACK)), st.sampled_from(RIDS)),
    # Majordomo workers: READY, HEARTBEAT (most often), final reply, DISCONNECT, typed
    st.tuples(st.just("mdp_ready"), st.sampled_from(RIDS), st.sampled_from(READINGS)),
    st.tuples(st.just("mdp_beat"), st.sampled_from(RIDS), st.sampled_from(READINGS)),
    st.tuples(st.just("mdp_beat"), st.sampled_from(RIDS), st.sampled_from(READINGS)),
    st.tuples(st.just("mdp_reply"), st.sampled_from(RIDS), st.sampled_from(READINGS)),
    st.tuples(st.just("mdp_bye"), st.sampled_from(RIDS), st.sampled_from(READINGS)),
)


class Twins:
    def __init__(self) -> None:
        self.a = Harness()
        self.b = Harness()
        self.lane = ModelLane()
        self.b.broker.mirror_sessions(self.lane)
        self.tickets: dict[bytes, list[bytes]] = {}
        self.next_id = 0
        self.mdp_taken = 0  # Majordomo worker HEARTBEATs the model took

    def _configure(self) -> None:
        network = self.b.broker.network
        self.lane.version = network.config_version
        self.lane.skew_s = network.max_clock_skew_s

    def _round(self) -> None:
        """The node's round start: what the lane heard goes to the core first."""
        heard, self.lane.heard = self.lane.heard, []
        if heard:
            self.b.broker.heard_elsewhere(heard)

    def step(self, op: Op) -> None:
        self._round()
        self._configure()
        kind = op[0]
        a, b = self.a, self.b
        out_a: list[Effect]
        out_b: list[Effect] | None
        if kind == "advance":
            seconds = float(op[1])  # type: ignore[arg-type]
            out_a, out_b = a.advance(seconds), b.advance(seconds)
        elif kind == "client":
            rid = op[1]
            assert isinstance(rid, bytes)
            self.lane.receive(FRONT, rid, None, b.now, b.wall)
            out_a, out_b = a.client(rid), b.client(rid)
        elif kind == "worker":
            rid, interval, heartbeat = op[1], op[2], op[3]
            assert isinstance(rid, bytes) and isinstance(interval, int)
            assert isinstance(heartbeat, bool)
            self.lane.receive(BACK, rid, None, b.now, b.wall)
            out_a = a.worker(rid, interval_ms=interval, heartbeat=heartbeat)
            self.lane.receive(BACK, rid, None, b.now, b.wall)
            out_b = b.worker(rid, interval_ms=interval, heartbeat=heartbeat)
        elif kind == "ready":  # READY again: services or interval changed live
            rid, interval, heartbeat = op[1], op[2], op[3]
            assert isinstance(rid, bytes) and isinstance(interval, int)
            assert isinstance(heartbeat, bool)
            ready = Ready(
                services=("echo",),
                heartbeat=heartbeat,
                hbeatinterval_ms=interval,
                time=b.wall,
                config_version=3,
                capacity=1,
            )
            self.lane.receive(BACK, rid, None, b.now, b.wall)
            out_a, out_b = a.send(BACK, rid, ready), b.send(BACK, rid, ready)
        elif kind == "beat":
            channel, rid, promise, skew, version = op[1:]
            assert isinstance(channel, Channel) and isinstance(rid, bytes)
            assert promise is None or isinstance(promise, int)
            assert isinstance(skew, float) and isinstance(version, int)
            protocol = SIG_CLIENT if channel is FRONT else SIG_WORKER
            beat = Heartbeat(
                time=b.wall + skew, config_version=version, interval_ms=promise, protocol=protocol
            )
            out_a = a.heartbeat(channel, rid, version=version, skew=skew, promise=promise)
            out_b = self.lane.receive(channel, rid, beat, b.now, b.wall)
            if out_b is None:
                out_b = b.heartbeat(channel, rid, version=version, skew=skew, promise=promise)
        elif kind == "request":
            rid = op[1]
            assert isinstance(rid, bytes)
            self.next_id += 1
            request_id = b"r%d" % self.next_id
            self.lane.receive(FRONT, rid, None, b.now, b.wall)
            out_a, out_b = a.request(rid, request_id), b.request(rid, request_id)
        elif kind.startswith("mdp_"):
            rid, reading = op[1], op[2]
            assert isinstance(rid, bytes) and isinstance(reading, tuple)
            protocol, delimited = reading
            message: MdpWorkerReady | MdpWorkerHeartbeat | MdpWorkerReply | MdpWorkerDisconnect
            if kind == "mdp_ready":
                message = MdpWorkerReady("echo", protocol=protocol, delimited=delimited)
            elif kind == "mdp_beat":
                message = MdpWorkerHeartbeat(protocol=protocol, delimited=delimited)
            elif kind == "mdp_reply":
                tickets = self.tickets.get(rid) or [b"none"]
                ticket = tickets.pop(0)
                message = MdpWorkerReply(ticket, (b"ok",), protocol=protocol, delimited=delimited)
            else:
                message = MdpWorkerDisconnect(protocol=protocol, delimited=delimited)
            out_a = a.send(BACK, rid, message)
            beat = message if isinstance(message, MdpWorkerHeartbeat) else None
            out_b = self.lane.receive(BACK, rid, beat, b.now, b.wall)
            if out_b is None:
                out_b = b.send(BACK, rid, message)
            else:
                self.mdp_taken += 1
        elif kind == "reply":
            rid = op[1]
            assert isinstance(rid, bytes)
            tickets = self.tickets.get(rid) or [b"none"]
            ticket = tickets.pop(0)
            self.lane.receive(BACK, rid, None, b.now, b.wall)
            out_a, out_b = a.reply(rid, ticket), b.reply(rid, ticket)
        else:  # "bye": DISCONNECT
            channel, rid = op[1], op[2]
            assert isinstance(channel, Channel) and isinstance(rid, bytes)
            protocol = SIG_CLIENT if channel is FRONT else SIG_WORKER
            self.lane.receive(channel, rid, None, b.now, b.wall)
            out_a = a.send(channel, rid, Disconnect(protocol=protocol))
            out_b = b.send(channel, rid, Disconnect(protocol=protocol))
        for worker, ticket in dispatched(out_a):
            self.tickets.setdefault(worker, []).append(ticket)
        assert out_b == out_a, f"after {op}"

    def same_sessions(self) -> None:
        self._round()
        for channel in (FRONT, BACK):
            mine = self.a.broker.sessions.by_channel[channel]
            theirs = self.b.broker.sessions.by_channel[channel]
            assert set(mine) == set(theirs)
            for rid, session in mine.items():
                other = theirs[rid]
                assert (other.last_seen, other.promise_ms, other.timeout_s) == (
                    session.last_seen,
                    session.promise_ms,
                    session.timeout_s,
                )
                entry = self.lane.table[(channel, rid)]
                assert entry.promise_ms == session.promise_ms
                if channel is BACK:
                    gap = 2 * session.timeout_s / self.b.broker.network.liveness
                    assert entry.gap_s == gap or (math.isinf(gap) and math.isinf(entry.gap_s))
        assert set(self.lane.table) == {
            (channel, rid)
            for channel in (FRONT, BACK)
            for rid in self.b.broker.sessions.by_channel[channel]
        }


@settings(max_examples=600, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=40))
def test_the_lane_takes_a_heartbeat_only_where_the_core_would_do_nothing_else(
    ops: list[Op],
) -> None:
    twins = Twins()
    for op in ops:
        twins.step(op)
    twins.same_sessions()


def test_a_taken_beat_keeps_an_idle_client_alive_through_the_sweep() -> None:
    """The sweep reads what the lane heard: a client beating only through the lane is not
    expired, and one that stops is expired at exactly liveness x interval after its last."""
    twins = Twins()
    rid = RIDS[0]
    twins.step(("client", rid))
    twins.step(("beat", FRONT, rid, None, 0.0, 3))
    for _ in range(5):
        twins.step(("advance", 1.0))
        twins.step(("beat", FRONT, rid, None, 0.0, 3))
    assert len(twins.lane.heard) == 1  # the last one taken, not yet told to the core
    twins.step(("advance", 2.9))
    assert twins.b.broker.stats()["clients"] == 1
    twins.step(("advance", 0.1))
    assert twins.b.broker.stats()["clients"] == 0
    twins.same_sessions()


def test_the_mirror_hears_every_session_when_the_lane_starts_and_nothing_after() -> None:
    h = Harness()
    h.client(RIDS[0])
    h.worker(RIDS[1])
    lane = ModelLane()
    h.broker.mirror_sessions(lane)
    assert set(lane.table) == {(FRONT, RIDS[0]), (BACK, RIDS[1])}
    h.broker.mirror_sessions(None)
    h.client(RIDS[2])
    assert (FRONT, RIDS[2]) not in lane.table


def test_a_worker_without_heartbeats_given_work_or_ready_is_unpromised_in_the_lane() -> None:
    """A worker with ``heartbeat: false`` keeps an infinite timeout whatever it promises, so no
    set_timeout tells the lane when its promise ends: the dispatch (§3.4) and a READY must."""
    worker, client = RIDS[0], RIDS[1]
    for ending in (("request", client), ("ready", worker, 1000, False)):
        twins = Twins()
        twins.step(("worker", worker, 1000, False))
        twins.step(("client", client))
        twins.step(("beat", BACK, worker, 5000, 0.0, 3))
        assert twins.lane.table[(BACK, worker)].promise_ms == 5000
        twins.step(ending)
        assert twins.lane.table[(BACK, worker)].promise_ms == 0
        twins.step(("beat", BACK, worker, 5000, 0.0, 3))  # Python's again: a new promise
        twins.same_sessions()


def test_a_majordomo_worker_beating_only_through_the_lane_outlives_its_timeout() -> None:
    """Each reading: a Majordomo worker whose beats the lane takes is not expired (the core
    hears them through heard_elsewhere), serves a request, and one that stops is expired at
    exactly liveness x interval after its last beat; a beat from a routing id with no backend
    session goes to the core, which answers DISCONNECT."""
    for reading in READINGS:
        twins = Twins()
        worker, client = RIDS[0], RIDS[1]
        twins.step(("mdp_ready", worker, reading))
        for _ in range(5):
            twins.step(("advance", 1.0))
            twins.step(("mdp_beat", worker, reading))
        assert twins.mdp_taken == 5
        assert twins.b.broker.stats()["workers"] == 1
        twins.step(("client", client))
        twins.step(("request", client))
        assert twins.tickets.get(worker)
        twins.step(("mdp_reply", worker, reading))
        twins.step(("mdp_beat", client, reading))  # no backend session: the core's DISCONNECT
        assert twins.mdp_taken == 5
        twins.step(("advance", 2.9))
        assert twins.b.broker.stats()["workers"] == 1
        twins.step(("advance", 0.1))
        assert twins.b.broker.stats()["workers"] == 0
        twins.same_sessions()


def test_an_s0p_beat_from_a_majordomo_speaker_goes_to_the_core() -> None:
    """An S0P HEARTBEAT from a session that speaks Majordomo makes the core note it speaks S0P
    now (its next answers are S0P): the lane passes it, as the mirror tells it who speaks MDP.
    (The broker's next heartbeat to the worker shows which protocol the core believes.)"""
    for reading in READINGS:
        twins = Twins()
        worker = RIDS[0]
        twins.step(("mdp_ready", worker, reading))
        assert twins.lane.table[(BACK, worker)].majordomo
        twins.step(("beat", BACK, worker, None, 0.0, 3))
        assert twins.lane.heard == []
        twins.step(("advance", 1.0))
        twins.step(("worker", worker, 1000, True))  # S0P again: the mirror says so at once
        assert not twins.lane.table[(BACK, worker)].majordomo
        twins.step(("mdp_ready", worker, reading))  # its session stays: remirror tells it
        assert twins.lane.table[(BACK, worker)].majordomo
        twins.step(("beat", BACK, worker, None, 0.0, 3))
        assert twins.lane.heard == []
        twins.same_sessions()
