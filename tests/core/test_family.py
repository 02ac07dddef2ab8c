"""The family rules F1-F13, F15 and F16 (scale0/core/broker.py): several pure cores wired in memory.

No sockets and no sleeps: scale0/sim/fabric.py delivers what one core sends to another and
moves one fake clock, so liveness, republish and repair are checked with exact numbers.
"""

from __future__ import annotations

import dataclasses
import json

from scale0.config.model import PeerLink
from scale0.core.effects import (
    Channel,
    ConfigOffered,
    Log,
    Malformed,
    Persist,
    Received,
    Send,
    Tick,
)
from scale0.core.replica import Applied, Refused
from scale0.sim.fabric import OTHER_KEY, Fabric, family_config, offer_of
from scale0.wire.client import (
    CheckConfig,
    ClientReply,
    ClientRequest,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
)
from scale0.wire.frames import SIG_BROKER, SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.peer import (
    BrokerState,
    Forward,
    ForwardPartial,
    ForwardReply,
    Hello,
    PeerHeartbeat,
    Table,
    TableMode,
    TableReq,
)
from scale0.wire.worker import Ready, WorkerIdRequest, WorkerPartial, WorkerReply

C1 = b"client-1"
W1 = b"worker-1"


def linked(fabric: Fabric, name: str) -> set[str]:
    return {p["broker_id"] for p in fabric.brokers[name].peers_view() if p["linked"]}  # type: ignore[misc]


def sent(fabric: Fabric, name: str, kind: type) -> list[object]:
    return [
        e.message
        for e in fabric.effects[name]
        if isinstance(e, Send) and isinstance(e.message, kind)
    ]


def started(**kwargs: object) -> Fabric:
    fabric = Fabric(family_config(**kwargs))  # type: ignore[arg-type]
    fabric.start()
    fabric.advance(1.0)
    return fabric


# ---- F1-F3: links, HELLO, liveness ------------------------------------------------------------


def test_f1_every_member_links_to_every_other_and_says_hello() -> None:
    fabric = started()
    for name in "abc":
        assert linked(fabric, name) == set("abc") - {name}
        assert all(m.broker_id == name for m in sent(fabric, name, Hello))  # type: ignore[attr-defined]


def test_f1_an_unanswered_hello_is_said_again_every_interval() -> None:
    fabric = Fabric(family_config())
    fabric.kill("b")
    fabric.kill("c")
    fabric.start("a")
    before = len(sent(fabric, "a", Hello))
    fabric.advance(3.0)
    assert len(sent(fabric, "a", Hello)) - before == 3 * 2  # to b and c, once a second each


def test_f2_a_hello_from_another_family_or_a_stranger_gets_401() -> None:
    fabric = started()
    a = fabric.brokers["a"]
    for hello in (
        Hello("b", "other", BrokerState.ACTIVE, 1, {}, TableMode.PULL),
        Hello("zed", "fam", BrokerState.ACTIVE, 1, {}, TableMode.PULL),
    ):
        out = a.handle(Received(Channel.PEER, b"stranger", hello), fabric.now, fabric.wall)
        refusals = [e.message for e in out if isinstance(e, Send)]
        assert len(refusals) == 1
        assert isinstance(refusals[0], DisconnectError) and refusals[0].code == 401


def test_f2_a_broker_id_held_by_a_live_link_gets_409_and_a_stale_one_is_taken_over() -> None:
    fabric = started()
    a = fabric.brokers["a"]
    hello = Hello("b", "fam", BrokerState.ACTIVE, 1, {}, TableMode.PULL)
    out = a.handle(Received(Channel.PEER, b"impostor", hello), fabric.now, fabric.wall)
    refusal = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(refusal[0], DisconnectError) and refusal[0].code == 409
    fabric.kill("b")
    fabric.advance(1.5)  # b's old link is silent for over an interval: a restart may take it
    out = a.handle(Received(Channel.PEER, b"b-restarted", hello), fabric.now, fabric.wall)
    answers = [e.message for e in out if isinstance(e, Send) and e.channel is Channel.PEER]
    assert isinstance(answers[0], Hello) and answers[0].broker_id == "a"


def test_f2_anything_before_hello_is_ignored_and_not_scored() -> None:
    fabric = started()
    a = fabric.brokers["a"]
    beat = PeerHeartbeat("b", fabric.wall, BrokerState.ACTIVE, 1, 0)
    for _ in range(50):
        out = a.handle(Received(Channel.PEER, b"early", beat), fabric.now, fabric.wall)
        assert [e for e in out if isinstance(e, Send)] == []
    assert not a.is_banned(b"early", fabric.now)
    assert a.counters["peer_ignored"] >= 50


def test_f3_a_silent_peer_is_down_after_liveness_intervals_and_back_when_it_speaks() -> None:
    fabric = started()
    fabric.kill("c")
    fabric.advance(2.9)
    assert {p["broker_id"]: p["status"] for p in fabric.brokers["a"].peers_view()}["c"] == "up"
    fabric.advance(1.2)
    assert {p["broker_id"]: p["status"] for p in fabric.brokers["a"].peers_view()}["c"] == "down"
    fabric.down.discard("c")  # kill -CONT: it speaks again
    fabric.advance(2.0)
    assert linked(fabric, "a") == {"b", "c"}


# ---- F4, F10, F11: config replication ----------------------------------------------------------


def test_f10_a_published_config_reaches_every_broker_and_they_tell_their_clients() -> None:
    fabric = started()
    fabric.client("c", C1)
    fabric.worker("b", W1)
    fabric.feed("a", ConfigOffered(offer_of(family_config(version=2)), "admin"))
    fabric.settle()
    assert {n: b.replica.version for n, b in fabric.brokers.items()} == {"a": 2, "b": 2, "c": 2}
    assert fabric.take("c", ForceNegotiate, Channel.FRONTEND)
    assert fabric.take("b", ForceNegotiate, Channel.BACKEND)
    persisted = [e for e in fabric.effects["c"] if isinstance(e, Persist)]
    assert json.loads(persisted[-1].document)["config_version"] == 2


