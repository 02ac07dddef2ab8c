"""The gossip rules G1-G12 (scale0/core/gossip.py) on pure cores wired in memory, and the member
state machine (scale0/core/states.py) held to a real broker's membership for every pair."""

from __future__ import annotations

import dataclasses
import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.core import gossip as gossip_module
from scale0.core.effects import ConfigOffered, Log, Send
from scale0.core.gossip import PIGGYBACK, news
from scale0.core.states import MEMBER_TRANSITIONS, MemberInput
from scale0.sim.fabric import Fabric, family_config, offer_of
from scale0.wire.gossip import Ack, MemberRow, MemberStatus, Ping, PingReq
from scale0.wire.peer import BrokerState, PeerHeartbeat, Table, TableReq

NAMES = ("a", "b", "c", "d", "e")
AL, SU, DE = MemberStatus.ALIVE, MemberStatus.SUSPECT, MemberStatus.DEAD


def gossip_family(names: tuple[str, ...] = NAMES) -> Fabric:
    fabric = Fabric(family_config(names, family_topology="gossip"))
    fabric.start()
    fabric.advance(1.0)
    return fabric


def quiet(fabric: Fabric, limit_s: float = 30.0) -> None:
    """Until every row learnt has been sent its times (G8); bounded."""
    waited = 0.0
    while any(b.family.gossip.rows for b in fabric.brokers.values()):
        assert waited < limit_s, "rows still waiting"
        fabric.advance(0.5)
        waited += 0.5


def sends(fabric: Fabric, name: str, kind: type) -> list[Send]:
    return [e for e in fabric.effects[name] if isinstance(e, Send) and isinstance(e.message, kind)]


def logs(fabric: Fabric, name: str, event: str) -> list[Log]:
    return [e for e in fabric.effects[name] if isinstance(e, Log) and e.event == event]


def test_rules_header_lists_twelve_rules() -> None:
    doc = gossip_module.__doc__ or ""
    assert re.findall(r"^ G(\d+) ", doc, re.M) == [str(i) for i in range(1, 13)]


# ---- G2: the table, written out apart from the code -----------------------------------------

MEMBER_SPEC = """
alive   alive_newer:alive suspect_news:suspect dead_news:dead probe_failed:suspect suspicion_expired:alive left:dead
suspect alive_newer:alive suspect_news:suspect dead_news:dead probe_failed:suspect suspicion_expired:dead  left:dead
dead    alive_newer:alive suspect_news:dead    dead_news:dead probe_failed:dead    suspicion_expired:dead  left:dead
"""  # noqa: E501


def test_g2_every_pair_has_an_entry_and_the_table_is_the_documented_one() -> None:
    assert set(MEMBER_TRANSITIONS) == set(itertools.product(MemberStatus, MemberInput))
    for line in MEMBER_SPEC.strip().splitlines():
        state, *pairs = line.split()
        for pair in pairs:
            change, after = pair.split(":")
            assert MEMBER_TRANSITIONS[MemberStatus(state), MemberInput(change)] is MemberStatus(
                after
            ), (state, change)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(MemberInput), min_size=1, max_size=12))
def test_g2_a_real_broker_moves_a_member_where_the_table_says(
    changes: list[MemberInput],
) -> None:
    fabric = gossip_family(("a", "b", "c"))
    family = fabric.brokers["a"].family
    peer = family.peers["b"]
    assert peer.member is AL
    for change in changes:
        before = peer.member
        out: list[object] = []
        row = None
        if change in (MemberInput.ALIVE_NEWER, MemberInput.SUSPECT_NEWS, MemberInput.DEAD_NEWS):
            status = {MemberInput.ALIVE_NEWER: AL, MemberInput.SUSPECT_NEWS: SU}.get(change, DE)
            row = MemberRow("b", status, peer.incarnation + 1, BrokerState.ACTIVE, 1)
        if change is MemberInput.LEFT:
            family.gossip.left(peer)
        else:
            family.gossip.step(peer, change, fabric.now, out, row=row)  # type: ignore[arg-type]
        assert peer.member is MEMBER_TRANSITIONS[before, change], (before, change)
        # Dead and usable never go together; suspect still takes work (SWIM: still a member).
        assert not (peer.member is DE and peer.usable())


# ---- G3: incarnations ------------------------------------------------------------------------


@given(
    st.sampled_from(MemberStatus),
    st.sampled_from(MemberStatus),
    st.integers(0, 5),
    st.integers(0, 5),
)
def test_g3_a_row_counts_by_its_incarnation(
    said: MemberStatus, held: MemberStatus, ours: int, theirs: int
) -> None:
    row = MemberRow("b", said, theirs, BrokerState.ACTIVE, 1)
    counts = {
        AL: theirs > ours,
        SU: (held is AL and theirs >= ours) or (held is SU and theirs > ours),
        DE: theirs > ours or (held is not DE and theirs == ours),
    }[said]
    expected = {
        AL: MemberInput.ALIVE_NEWER,
        SU: MemberInput.SUSPECT_NEWS,
        DE: MemberInput.DEAD_NEWS,
    }[said]
    assert news(row, held, ours) is (expected if counts else None)


