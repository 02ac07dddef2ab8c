"""The scale simulator itself: the faults it injects are seen by the cores, its time is the
fabric's fake clock (nothing sleeps), and a small run fills every field of tools/scale's table.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path

import pytest

from scale0.core.effects import ConfigOffered, Log
from scale0.sim.fabric import offer_of
from scale0.sim.scale import Options, Simulation, run
from tools import scale_sim

SMALL = Options(brokers=5, workers=20, clients=6, rate=20.0, warmup_s=2.0, measure_s=2.0)
INTERVAL_S = 1.0  # family_config's default_heartbeat_interval_ms
LIVENESS = 3


def started(options: Options = SMALL) -> Simulation:
    sim = Simulation(options)
    sim.start()
    sim.run_for(2.0)
    return sim


def test_a_killed_broker_is_reported_down_by_every_live_broker_within_liveness_rounds() -> None:
    sim = started()
    took = sim.kill("b002")
    assert took is not None
    # Silent for more than liveness x interval, seen at the next round (F3): at most one
    # interval more than the limit, never before it.
    assert LIVENESS * INTERVAL_S - INTERVAL_S <= took <= (LIVENESS + 1) * INTERVAL_S
    seen = sim.seen(sim.fabric.lost, "b002", 0.0)
    assert seen == {"b000", "b001", "b003", "b004"}
    for name in seen:
        assert sim.fabric.brokers[name].family.peers["b002"].status == "down"
    assert sim.false_suspicions() == 0


def test_a_published_config_reaches_every_broker_even_with_every_publication_lost() -> None:
    sim = started()
    for version, lose in ((2, False), (3, True)):
        took = sim.publish(version, lose_publications=lose)
        assert took is not None
        assert {b.network.config_version for b in sim.fabric.brokers.values()} == {version}


def test_a_paused_broker_is_suspected_queues_what_it_is_sent_and_comes_back() -> None:
    sim = started()
    down, up, queued = sim.pause("b003")
    assert down is not None and down >= LIVENESS * INTERVAL_S - INTERVAL_S
    assert up is not None
    assert queued > 0
    others = {"b000", "b001", "b002", "b004"}
    assert sim.seen(sim.fabric.up, "b003", 0.0) >= others
    for name in others:
        assert sim.fabric.brokers[name].family.peers["b003"].status == "up"


def test_a_cut_link_is_seen_by_its_two_ends_only() -> None:
    sim = started()
    down, up = sim.cut("b001", "b004")
    assert down is not None and up is not None
    assert {who for _, who, _ in sim.fabric.lost} == {"b001", "b004"}
    assert sim.false_suspicions() == 0


def test_requests_cross_the_family_and_every_one_is_answered() -> None:
    # Few workers: a worker freed by a reply is given the next waiting request at once, and
    # the simulated worker answers that one too (none is left unanswered in an outbox).
    sim = started(Options(brokers=5, workers=2, clients=6, rate=20.0))
    before = sim.answered
    sim.run_for(4.0)
    sent = 20.0 * 5 * 4.0
    assert sim.answered - before >= sent - 5  # what was sent in the last step may be in flight
    assert not sim.failed
    assert sim.fabric.msgs["forward"] > 0
    assert len(sim.entered) <= 5


def test_time_is_simulated_not_slept(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"the simulator slept {seconds} s")

    monkeypatch.setattr(time, "sleep", no_sleep)
    sim = started()
    before = sim.fabric.now
    sim.run_for(7.0)
    # Exactly the steps asked for, on the fabric's clock (140 steps of 0.05 s).
    assert sim.fabric.now - before == pytest.approx(7.0)
    result = run(SMALL)
    # warm-up, window and the faults: far more simulated time than a test could wait for
    assert result.sim_s > 15.0


def test_a_small_run_fills_every_field_of_the_table(tmp_path: Path) -> None:
    result = run(SMALL)
    row = result.row()
    assert [key for key, _, _ in scale_sim.COLUMNS] == list(row)
    for key, value in row.items():
        assert value is not None, key
        if isinstance(value, tuple):
            assert None not in value, key
    assert row["hb msg/s/broker"] == SMALL.brokers - 1  # one HEARTBEAT per peer per interval
    assert row["table msg/s/broker"] > 0 and row["tables KiB/broker"] > 0
    assert row["cpu ms/s/broker"] > 0
    assert row["false susp."] == 0
    assert row["requests"] > 0 and row["failed"] == 0
    text = scale_sim.table([result])
    assert text.splitlines()[0].split("|")[0].strip() == "N"
    written = scale_sim.plot([result, result], tmp_path)
    assert written and all(p.stat().st_size > 1000 for p in written)


# ---- the gossip topology (family_topology: gossip, scale0/core/gossip.py G1-G12) ------------

GOSSIP = Options(
    brokers=8, workers=10, clients=4, rate=20.0, warmup_s=2.0, measure_s=2.0, topology="gossip"
)


def gossip_started(options: Options = GOSSIP) -> Simulation:
    sim = Simulation(options)
    sim.start()
    assert sim.run_for(20.0, sim.converged) is not None  # every table known, bounded
    return sim


def suspicion_s(sim: Simulation) -> float:
    return sim.fabric.brokers[sim.names[0]].family.gossip.suspicion_s()


def test_gossip_a_killed_broker_is_declared_dead_by_every_live_one_within_a_bound() -> None:
    sim = gossip_started()
    took = sim.kill("b002")
    assert took is not None
    # Found by someone's probe within a few intervals, suspected for the suspicion timeout
    # (G5), then spread (G8): never before the timeout, and within it plus ten intervals.
    assert suspicion_s(sim) <= took <= suspicion_s(sim) + 10 * INTERVAL_S
    live = set(sim.live())
    assert sim.seen(sim.fabric.lost, "b002", 0.0) == live
    for name in live:
        peer = sim.fabric.brokers[name].family.peers["b002"]
        assert peer.member.value == "dead" and peer.status == "down" and not peer.table
    assert sim.false_suspicions() == 0


def test_gossip_a_broker_paused_less_than_the_suspicion_timeout_is_suspected_never_dead() -> None:
    sim = gossip_started()
    fabric = sim.fabric
    since = fabric.now
    suspected: list[str] = []
    fabric.on_effects.append(
        lambda name, effects: suspected.extend(
            name for e in effects if isinstance(e, Log) and e.event == "peer_suspect"
        )
    )
    fabric.pause("b003")
    others = [n for n in sim.names if n != "b003"]
    # Paused until some member suspects it, and resumed well within the timeout.
    assert sim.run_for(suspicion_s(sim), lambda: bool(suspected)) is not None
    fabric.resume("b003")
    sim.run_for(2 * suspicion_s(sim) + 5 * INTERVAL_S)
    assert not sim.seen(fabric.lost, "b003", since)  # no false death
    for name in others:
        peer = fabric.brokers[name].family.peers["b003"]
        assert peer.member.value == "alive", (name, peer.member)
        assert "s3" in peer.table
    # It refuted (G6): its incarnation moved past the suspicion.
    assert fabric.brokers["b003"].family.gossip.incarnation > 0
    assert sim.false_suspicions() == 0


def test_gossip_a_broker_paused_too_long_is_dead_then_back_when_it_resumes() -> None:
    sim = gossip_started()
    down, up, _queued = sim.pause("b003")
    assert down is not None and down >= suspicion_s(sim)
    assert up is not None
    others = set(sim.live()) - {"b003"}
    assert sim.seen(sim.fabric.up, "b003", 0.0) >= others
    for name in others:
        assert sim.fabric.brokers[name].family.peers["b003"].member.value == "alive"


def test_gossip_a_config_version_reaches_every_broker_even_with_every_publication_lost() -> None:
    sim = gossip_started()
    for version, lose in ((2, False), (3, True)):
        took = sim.publish(version, lose_publications=lose)
        assert took is not None
        assert {b.network.config_version for b in sim.fabric.brokers.values()} == {version}


def test_gossip_a_config_change_sends_no_burst_to_peers() -> None:
    sim = gossip_started()
    fabric = sim.fabric
    before = Counter(fabric.msgs)
    network = dataclasses.replace(fabric.network, config_version=2)
    fabric.feed(sim.names[0], ConfigOffered(offer_of(network), "admin"))
    fabric.settle()  # the publication reaches every broker; each applies it
    assert {b.network.config_version for b in fabric.brokers.values()} == {2}
    said = {k: fabric.msgs[k] - before[k] for k in ("heartbeat", "table", "gossip")}
    assert said == {"heartbeat": 0, "table": 0, "gossip": 0}  # the mesh says N(N-1) HEARTBEATs
    # The new version still reaches every member's rows, by the probes (G7, G8).
    sim.run_for(10 * INTERVAL_S)
    for name, broker in fabric.brokers.items():
        assert {p.config_version for p in broker.family.peers.values()} == {2}, name


def test_gossip_a_cut_link_kills_no_one_its_ends_probe_each_other_through_others() -> None:
    sim = gossip_started()
    down, up = sim.cut("b001", "b004")
    assert (down, up) == (None, None)
    assert not sim.fabric.lost
    assert sim.false_suspicions() == 0


def test_gossip_requests_cross_the_family_and_each_broker_sends_a_flat_number_of_probes() -> None:
    sim = gossip_started(dataclasses.replace(GOSSIP, workers=2))
    fabric = sim.fabric
    # Once every row learnt at start has been sent its RETRANSMIT times (G8, bounded):
    quiet = sim.run_for(
        20.0, lambda: not any(b.family.gossip.rows for b in fabric.brokers.values())
    )
    assert quiet is not None
    gossip0 = fabric.msgs["gossip"]
    before = sim.answered
    sim.run_for(4.0)
    assert sim.answered - before >= 20.0 * GOSSIP.brokers * 4.0 - GOSSIP.brokers
    assert not sim.failed
    assert fabric.msgs["forward"] > 0
    # Steady state: one PING and one ACK per broker per interval (G1), whatever N is.
    per_broker_s = (fabric.msgs["gossip"] - gossip0) / GOSSIP.brokers / 4.0
    assert per_broker_s <= 2.0 + 1e-9


def test_both_topologies_run_side_by_side_in_one_table_and_one_set_of_plots(
    tmp_path: Path,
) -> None:
    mesh = run(SMALL)
    gossip = run(dataclasses.replace(SMALL, topology="gossip"))
    rows = [mesh.row(), gossip.row()]
    assert [r["topology"] for r in rows] == ["mesh", "gossip"]
    # Gossip: no HEARTBEAT, no TABLE between peers; its probes and rows instead (G11).
    assert gossip.row()["hb msg/s/broker"] == 0 and gossip.row()["table msg/s/broker"] == 0
    assert gossip.row()["gossip msg/s/broker"] > 0 and mesh.row()["gossip msg/s/broker"] == 0
    assert gossip.row()["false susp."] == 0 and gossip.row()["failed"] == 0
    # A cut link: the mesh's ends see each other down; gossip's reach each other through others.
    assert mesh.cut_down_s is not None and gossip.cut_down_s is None
    for field in ("dead_s", "pause_down_s", "pause_up_s", "config_lost_pub_s", "table_s"):
        assert getattr(gossip, field) is not None, field
    lines = scale_sim.table([mesh, gossip]).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["mesh", "gossip"]
    written = scale_sim.plot([mesh, gossip], tmp_path)
    assert written and all(p.stat().st_size > 1000 for p in written)