def test_f10_unsigned_wrongly_signed_and_older_configs_are_refused_everywhere() -> None:
    fabric = started(version=3)
    bad = [
        dataclasses.replace(offer_of(family_config(version=4)), signature=None),
        offer_of(family_config(version=5), key=OTHER_KEY),
        offer_of(family_config(version=2)),
    ]
    for offer in bad:
        fabric.feed("a", ConfigOffered(offer, "admin"))
    fabric.settle()
    fabric.advance(6.0)
    assert {b.replica.version for b in fabric.brokers.values()} == {3}
    assert fabric.brokers["a"].counters["configs_refused"] == 3


def test_f10_a_lost_publication_is_repaired_by_the_republish() -> None:
    fabric = started(peers=(PeerLink("a", "b", "pull"),))  # no link to c: only PUB reaches it
    fabric.drops.append(lambda src, dst, m: dst == "c" and src == "a")
    fabric.feed("a", ConfigOffered(offer_of(family_config(version=2)), "admin"))
    fabric.settle()
    assert fabric.brokers["c"].replica.version in (1, 2)  # b's republish may already have it
    fabric.advance(5.1)  # b, the other source, republishes what it applied
    assert fabric.brokers["c"].replica.version == 2


def test_f4_a_newer_version_in_a_heartbeat_is_fetched_at_once() -> None:
    fabric = started()
    fabric.subs["c"] = ()  # c hears no publication at all: only the peers can tell it
    fabric.drops.append(lambda src, dst, m: dst == "c")  # and misses what they say now
    fabric.feed("a", ConfigOffered(offer_of(family_config(version=2)), "admin"))
    fabric.settle()
    fabric.drops.clear()
    assert fabric.brokers["c"].replica.version == 1
    fabric.advance(1.0)  # the next HEARTBEAT from a or b says version 2: c asks with CHECKCONFIG
    assert fabric.brokers["c"].replica.version == 2


def test_f10_conflicting_configs_converge_on_the_smaller_sha256() -> None:
    fabric = started()
    one = family_config(version=2)
    two = dataclasses.replace(one, liveness=5)
    fabric.feed("a", ConfigOffered(offer_of(one), "admin"))
    fabric.feed("b", ConfigOffered(offer_of(two), "admin"))
    fabric.settle()
    fabric.advance(6.0)
    digests = {b.config_view()["sha256"] for b in fabric.brokers.values()}
    assert digests == {min(offer_of(one).sha256, offer_of(two).sha256)}
    assert any(b.config_view()["conflicts"] for b in fabric.brokers.values())


def test_f10_a_joining_broker_gets_the_config_from_a_seed_and_becomes_active() -> None:
    network = family_config()
    fabric = Fabric(network, joining=("c",))
    fabric.add("c", None, seeds=(network.brokers[0].peer,))
    fabric.down.update({"a", "b"})
    fabric.start("c")
    fabric.advance(2.0)
    assert fabric.brokers["c"].state == "joining"  # its seed is not there yet
    fabric.down.clear()
    fabric.start("a", "b")
    fabric.advance(2.0)
    c = fabric.brokers["c"]
    assert c.state == "active" and c.replica.version == 1
    assert linked(fabric, "c") == {"a", "b"}


def test_f10_a_joining_broker_refuses_work_with_503() -> None:
    network = family_config()
    fabric = Fabric(network, joining=("c",))
    fabric.add("c", None, seeds=())
    fabric.kill("a")
    fabric.kill("b")
    fabric.start("c")
    fabric.client("c", C1)
    refusal = fabric.take("c", DisconnectError)
    assert refusal and refusal[0][1].code == 503


def test_f11_a_peer_that_is_not_active_answers_checkconfig_with_503() -> None:
    fabric = started()
    a = fabric.brokers["a"]
    a.core.state = BrokerState("joining")
    b_rid = next(rid for rid, name in a.family.broker_of.items() if name == "b")
    ask = CheckConfig(config_type=ConfigType.JSON, client_id="b", protocol=SIG_BROKER)
    out = a.handle(Received(Channel.PEER, b_rid, ask), fabric.now, fabric.wall)
    answer = next(e.message for e in out if isinstance(e, Send))
    assert isinstance(answer, DisconnectError) and answer.code == 503


# ---- F5-F9: tables and forwarding --------------------------------------------------------------


def test_f5_f6_a_request_at_a_is_served_by_a_worker_at_c() -> None:
    fabric = started()
    fabric.worker("c", W1)
    fabric.advance(1.1)  # c commits its table; a pulls it after c's next HEARTBEAT
    fabric.client("a", C1)
    fabric.request("a", C1, b"r1")
    assert fabric.serve("c") == 1
    ((rid, reply),) = fabric.replies("a")
    assert rid == C1 and reply.status == 200 and reply.body == (b"done",)
    assert fabric.brokers["a"].counters["forwarded"] == 1


def test_f5_push_mode_sends_the_table_on_every_change() -> None:
    fabric = started(peers=(PeerLink("a", "c", "push"), PeerLink("c", "a", "pull")))
    fabric.worker("a", W1)
    fabric.advance(0.06)  # one table commit; no heartbeat needed for a push
    assert "echo" in {
        s for p in fabric.brokers["c"].peers_view() if p["broker_id"] == "a" for s in p["services"]
    }  # type: ignore[attr-defined]
    assert any(isinstance(m, Table) and not m.full for m in sent(fabric, "a", Table))


def test_f5_a_tablereq_gets_the_delta_since_or_everything() -> None:
    fabric = started()
    fabric.worker("b", W1)
    fabric.advance(0.1)
    b = fabric.brokers["b"]
    a_rid = next(rid for rid, name in b.family.broker_of.items() if name == "a")
    full = b.handle(Received(Channel.PEER, a_rid, TableReq("a")), fabric.now, fabric.wall)
    delta = b.handle(
        Received(Channel.PEER, a_rid, TableReq("a", since_seq=b.family.table.seq)),
        fabric.now,
        fabric.wall,
    )
    (full_table,) = [e.message for e in full if isinstance(e, Send)]
    (delta_table,) = [e.message for e in delta if isinstance(e, Send)]
    assert isinstance(full_table, Table) and full_table.full and full_table.services
    assert isinstance(delta_table, Table) and not delta_table.full and delta_table.services == ()