# ---- G1, G11: one probe per interval, no HEARTBEAT, no TABLE ---------------------------------


def test_g1_g11_each_broker_pings_one_member_per_interval_and_says_no_heartbeat_or_table() -> None:
    fabric = gossip_family()
    quiet(fabric)
    for name in NAMES:
        fabric.effects[name].clear()
    fabric.advance(5.0)
    for name in NAMES:
        pings = sends(fabric, name, Ping)
        assert len(pings) == 5, name  # one per interval
        assert len({p.routing_id for p in pings}) >= 2  # a shuffled order, not one peer
        assert not sends(fabric, name, PeerHeartbeat)
        assert not sends(fabric, name, Table) and not sends(fabric, name, TableReq)
    assert not any(logs(fabric, n, "peer_lost") for n in NAMES)


def test_g11_a_mesh_family_says_no_ping() -> None:
    fabric = Fabric(family_config(NAMES))
    fabric.start()
    fabric.advance(3.0)
    for name in NAMES:
        assert not sends(fabric, name, Ping) and sends(fabric, name, PeerHeartbeat)


# ---- G4: indirect probes ---------------------------------------------------------------------


def test_g4_a_member_unreachable_directly_is_probed_through_others_and_never_suspected() -> None:
    fabric = gossip_family()
    quiet(fabric)
    fabric.drops.append(lambda src, dst, msg: {src, dst} == {"a", "b"})
    fabric.advance(20.0)
    assert sends(fabric, "a", PingReq)  # a's probes of b went through others
    relayed = [
        s
        for n in NAMES
        if n not in ("a", "b")
        for s in sends(fabric, n, Ack)
        if s.message.target == "b"
    ]
    assert relayed  # ... and came back as relayed ACKs
    assert not any(logs(fabric, n, "peer_suspect") for n in NAMES)
    assert not any(logs(fabric, n, "peer_lost") for n in NAMES)


# ---- G5: suspicion, then death ---------------------------------------------------------------


def test_g5_a_silent_member_is_suspect_then_dead_after_the_suspicion_timeout() -> None:
    fabric = gossip_family()
    quiet(fabric)
    killed = fabric.now
    fabric.kill("c")
    timeout = fabric.brokers["a"].family.gossip.suspicion_s()
    waited = 0.0
    while not all(logs(fabric, n, "peer_lost") for n in ("a", "b", "d", "e")):
        assert waited < timeout + 15.0, "not every live broker declared c dead"
        fabric.advance(0.5)
        waited += 0.5
    suspected = [n for n in ("a", "b", "d", "e") if logs(fabric, n, "peer_suspect")]
    assert suspected  # someone suspected before anyone declared
    assert fabric.now - killed >= timeout
    for name in ("a", "b", "d", "e"):
        peer = fabric.brokers[name].family.peers["c"]
        assert peer.member is DE and not peer.usable() and not peer.table


# ---- G12: a member of the config that never started ---------------------------------------


def test_g12_a_member_that_never_started_ends_dead_and_comes_back_when_it_starts() -> None:
    fabric = Fabric(family_config(NAMES, family_topology="gossip"))
    fabric.kill("e")  # in the config, never started: nothing reaches it
    started = fabric.now
    fabric.start("a", "b", "c", "d")
    live = ("a", "b", "c", "d")
    grace = fabric.brokers["a"].core.network.liveness * fabric.brokers["a"].core.interval_s
    waited = 0.0
    while not all(fabric.brokers[n].family.peers["e"].member is DE for n in live):
        assert waited < 60.0, "a member that never started is still not dead everywhere"
        fabric.advance(0.5)
        waited += 0.5
    assert fabric.now - started >= grace  # never before its HELLO had time to come back
    for name in live:
        assert [f.fields["silent_ms"] for f in logs(fabric, name, "peer_lost")] in ([], [None])
        assert not fabric.brokers[name].family.peers["e"].usable()
    # The members that did start were never suspected on the way.
    for name in live:
        assert {f.fields["peer"] for f in logs(fabric, name, "peer_suspect")} <= {"e"}
    fabric.restart("e", family_config(NAMES, family_topology="gossip"))
    waited = 0.0
    while not all(fabric.brokers[n].family.peers["e"].member is AL for n in live):
        assert waited < 60.0, "e started but is not alive everywhere"
        fabric.advance(0.5)
        waited += 0.5
    assert all(logs(fabric, n, "peer_up") for n in live)