def test_f6_a_local_ready_worker_is_preferred_over_a_peer() -> None:
    fabric = started()
    fabric.worker("a", W1)
    fabric.worker("c", b"worker-c")
    fabric.advance(1.1)
    fabric.client("a", C1)
    fabric.request("a", C1, b"r1")
    assert fabric.serve("a") == 1 and fabric.serve("c") == 0


def test_f6_a_forwarded_request_is_never_forwarded_again() -> None:
    fabric = started()
    fabric.worker("c", W1)
    fabric.advance(1.1)
    b = fabric.brokers["b"]
    a_rid = next(rid for rid, name in b.family.broker_of.items() if name == "a")
    out = b.handle(
        Received(Channel.PEER, a_rid, Forward(b"T1", "echo", "a", (b"x",))), fabric.now, fabric.wall
    )
    answers = [e.message for e in out if isinstance(e, Send)]
    assert not [m for m in answers if isinstance(m, Forward)]
    (answer,) = answers
    assert isinstance(answer, ForwardReply) and answer.status == 404 and answer.ticket == b"T1"


def test_f7_f8_a_busy_peer_queues_the_request_and_the_answer_comes_back() -> None:
    fabric = started()
    fabric.worker("c", W1)
    fabric.advance(1.1)
    fabric.client("a", C1)
    for i in range(3):  # c has one slot: the other two wait at c (it offers echo)
        fabric.request("a", C1, f"r{i}".encode())
    answered = 0
    for _ in range(3):
        answered += fabric.serve("c")
    assert answered == 3
    assert sorted(r.request_id for _, r in fabric.replies("a")) == [b"r0", b"r1", b"r2"]


def test_f8_a_404_from_a_peer_routes_the_request_again() -> None:
    fabric = started()
    fabric.worker("c", W1)
    fabric.worker("b", b"worker-b")
    fabric.advance(1.1)
    # c's worker leaves; a still thinks c offers echo until c's next table reaches it.
    fabric.feed("c", Received(Channel.BACKEND, W1, Disconnect(protocol=SIG_WORKER)))
    fabric.drops.append(lambda src, dst, m: isinstance(m, Table))
    fabric.settle()
    fabric.client("a", C1)
    for i in range(4):
        fabric.request("a", C1, f"r{i}".encode())
    for _ in range(4):
        fabric.serve("b")
    statuses = [r.status for _, r in fabric.replies("a")]
    assert statuses == [200] * 4


def test_f9_a_request_waiting_at_a_is_forwarded_when_a_table_shows_a_worker() -> None:
    fabric = started()
    fabric.client("a", C1)
    fabric.request("a", C1, b"early")  # nobody offers echo yet: it waits (R7, startup)
    assert fabric.replies("a") == []
    fabric.worker("c", W1)
    fabric.advance(1.1)
    assert fabric.serve("c") == 1
    ((_, reply),) = fabric.replies("a")
    assert reply.request_id == b"early" and reply.status == 200


def test_f9_a_forwarded_reply_frees_a_slot_and_what_waits_goes_at_once() -> None:
    """No request waits for a periodic message (issue 14): the reply to a forwarded request
    tells the origin that the peer's slot is free, and a request waiting there goes to it
    then, not at the peer's next table (a HEARTBEAT away when tables are pulled)."""
    fabric = started()
    fabric.worker("a", W1)
    fabric.worker("c", b"worker-c")
    fabric.advance(1.1)  # a holds c's table: one free slot
    fabric.client("a", C1)
    for i in range(3):  # r0 to a's worker, r1 forwarded to c, r2 waits at a (both busy)
        fabric.request("a", C1, f"r{i}".encode())
    assert fabric.brokers["a"].counters["forwarded"] == 1
    assert fabric.serve("c") == 1  # r1 answered: c's slot is free again, no time passed
    assert [r.request_id for _, r in fabric.replies("a")] == [b"r1"]
    assert fabric.brokers["a"].counters["forwarded"] == 2  # r2 went to c with the reply
    assert fabric.serve("c") == 1
    assert [r.request_id for _, r in fabric.replies("a")] == [b"r2"]
    assert fabric.serve("a") == 1  # r0, all along at a's own worker


def _pull_now(fabric: Fabric, origin: str, peer: str) -> None:
    """Queue (not deliver) ``peer``'s HEARTBEAT at ``origin`` naming ``peer``'s newest table
    version, as if its heartbeat round came now: ``origin`` pulls (TABLEREQ) when it handles
    it, before whatever is fed after it."""
    target = fabric.brokers[peer]
    assert fabric.brokers[origin].family.peers[peer].table_seq < target.family.table.seq
    rid = f"{peer}@{id(target)}".encode()
    beat = PeerHeartbeat(peer, fabric.wall, BrokerState.ACTIVE, 1, target.family.table.seq)
    fabric.feed(origin, Received(Channel.PEER, rid, beat))


def test_f16_a_table_that_crossed_a_forward_does_not_count_the_slot_it_took() -> None:
    """Issue 14: c's TABLE left c before c received a's FORWARD, so its rows still show c's
    slot free; a must not take that for a second free slot (it did: each such table added
    one to what a kept queued at c, behind the others, while a's own worker could run it)."""
    fabric = started()
    fabric.worker("a", W1)
    fabric.worker("c", b"worker-c")
    fabric.advance(1.1)  # a holds c's table: one free slot
    fabric.client("a", C1)
    fabric.request("a", C1, b"r0")  # a's own worker
    fabric.request("a", C1, b"r1")  # to c, its slot
    fabric.advance(0.1)  # c's table: busy
    assert fabric.serve("c") == 1  # r1 answered: the credit says c's slot is free (F9)
    fabric.advance(0.1)  # c's table: free again
    a, c = fabric.brokers["a"], fabric.brokers["c"]
    _pull_now(fabric, "a", "c")  # a's TABLEREQ leaves before r2's FORWARD: c answers it first
    fabric.feed("a", Received(Channel.FRONTEND, C1, ClientRequest("echo", b"r2", (b"hi",))))
    fabric.settle()
    assert a.counters["forwarded"] == 2  # r2 took c's slot; the table said free, from before
    fabric.request("a", C1, b"r3")  # both busy: r3 waits at a, not in c's queue
    assert a.counters["forwarded"] == 2
    assert c.ledger.waiting_count("echo") == 0
    assert fabric.serve("a") == 1  # r0; a's worker then takes r3
    assert fabric.serve("a") == 1
    assert fabric.serve("c") == 1  # r2
    assert sorted(r.request_id for _, r in fabric.replies("a")) == [b"r0", b"r1", b"r2", b"r3"]


def test_f16_a_table_older_than_the_peers_answer_does_not_hide_its_free_slot() -> None:
    """Issue 14: c's rows were committed while c's worker ran a's r1; c answered r1 (a got
    the credit) and then a's TABLEREQ, from those rows. a must not count c's slot busy until
    c's next table (it did: r2 waited for a's own worker, a HEARTBEAT away from c's)."""
    fabric = started()
    fabric.worker("a", W1)
    fabric.worker("c", b"worker-c")
    fabric.advance(1.1)
    fabric.client("a", C1)
    fabric.request("a", C1, b"r0")  # a's own worker
    fabric.request("a", C1, b"r1")  # to c
    fabric.advance(0.1)  # c's table: busy
    a = fabric.brokers["a"]
    assert fabric.serve("c") == 1  # r1 answered; c's table still says busy (commits in 50 ms)
    _pull_now(fabric, "a", "c")
    fabric.settle()
    fabric.request("a", C1, b"r2")  # a's worker is busy, c's is free: r2 goes to c at once
    assert a.counters["forwarded"] == 2
    assert fabric.serve("c") == 1
    assert [r.request_id for _, r in fabric.replies("a")] == [b"r1", b"r2"]


def test_f3_requests_forwarded_to_a_peer_that_dies_are_routed_again() -> None:
    fabric = started()
    fabric.worker("c", W1, capacity=4)
    fabric.advance(1.1)
    fabric.client("a", C1)
    for i in range(4):
        fabric.request("a", C1, f"r{i}".encode())
    view = {p["broker_id"]: p for p in fabric.brokers["a"].peers_view()}
    assert view["c"]["forwarded"] == 4
    fabric.worker("b", b"worker-b", capacity=5)
    fabric.kill("c")
    fabric.outbox["c"].clear()  # what c's worker was given dies with c
    fabric.advance(4.0)  # c is down: what it held waits for it to come back (F15)...
    assert fabric.serve("b") == 0
    fabric.advance(2.6)  # ...for min(liveness x interval, request_timeout_ms / 2); then to b
    assert fabric.serve("b") == 4
    replies = fabric.replies("a")
    assert sorted(r.request_id for _, r in replies) == [b"r0", b"r1", b"r2", b"r3"]
    assert {r.status for _, r in replies} == {200}


def test_f3_peers_silent_together_are_all_down_before_what_they_held_moves() -> None:
    """A broker cut off from every peer at once must not re-forward what one held to another
    found silent in the same round: that FORWARD would wait in a dead link and run when the
    network heals, after the client was answered (issue 15 #5, tools/partitions)."""
    fabric = started()
    fabric.worker("b", b"worker-b", capacity=4)
    fabric.worker("c", W1, capacity=4)
    fabric.advance(1.1)
    fabric.client("a", C1)
    for i in range(6):
        fabric.request("a", C1, f"r{i}".encode())
    view = {p["broker_id"]: p for p in fabric.brokers["a"].peers_view()}
    assert view["b"]["forwarded"] and view["c"]["forwarded"]
    fabric.kill("b")
    fabric.kill("c")
    fabric.outbox["b"].clear()
    fabric.outbox["c"].clear()
    fabric.effects["a"].clear()
    fabric.advance(4.0)
    lost = [e for e in fabric.effects["a"] if isinstance(e, Log) and e.event == "peer_lost"]
    assert {e.fields["peer"] for e in lost} == {"b", "c"}
    assert sent(fabric, "a", Forward) == []  # nothing went to a peer about to be found silent


def test_f12_a_peer_that_says_disconnect_is_down_at_once() -> None:
    fabric = started()
    fabric.shutdown("c")
    status = {p["broker_id"]: p["status"] for p in fabric.brokers["a"].peers_view()}
    assert status["c"] == "down"


def test_f13_a_disabled_broker_keeps_talking_and_forwards_nothing() -> None:
    fabric = started()
    fabric.worker("c", W1)
    fabric.advance(1.1)
    fabric.brokers["c"].core.state = BrokerState.DISABLED
    fabric.advance(1.0)
    view = {p["broker_id"]: p for p in fabric.brokers["a"].peers_view()}
    assert view["c"]["status"] == "up" and view["c"]["state"] == "disabled"
    fabric.client("a", C1)
    fabric.request("a", C1, b"r1")
    assert fabric.brokers["a"].counters["forwarded"] == 0
    assert fabric.serve("c") == 0


def test_the_restarted_broker_rejoins_and_is_routed_to_again() -> None:
    network = family_config()
    fabric = started()
    fabric.kill("c")
    fabric.advance(4.0)
    fabric.restart("c", network)
    fabric.worker("c", W1)
    fabric.advance(2.0)
    assert linked(fabric, "a") == {"b", "c"}
    fabric.client("a", C1)
    fabric.request("a", C1, b"after")
    assert fabric.serve("c") == 1
    ((_, reply),) = fabric.replies("a")
    assert reply.status == 200


def test_offer_config_says_what_happened_for_management() -> None:
    fabric = started()
    a = fabric.brokers["a"]
    outcome, effects = a.offer_config(
        offer_of(family_config(version=2)), "admin", fabric.now, fabric.wall
    )
    assert isinstance(outcome, Applied) and outcome.previous_version == 1
    assert any(isinstance(e, Persist) for e in effects)
    refused, effects = a.offer_config(
        offer_of(family_config(version=3), key=OTHER_KEY), "admin", fabric.now, fabric.wall
    )
    assert isinstance(refused, Refused) and "signature" in refused.reason
    assert a.replica.version == 2
    assert not any(isinstance(e, Persist) for e in effects)