def test_g12_a_member_slow_to_answer_hello_is_not_probed_within_the_grace() -> None:
    fabric = Fabric(family_config(("a", "b", "c"), family_topology="gossip"))
    fabric.kill("c")
    fabric.start("a", "b")
    grace = fabric.brokers["a"].core.network.liveness * fabric.brokers["a"].core.interval_s
    fabric.advance(grace - 0.5)
    for name in ("a", "b"):
        assert not logs(fabric, name, "peer_suspect")
        assert fabric.brokers[name].family.peers["c"].member is AL


# ---- G6: refutation --------------------------------------------------------------------------


def test_g6_a_broker_told_it_is_suspect_refutes_with_a_higher_incarnation() -> None:
    fabric = gossip_family(("a", "b", "c"))
    a = fabric.brokers["a"].family.gossip
    before = a.incarnation
    lie = MemberRow("a", SU, before, BrokerState.ACTIVE, 1)
    peer_b = fabric.brokers["a"].family.peers["b"]
    out: list[object] = []
    a.merge(peer_b, (lie,), fabric.now, fabric.wall, out)  # type: ignore[arg-type]
    assert a.incarnation == before + 1
    # The refutation is our own row in the next message, and it wins over the suspicion.
    row = a.own_row(fabric.wall)
    assert row.status is AL and row.incarnation > lie.incarnation


# ---- G7, G8: own row, bounded piggyback ------------------------------------------------------


def test_g7_a_new_service_raises_the_incarnation_and_reaches_every_table() -> None:
    fabric = gossip_family()
    before = fabric.brokers["a"].family.gossip.incarnation
    fabric.worker("a", b"w1", ("fresh",))
    waited = 0.0
    while not all("fresh" in fabric.brokers[n].family.peers["a"].table for n in NAMES[1:]):
        assert waited < 15.0
        fabric.advance(0.5)
        waited += 0.5
    assert fabric.brokers["a"].family.gossip.incarnation > before


def test_g10_a_new_row_does_not_count_free_the_slots_our_requests_hold() -> None:
    """c's row changes (a worker for another service) while two of a's requests run at c's
    capacity-2 worker: a must not take c's whole capacity for free slots again (it did, and
    queued a third request at c behind them while a's own worker would free first)."""
    fabric = gossip_family(("a", "c"))
    fabric.worker("a", b"w-a")
    fabric.worker("c", b"w-c", capacity=2)
    a, c = fabric.brokers["a"], fabric.brokers["c"]
    waited = 0.0
    while "echo" not in a.family.peers["c"].table:
        assert waited < 15.0
        fabric.advance(0.5)
        waited += 0.5
    fabric.client("a", b"client-1")
    for i in range(3):  # r0 at a's worker, r1 and r2 at c's
        fabric.request("a", b"client-1", f"r{i}".encode())
    assert a.counters["forwarded"] == 2
    fabric.worker("c", b"w-other", ("other",))
    waited = 0.0
    while "other" not in a.family.peers["c"].table:
        assert waited < 15.0
        fabric.advance(0.5)
        waited += 0.5
    fabric.request("a", b"client-1", b"r3")  # every slot is busy: r3 waits at a
    assert a.counters["forwarded"] == 2
    assert c.ledger.waiting_count("echo") == 0


def test_g8_no_message_carries_more_than_piggyback_rows_besides_two() -> None:
    fabric = gossip_family(tuple(f"n{i:02d}" for i in range(20)))
    fabric.advance(5.0)
    for name, effects in fabric.effects.items():
        for effect in effects:
            if isinstance(effect, Send) and isinstance(effect.message, (Ping, PingReq, Ack)):
                # our own row, what we hold of the receiver if not alive, then PIGGYBACK
                assert len(effect.message.members) <= PIGGYBACK + 2, name


def test_a_family_switches_topology_with_a_config_version_and_back() -> None:
    fabric = Fabric(family_config(NAMES))
    fabric.start()
    fabric.advance(2.0)
    for version, topology in ((2, "gossip"), (3, None)):
        network = dataclasses.replace(fabric.network, config_version=version)
        network = dataclasses.replace(network, family_topology=topology)
        fabric.feed("a", ConfigOffered(offer_of(network), "admin"))
        fabric.settle()
        fabric.advance(3.0)
        for name in NAMES:
            fabric.effects[name].clear()
        fabric.advance(3.0)
        for name in NAMES:
            assert fabric.brokers[name].network.config_version == version
            pings, beats = sends(fabric, name, Ping), sends(fabric, name, PeerHeartbeat)
            assert (bool(pings), bool(beats)) == (topology == "gossip", topology is None), name
            peers = fabric.brokers[name].family.peers.values()
            assert all(p.usable() for p in peers), name