def test_f9_a_request_waiting_for_a_lost_local_worker_goes_to_a_peer_at_once() -> None:
    fabric = started()
    fabric.worker("a", W1)  # a's only worker, capacity 1
    fabric.worker("c", b"worker-c")
    fabric.advance(1.1)
    fabric.client("c", b"client-c")
    fabric.request("c", b"client-c", b"keeps-c-busy")  # c's worker: no free slot now
    fabric.advance(1.1)  # and a's copy of c's table says so
    fabric.client("a", C1)
    fabric.request("a", C1, b"r1")  # to a's own worker
    fabric.request("a", C1, b"r2")  # a offers echo, busy: it waits at a (F6)
    assert fabric.brokers["a"].stats()["queued"] == 1
    fabric.feed("a", Received(Channel.BACKEND, W1, Disconnect(protocol=SIG_WORKER)))
    fabric.settle()
    assert fabric.brokers["a"].stats()["queued"] == 0  # both went to c, not left to time out
    for _ in range(3):
        fabric.serve("c")
    assert sorted(r.request_id for _, r in fabric.replies("a")) == [b"r1", b"r2"]


def test_f7_what_waits_for_a_lost_last_worker_goes_back_to_its_origin_with_404() -> None:
    fabric = started()
    fabric.worker("a", W1)
    fabric.advance(1.1)
    fabric.client("a", C1)
    fabric.request("a", C1, b"local")  # a's worker is busy with this one
    a = fabric.brokers["a"]
    b_rid = next(rid for rid, name in a.family.broker_of.items() if name == "b")
    a.handle(
        Received(Channel.PEER, b_rid, Forward(b"T9", "echo", "b", (b"x",))),
        0 + fabric.now,
        fabric.wall,
    )
    assert a.stats()["queued"] == 1  # a offers echo: the FORWARD waits there (F7)
    out = a.handle(
        Received(Channel.BACKEND, W1, Disconnect(protocol=SIG_WORKER)), fabric.now, fabric.wall
    )
    answers = [e.message for e in out if isinstance(e, Send) and e.channel is Channel.PEER]
    (answer,) = [m for m in answers if isinstance(m, ForwardReply)]
    assert answer.ticket == b"T9" and answer.status == 404
    assert a.stats()["queued"] == 1  # only a's own request waits: no peer offers echo


def test_f3_a_peer_heard_again_on_the_same_link_after_a_silence_is_up_for_good() -> None:
    """A silence that ends without a restart (a backlog, a one-way stall): the peer's link is
    the same connection, and it never learns that we dropped it, so it does not say HELLO
    again. What it says next on that link must count (liveness, FORWARD), or it would be
    declared silent every liveness period for the rest of its life."""
    fabric = started()
    fabric.worker("c", W1)
    fabric.advance(1.1)
    stall = lambda src, dst, message: src == "c" and dst == "a"  # noqa: E731
    fabric.drops.append(stall)
    fabric.advance(4.5)  # over liveness (3 intervals of 1 s in the fabric): a drops c
    assert {p["broker_id"]: p["status"] for p in fabric.brokers["a"].peers_view()}["c"] == "down"
    fabric.drops.remove(stall)
    fabric.advance(2.0)
    lost = fabric.brokers["a"].counters["peers_lost"]
    fabric.advance(12.0)  # four liveness periods: c heard all along, never dropped again
    assert fabric.brokers["a"].counters["peers_lost"] == lost
    assert {p["broker_id"]: p["status"] for p in fabric.brokers["a"].peers_view()}["c"] == "up"
    fabric.client("a", C1)
    fabric.request("a", C1, b"r1")
    assert fabric.serve("c") == 1
    ((_, reply),) = fabric.replies("a")
    assert reply.status == 200


# ---- F15: FORWARDWITH carries the client's ids and deadline --------------------------------


def _client_as(fabric: Fabric, name: str, rid: bytes, client_id: str) -> None:
    """A client of ``name`` that negotiates the client_id ``client_id`` (the same client
    moving from broker to broker keeps it, §3.9)."""
    version = fabric.brokers[name].network.config_version
    check = CheckConfig(
        config_type=ConfigType.JSON,
        config_version=version,
        client_id=client_id,
        protocol=SIG_CLIENT,
    )
    fabric.feed(name, Received(Channel.FRONTEND, rid, check))
    fabric.settle()


def _id_worker(fabric: Fabric, name: str, rid: bytes, capacity: int = 1) -> None:
    """A worker of ``name`` whose READY asked for request_ids (§4.3): it gets IDREQUEST."""
    version = fabric.brokers[name].network.config_version
    for message in (
        CheckConfig(config_type=ConfigType.JSON, config_version=version, protocol=SIG_WORKER),
        Ready(
            services=("echo",),
            heartbeat=False,
            hbeatinterval_ms=1000,
            time=fabric.wall,
            config_version=version,
            capacity=capacity,
            request_ids=True,
        ),
    ):
        fabric.feed(name, Received(Channel.BACKEND, rid, message))
    fabric.settle()


def _ask(fabric: Fabric, name: str, rid: bytes, request_id: bytes) -> None:
    message = ClientRequest(service="echo", request_id=request_id, body=(b"pay",))
    fabric.feed(name, Received(Channel.FRONTEND, rid, message))
    fabric.settle()


def _answer(fabric: Fabric, name: str, rid: bytes, ticket: bytes) -> None:
    reply = WorkerReply(ticket=ticket, status=200, body=(b"paid",))
    fabric.feed(name, Received(Channel.BACKEND, rid, reply))
    fabric.settle()


def _alice_r1_running_at_c() -> tuple[Fabric, WorkerIdRequest]:
    """A family whose only worker (asking for ids) is at c; alice's r1, asked at a, forwarded
    to c and running there: the fabric and the worker's IDREQUEST."""
    fabric = started()
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    _client_as(fabric, "a", C1, "alice")
    _ask(fabric, "a", C1, b"r1")
    ((_, first),) = fabric.take("c", WorkerIdRequest)
    assert isinstance(first, WorkerIdRequest)
    return fabric, first


def _forwards(fabric: Fabric, name: str) -> list[Forward]:
    return [m for m in sent(fabric, name, Forward) if isinstance(m, Forward)]


def _peer_rid(fabric: Fabric, at: str, of: str) -> bytes:
    """The routing id of ``of``'s link on ``at``'s peer ROUTER."""
    family = fabric.brokers[at].family
    return next(rid for rid, name in family.broker_of.items() if name == of)


def test_f15_brokers_say_they_understand_forwardwith_and_forward_with_the_clients_ids() -> None:
    fabric = started()
    assert all(
        m.understands == {"FORWARDWITH"}  # type: ignore[attr-defined]
        for m in sent(fabric, "a", Hello)
    )
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    _client_as(fabric, "a", C1, "alice")
    _ask(fabric, "a", C1, b"r1")
    (forward,) = _forwards(fabric, "a")
    assert forward.to_frames()[2] == b"FORWARDWITH"
    assert (forward.client_id, forward.request_id) == ("alice", b"r1")
    assert forward.deadline_ms is not None and 4900 <= forward.deadline_ms <= 5000
    # F15: the worker behind the peer is told the client's own ids (§4.3), not empty ones.
    ((_, request),) = fabric.take("c", WorkerIdRequest)
    assert (request.client_id, request.request_id, request.body) == ("alice", b"r1", (b"pay",))


def test_f15_a_peer_whose_hello_does_not_list_it_gets_the_briefs_forward() -> None:
    """Rollout (docs/operations.md): a broker of an older version says HELLO without
    ``understands``; it is sent FORWARD (or FORWARDAS), never a command it would refuse."""
    fabric = started()
    fabric.worker("c", W1)
    fabric.advance(1.1)
    old_hello = Hello("c", "fam", BrokerState.ACTIVE, 1, {}, TableMode.PULL)
    fabric.feed("a", Received(Channel.LINK, b"c", old_hello))
    fabric.settle()
    fabric.client("a", C1)
    fabric.request("a", C1, b"r1")
    (forward,) = _forwards(fabric, "a")
    assert forward.deadline_ms is None and forward.to_frames()[2] == b"FORWARD"
    assert fabric.serve("c") == 1
    # c restarts as the newer version: its HELLO lists FORWARDWITH again, and it is used.
    fabric.feed(
        "a",
        Received(
            Channel.LINK,
            b"c",
            dataclasses.replace(old_hello, understands=frozenset({"FORWARDWITH"})),
        ),
    )
    fabric.settle()
    fabric.effects["a"].clear()
    fabric.request("a", C1, b"r2")
    (forward,) = _forwards(fabric, "a")
    assert forward.deadline_ms is not None


def test_f15_r10_a_resend_via_another_broker_joins_the_request_running_at_the_target() -> None:
    """The client's broker a forwarded r1 to c and died; the client resends r1 via b, which
    forwards it to c too: c joins it to the request its worker runs, nothing runs twice, and
    the answer goes to b (and to a's dead link)."""
    fabric, first = _alice_r1_running_at_c()
    fabric.kill("a")
    c2 = b"client-1-at-b"
    _client_as(fabric, "b", c2, "alice")
    _ask(fabric, "b", c2, b"r1")
    assert len(_forwards(fabric, "b")) == 1  # b has no worker: it forwarded the resend to c
    assert fabric.take("c", WorkerIdRequest) == []  # joined at c: not run again
    assert fabric.brokers["c"].counters["duplicates_joined"] == 1
    _answer(fabric, "c", W1, first.ticket)
    ((rid, reply),) = fabric.replies("b")
    assert rid == c2 and reply.request_id == b"r1" and reply.body == (b"paid",)
    c = fabric.brokers["c"]  # at rest, requests taken on = replies given (docs/management.md)
    assert c.counters["requests"] == sum(c.core.metrics.replies.values()) == 2


def test_f15_r10_a_resend_via_another_broker_after_the_answer_gets_the_targets_cached_reply() -> (
    None
):
    fabric, first = _alice_r1_running_at_c()
    _answer(fabric, "c", W1, first.ticket)
    assert [r.body for _, r in fabric.replies("a")] == [(b"paid",)]
    c2 = b"client-1-at-b"
    _client_as(fabric, "b", c2, "alice")
    _ask(fabric, "b", c2, b"r1")  # the reply to a was lost with a, say: resent via b
    assert fabric.take("c", WorkerIdRequest) == []
    assert fabric.brokers["c"].counters["cache_hits"] == 1
    ((_, reply),) = fabric.replies("b")
    assert reply.status == 200 and reply.body == (b"paid",) and reply.request_id == b"r1"
    # Sent straight to c, the resend finds the same cached reply (one key for both ways).
    c3 = b"client-1-at-c"
    _client_as(fabric, "c", c3, "alice")
    _ask(fabric, "c", c3, b"r1")
    assert fabric.take("c", WorkerIdRequest) == []
    ((_, reply),) = fabric.replies("c")
    assert reply.body == (b"paid",)
    c = fabric.brokers["c"]
    assert c.counters["requests"] == sum(c.core.metrics.replies.values()) == 3


def test_f15_r10_a_resend_straight_to_the_target_joins_a_forwarded_request() -> None:
    fabric, first = _alice_r1_running_at_c()
    fabric.kill("a")
    c3 = b"client-1-at-c"
    _client_as(fabric, "c", c3, "alice")
    _ask(fabric, "c", c3, b"r1")
    assert fabric.take("c", WorkerIdRequest) == []
    _answer(fabric, "c", W1, first.ticket)
    ((rid, reply),) = fabric.replies("c")
    assert rid == c3 and reply.body == (b"paid",)


def test_f15_without_ids_two_forwards_of_one_request_run_twice() -> None:
    """The rule's other side: FORWARD (no ids, an older origin) is keyed on its ticket, so
    the target cannot tell a resend; that is what FORWARDWITH's ids are for."""
    fabric = started()
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    c = fabric.brokers["c"]
    a_rid, b_rid = _peer_rid(fabric, "c", "a"), _peer_rid(fabric, "c", "b")
    for rid, ticket, origin in ((a_rid, b"T1", "a"), (b_rid, b"T2", "b")):
        c.handle(
            Received(Channel.PEER, rid, Forward(ticket, "echo", origin, (b"pay",))),
            fabric.now,
            fabric.wall,
        )
    assert c.counters["duplicates_joined"] == 0
    assert c.counters["forwards_served"] == 2


def test_f15_the_carried_deadline_bounds_the_wait_at_the_target() -> None:
    fabric = started()
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    c = fabric.brokers["c"]
    a_rid = _peer_rid(fabric, "c", "a")
    busy = Forward(
        b"T0", "echo", "a", (b"x",), client_id="bob", request_id=b"r0", deadline_ms=60_000
    )
    short = Forward(
        b"T1", "echo", "a", (b"x",), client_id="alice", request_id=b"r1", deadline_ms=500
    )
    long = Forward(
        b"T2", "echo", "a", (b"x",), client_id="carol", request_id=b"r2", deadline_ms=60_000
    )
    answers: list[ForwardReply] = []
    for forward in (busy, short, long):  # c's one worker takes T0: T1 and T2 wait
        out = c.handle(Received(Channel.PEER, a_rid, forward), fabric.now, fabric.wall)
        answers += [
            e.message for e in out if isinstance(e, Send) and isinstance(e.message, ForwardReply)
        ]
    assert answers == []
    for _ in range(12):  # 0.6 s: past T1's 500 ms, well within c's own 5 s
        fabric.now += 0.05
        out = c.handle(Tick(), fabric.now, fabric.wall)
        answers += [
            e.message for e in out if isinstance(e, Send) and isinstance(e.message, ForwardReply)
        ]
    assert [(a.ticket, a.status) for a in answers] == [(b"T1", 503)]
    for _ in range(100):  # T0 and T2 are held under c's own request_timeout_ms (5 s), not 60 s
        fabric.now += 0.05
        out = c.handle(Tick(), fabric.now, fabric.wall)
        answers += [
            e.message for e in out if isinstance(e, Send) and isinstance(e.message, ForwardReply)
        ]
    assert [(a.ticket, a.status) for a in answers] == [(b"T1", 503), (b"T0", 504), (b"T2", 503)]


def test_f15_a_forward_whose_deadline_is_spent_gets_504_at_once_and_is_not_run() -> None:
    fabric = started()
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    c = fabric.brokers["c"]
    spent = Forward(b"T1", "echo", "a", (b"x",), client_id="alice", request_id=b"r1", deadline_ms=0)
    out = c.handle(
        Received(Channel.PEER, _peer_rid(fabric, "c", "a"), spent), fabric.now, fabric.wall
    )
    (answer,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(answer, ForwardReply) and (answer.ticket, answer.status) == (b"T1", 504)
    assert json.loads(answer.body[0])["code"] == 504
    assert fabric.take("c", WorkerIdRequest) == []


def test_f15_f8_a_refusal_that_arrives_after_the_deadline_is_not_routed_again() -> None:
    fabric = started()
    fabric.worker("c", W1)
    fabric.worker("b", b"worker-b")
    fabric.advance(1.1)
    fabric.client("a", C1)
    fabric.drops.append(lambda src, dst, m: isinstance(m, Forward))  # held: answered by hand
    fabric.request("a", C1, b"r1")
    a = fabric.brokers["a"]
    ((ticket, pending),) = [
        (t, p)
        for held in a.family.peers.values()
        for t in held.forwarded
        if (p := a.ledger.running(t)) is not None and p.peer
    ]
    peer = pending.peer
    fabric.now = pending.deadline  # the 503 reaches a just as the request's deadline passes
    refusal = ForwardReply(ticket, 503, ())
    out = a.handle(Received(Channel.LINK, peer.encode(), refusal), fabric.now, fabric.wall)
    assert not [e for e in out if isinstance(e, Send) and isinstance(e.message, Forward)]
    (reply,) = [
        e.message for e in out if isinstance(e, Send) and isinstance(e.message, ClientReply)
    ]
    assert reply.status == 503


def test_f15_a_malformed_forwardwith_gets_400_and_counts_towards_the_error_score() -> None:
    from scale0.wire.errors import ProtocolError
    from scale0.wire.registry import decode_to_broker

    fabric = started()
    c = fabric.brokers["c"]
    a_rid = _peer_rid(fabric, "c", "a")
    frames = Forward(
        b"T1", "echo", "a", (b"x",), client_id="alice", request_id=b"r1", deadline_ms=10
    ).to_frames()
    frames[6] = b'{"deadline_ms":10,"client_id":"alice"}'  # request_id missing
    try:
        decode_to_broker(frames, max_frame_bytes=1 << 20, signatures={SIG_BROKER})
    except ProtocolError as exc:
        error = exc
    else:
        raise AssertionError("a FORWARDWITH with a client_id and no request_id decoded")
    out = c.handle(Malformed(Channel.PEER, a_rid, error), fabric.now, fabric.wall)
    (refusal,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(refusal, DisconnectError) and refusal.code == 400
    assert "request_id" in refusal.message
    assert c.counters["malformed"] == 1 and c.counters["forwards_served"] == 0


def _held_by(fabric: Fabric, name: str) -> str:
    broker = fabric.brokers[name]
    ((_, pending),) = [
        (t, p)
        for held in broker.family.peers.values()
        for t in held.forwarded
        if (p := broker.ledger.running(t)) is not None and p.peer
    ]
    assert pending.peer is not None
    return pending.peer


def test_f15_f3_what_a_lost_peer_held_goes_back_to_it_when_it_comes_back() -> None:
    """A flapping link (tools/partitions): a finds b silent while b's worker runs r1. r1 waits
    for b (not c, where it would run a second time) and goes back to b when b is heard again;
    b joins it to the run, and the client is answered once, by the one run."""
    fabric = started()
    _id_worker(fabric, "b", b"worker-b")
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    _client_as(fabric, "a", C1, "alice")
    _ask(fabric, "a", C1, b"r1")
    held = _held_by(fabric, "a")
    other = "c" if held == "b" else "b"
    ((worker, first),) = fabric.take(held, WorkerIdRequest)
    fabric.pause(held)
    fabric.advance(4.1)  # liveness (3 x 1 s): a finds it silent and takes r1 back
    lost = [e for e in fabric.effects["a"] if isinstance(e, Log) and e.event == "peer_lost"]
    assert [e.fields["peer"] for e in lost] == [held]
    assert fabric.take(other, WorkerIdRequest) == []  # not run a second time elsewhere
    fabric.resume(held)
    fabric.advance(1.1)  # heard again: its table comes, and r1 goes back to it
    assert fabric.take(held, WorkerIdRequest) == []  # joined to the run, not run again
    assert fabric.brokers[held].counters["duplicates_joined"] == 1
    _answer(fabric, held, worker, first.ticket)
    ((_, reply),) = fabric.replies("a")
    assert reply.status == 200 and reply.body == (b"paid",)
    assert fabric.take(other, WorkerIdRequest) == []


def test_f15_r5_what_waits_for_a_lost_peer_never_fills_a_worker_past_capacity() -> None:
    """Requests waiting for their lost peer (F15) wait even while a worker here is ready; when
    that worker frees a slot it takes them, and once full it is ready no more: the next
    request waits for it instead of making it run one more than its capacity (R5)."""
    fabric = started()
    _id_worker(fabric, "a", W1, capacity=2)
    _id_worker(fabric, "b", b"worker-b", capacity=2)
    fabric.advance(1.1)
    _client_as(fabric, "a", C1, "alice")
    for request_id in (b"r1", b"r2", b"r3", b"r4"):
        _ask(fabric, "a", C1, request_id)  # r1, r2 to W1 (capacity 2); r3, r4 to b (F6)
    first, second = fabric.take("a", WorkerIdRequest)
    _answer(fabric, "a", W1, first[1].ticket)  # W1 is ready again, with one free slot
    fabric.pause("b")
    fabric.advance(4.1)  # b found silent: r3 and r4 wait for it (F15), W1 ready beside them
    a = fabric.brokers["a"]
    assert a.ledger.waiting_count("echo") == 2 and a.ledger.ready_count("echo") == 1
    _answer(fabric, "a", W1, second[1].ticket)  # W1 frees a slot: it takes r3 and r4, full
    assert sorted(m.request_id for _, m in fabric.take("a", WorkerIdRequest)) == [b"r3", b"r4"]
    assert a.ledger.ready_count("echo") == 0
    _client_as(fabric, "a", b"client-2", "bob")
    _ask(fabric, "a", b"client-2", b"r5")
    assert fabric.take("a", WorkerIdRequest) == []  # R5: W1 runs two, its capacity
    worker = a.ledger.worker(W1)
    assert worker is not None and a.ledger.used(worker) == 2
    assert a.ledger.waiting_count("echo") == 1


def test_f15_f3_a_lost_peer_that_does_not_come_back_in_time_leaves_it_to_another() -> None:
    fabric = started()
    _id_worker(fabric, "b", b"worker-b")
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    _client_as(fabric, "a", C1, "alice")
    _ask(fabric, "a", C1, b"r1")
    held = _held_by(fabric, "a")
    other = "c" if held == "b" else "b"
    fabric.kill(held)
    fabric.advance(4.1)  # found silent (after 3 s, at a 1 s check): r1 waits for it...
    lost = [e for e in fabric.effects["a"] if isinstance(e, Log) and e.event == "peer_lost"]
    assert [e.fields["peer"] for e in lost] == [held]
    assert fabric.take(other, WorkerIdRequest) == []
    fabric.advance(2.6)  # ...at most min(liveness window 3 s, request_timeout_ms / 2 = 2.5 s)
    ((worker, request),) = fabric.take(other, WorkerIdRequest)
    assert (request.client_id, request.request_id) == ("alice", b"r1")
    _answer(fabric, other, worker, request.ticket)
    ((_, reply),) = fabric.replies("a")
    assert reply.status == 200


def test_f15_f12_what_a_peer_that_said_disconnect_held_goes_elsewhere_at_once() -> None:
    """Waiting for a peer is for a suspicion (found silent); one that said DISCONNECT is gone."""
    fabric = started()
    _id_worker(fabric, "b", b"worker-b")
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    _client_as(fabric, "a", C1, "alice")
    _ask(fabric, "a", C1, b"r1")
    held = _held_by(fabric, "a")
    other = "c" if held == "b" else "b"
    fabric.shutdown(held)
    ((_, request),) = fabric.take(other, WorkerIdRequest)
    assert (request.client_id, request.request_id) == ("alice", b"r1")


def test_f15_r10_every_forward_joined_to_a_request_gets_its_partials_and_its_reply() -> None:
    fabric = started()
    _id_worker(fabric, "c", W1)
    fabric.advance(1.1)
    c = fabric.brokers["c"]
    a_rid, b_rid = _peer_rid(fabric, "c", "a"), _peer_rid(fabric, "c", "b")
    sends: list[Send] = []
    for rid, ticket, origin in ((a_rid, b"TA", "a"), (b_rid, b"TB", "b")):
        forward = Forward(
            ticket, "echo", origin, (b"x",), client_id="alice", request_id=b"r1", deadline_ms=3000
        )
        out = c.handle(Received(Channel.PEER, rid, forward), fabric.now, fabric.wall)
        sends += [e for e in out if isinstance(e, Send)]
    (run,) = [s for s in sends if isinstance(s.message, WorkerIdRequest)]
    assert len(sends) == 1  # the second forward joined the first: nothing else went out
    ticket = run.message.ticket
    partial = WorkerPartial(ticket=ticket, body=(b"half",))
    out = c.handle(Received(Channel.BACKEND, W1, partial), fabric.now, fabric.wall)
    got = sorted(
        (e.routing_id, e.message.ticket)
        for e in out
        if isinstance(e, Send) and isinstance(e.message, ForwardPartial)
    )
    assert got == sorted([(a_rid, b"TA"), (b_rid, b"TB")])
    reply = WorkerReply(ticket=ticket, status=200, body=(b"paid",))
    out = c.handle(Received(Channel.BACKEND, W1, reply), fabric.now, fabric.wall)
    got_replies = sorted(
        (e.routing_id, e.message.ticket, e.message.body)
        for e in out
        if isinstance(e, Send) and isinstance(e.message, ForwardReply)
    )
    assert got_replies == sorted([(a_rid, b"TA", (b"paid",)), (b_rid, b"TB", (b"paid",))])
