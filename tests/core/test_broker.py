"""The broker core's numbered rules (scale0/core/broker.py), each driven with numbers, no sleeps."""

from __future__ import annotations

import json
import re

import pytest

from scale0.config.canonical import tree_sha256
from scale0.config.formats import parse
from scale0.core import broker as broker_module
from scale0.core.effects import Drain, Drained
from scale0.wire.client import (
    CheckConfig,
    ClientPartial,
    ClientReply,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.peer import BrokerState
from scale0.wire.worker import WorkerPartial, WorkerReply
from tests.core.harness import BACK, FRONT, Harness, dispatched, only, replies, sends

C1, C2 = b"\x00client1", b"\x00client2"
W1, W2, W3, W4 = b"\x00w1", b"\x00w2", b"\x00w3", b"\x00w4"


def error_of(reply: ClientReply) -> tuple[int, str]:
    return reply.status, json.loads(reply.body[0])["message"]


def test_rules_header_lists_twenty_three_rules() -> None:
    doc = broker_module.__doc__ or ""
    assert re.findall(r"^ R(\d+) ", doc, re.M) == [str(i) for i in range(1, 24)]


# ---- R1, R2, R3: negotiation ------------------------------------------------------------------


def test_r1_request_before_checkconfig_gets_forcenegotiate() -> None:
    h = Harness()
    h.worker(W1)
    rid, msg = only(sends(h.request(C1, b"r1")))
    assert rid == C1 and isinstance(msg, ForceNegotiate)
    assert h.broker.stats()["requests"] == 0


def test_r1_ready_before_checkconfig_gets_forcenegotiate() -> None:
    from scale0.wire.worker import Ready

    h = Harness()
    out = h.send(
        BACK,
        W1,
        Ready(
            services=("echo",), heartbeat=True, hbeatinterval_ms=1000, time=h.wall, config_version=3
        ),
    )
    assert isinstance(only(sends(out))[1], ForceNegotiate)
    assert h.broker.services() == {}


def test_r2_current_version_gets_configack() -> None:
    h = Harness()
    _rid, msg = only(sends(h.client(C1, client_id="alice")))
    assert msg == ConfigAck(config_version=3, client_id="alice", protocol=SIG_CLIENT)


@pytest.mark.parametrize("config_type", list(ConfigType))
def test_r2_other_version_gets_config_in_the_asked_format(config_type: ConfigType) -> None:
    h = Harness()
    out = h.send(
        FRONT, C1, CheckConfig(config_type=config_type, config_version=1, protocol=SIG_CLIENT)
    )
    msg = only(sends(out))[1]
    assert isinstance(msg, Config)
    assert msg.config_version == 3
    # §3.2: the digest is of the view sent (not the whole config), and no signature comes with
    # a partial view. For JSON the client can recompute it from the document itself.
    assert msg.sha256 != h.broker.sha256 and msg.signature is None
    assert msg.sha256 == h.broker.client_view_sha256
    if config_type is ConfigType.JSON:
        assert msg.sha256 == tree_sha256(json.loads(msg.document))
    assert msg.client_id == "b1." + C1.hex()  # none asked for: the broker names it (§3.2)
    text = msg.document.decode()
    assert "admins" not in text and "password" not in text
    assert "test" in text and "tcp://127.0.0.1:7001" in text


def test_r2_config_view_leaves_out_what_client_view_does_not_name() -> None:
    h = Harness(client_view=("family", "config_version"))
    msg = only(
        sends(h.send(FRONT, C1, CheckConfig(config_type=ConfigType.JSON, protocol=SIG_CLIENT)))
    )[1]
    assert json.loads(msg.document) == {"family": "test", "config_version": 3}


@pytest.mark.parametrize("state", ["joining", "disabled"])
def test_r3_not_active_refuses_negotiation_and_work(state: str) -> None:
    h = Harness(state=state)  # type: ignore[arg-type]
    msg = only(sends(h.client(C1)))[1]
    assert isinstance(msg, DisconnectError) and msg.code == 503
    h.broker.core.state = BrokerState.ACTIVE
    h.client(C1)
    h.broker.core.state = BrokerState(state)
    msg = only(sends(h.request(C1, b"r")))[1]
    assert isinstance(msg, DisconnectError) and msg.code == 503


def test_taken_client_id_gets_409_while_its_holder_lives() -> None:
    h = Harness()
    h.client(C1, client_id="alice")
    msg = only(sends(h.client(C2, client_id="alice")))[1]
    assert isinstance(msg, DisconnectError) and msg.code == 409
    h.advance(1.5)  # the holder has been silent for over one interval: a reconnect takes over
    msg = only(sends(h.client(C2, client_id="alice")))[1]
    assert isinstance(msg, ConfigAck)


# ---- R4, R5: READY and LRU routing ------------------------------------------------------------


def test_r4_ready_registers_each_service() -> None:
    h = Harness()
    h.worker(W1, ("echo", "time"))
    assert h.broker.services() == {
        "echo": {"workers": 1, "ready": 1, "queued": 0},
        "time": {"workers": 1, "ready": 1, "queued": 0},
    }


def test_r4_new_ready_replaces_services_live() -> None:
    h = Harness()
    h.worker(W1, ("echo",))
    h.worker(W1, ("time",))
    assert set(h.broker.services()) == {"time"}
    h.client(C1)
    assert only(dispatched(h.request(C1, b"r", service="time")))[0] == W1


def test_r5_n_idle_workers_get_n_requests_each_on_a_different_worker() -> None:
    h = Harness()
    for w in (W1, W2, W3, W4):
        h.worker(w)
    h.client(C1)
    chosen = [only(dispatched(h.request(C1, f"r{i}".encode())))[0] for i in range(4)]
    assert chosen == [W1, W2, W3, W4]


def test_r5_least_recently_used_goes_first() -> None:
    h = Harness()
    h.worker(W1)
    h.worker(W2)
    h.client(C1)
    t1 = only(dispatched(h.request(C1, b"a")))[1].ticket
    h.reply(W1, t1)  # W1 is ready again, but W2 has waited longer
    assert only(dispatched(h.request(C1, b"b")))[0] == W2
    assert only(dispatched(h.request(C1, b"c")))[0] == W1


def test_r5_capacity_takes_that_many_at_once() -> None:
    h = Harness()
    h.worker(W1, capacity=3)
    h.client(C1)
    for i in range(3):
        assert only(dispatched(h.request(C1, f"r{i}".encode())))[0] == W1
    assert dispatched(h.request(C1, b"r3")) == []
    assert h.broker.services()["echo"]["queued"] == 1


def test_reply_reaches_the_client_with_its_request_id() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1)
    ticket = only(dispatched(h.request(C1, b"req-7", body=b"ping")))[1]
    assert ticket.body == (b"ping",) and ticket.service == "echo"
    rid, reply = only(replies(h.reply(W1, ticket.ticket, body=b"pong")))
    assert rid == C1
    assert reply == ClientReply(service="echo", request_id=b"req-7", status=200, body=(b"pong",))


def test_tickets_carry_the_boot_id_and_never_repeat() -> None:
    h = Harness()
    h.worker(W1, capacity=5)
    h.client(C1)
    tickets = [only(dispatched(h.request(C1, f"r{i}".encode())))[1].ticket for i in range(5)]
    assert len(set(tickets)) == 5 and all(t.startswith(b"BOOT") for t in tickets)


# ---- R6, R7: waiting, 503, 404 ----------------------------------------------------------------


def test_r6_waiting_request_goes_to_the_next_ready_worker() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1)
    t1 = only(dispatched(h.request(C1, b"a")))[1].ticket
    assert dispatched(h.request(C1, b"b")) == []
    out = h.reply(W1, t1)
    assert only(dispatched(out))[0] == W1
    assert h.broker.services()["echo"]["queued"] == 0


def test_r6_deadline_passes_while_waiting_503() -> None:
    h = Harness()
    h.worker(W1, heartbeat=False)  # never expires: the only thing that moves is the clock
    h.client(C1)
    only(dispatched(h.request(C1, b"a")))
    h.advance(1.0)
    h.heartbeat(FRONT, C1)
    h.request(C1, b"b")
    h.advance(3.5)
    h.heartbeat(FRONT, C1)
    out = h.advance(1.499)  # t = 5.999: "a" in flight is past its deadline, "b" is not yet
    assert [(m.request_id, m.status) for _, m in replies(out)] == [(b"a", 504)]
    rid, reply = only(replies(h.advance(0.001)))
    assert rid == C1 and reply.request_id == b"b" and reply.status == 503
    assert h.broker.services()["echo"]["queued"] == 0


def test_r6_queue_bound_answers_503_at_once() -> None:
    h = Harness(max_queued_requests=2)
    h.worker(W1)
    h.client(C1)
    h.request(C1, b"busy")
    h.request(C1, b"q1")
    h.request(C1, b"q2")
    _rid, reply = only(replies(h.request(C1, b"q3")))
    assert reply.status == 503 and "already wait" in error_of(reply)[1]


def test_r7_unknown_service_404_after_startup_grace() -> None:
    h = Harness()
    h.advance(5.0)  # request_timeout_ms after start: the grace for workers to return is over
    h.client(C1)
    _rid, reply = only(replies(h.request(C1, b"a", service="nope")))
    assert error_of(reply) == (404, "no service 'nope'")


def test_r7_within_startup_grace_a_request_waits_for_a_worker() -> None:
    h = Harness()
    h.client(C1)
    assert replies(h.request(C1, b"a")) == []
    assert only(dispatched(h.worker(W1)))[0] == W1


def test_r7_service_whose_worker_just_left_still_waits() -> None:
    h = Harness()
    h.advance(10)
    h.worker(W1)
    h.client(C1)
    h.send(BACK, W1, Disconnect(protocol=SIG_WORKER))
    assert replies(h.request(C1, b"a")) == []  # waits: a worker may come back
    h.advance(5.0)
    h.client(C1)
    assert only(replies(h.request(C1, b"b")))[1].status == 404


def test_family_services_list_limits_routing_and_listed_services_wait() -> None:
    h = Harness(services=("echo",))
    h.advance(10)  # past the startup grace
    h.client(C1)
    assert only(replies(h.request(C1, b"a", service="time")))[1].status == 404
    assert replies(h.request(C1, b"b", service="echo")) == []  # listed: waits for a worker
    assert only(dispatched(h.worker(W1)))[1].service == "echo"


def test_r13_malformed_message_ends_the_session() -> None:
    h = Harness()
    h.worker(W1)
    h.garbage(BACK, W1)
    assert h.broker.stats()["workers"] == 0


# ---- R8, R9: lost workers, deadlines ----------------------------------------------------------


def test_r8_worker_expires_at_exactly_liveness_times_interval() -> None:
    h = Harness()
    h.worker(W1, interval_ms=2000)
    assert h.broker.stats()["workers"] == 1
    h.advance(5.999)
    assert h.broker.stats()["workers"] == 1
    h.advance(0.001)  # 3 x 2 s
    assert h.broker.stats()["workers"] == 0


def test_r8_any_message_counts_as_a_heartbeat() -> None:
    h = Harness()
    h.worker(W1)
    h.advance(2.5)
    h.heartbeat(BACK, W1)
    h.advance(2.5)
    assert h.broker.stats()["workers"] == 1
    h.advance(0.5)
    assert h.broker.stats()["workers"] == 0


def test_r8_worker_without_heartbeat_never_expires_for_silence() -> None:
    h = Harness()
    h.worker(W1, heartbeat=False)
    h.advance(3600)
    assert h.broker.stats()["workers"] == 1


def test_r8_request_of_a_dead_worker_is_retried_on_another() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1)
    first = only(dispatched(h.request(C1, b"a")))
    assert first[0] == W1
    h.advance(1.0)
    h.worker(W2)
    h.heartbeat(BACK, W2)
    out = h.advance(2.0)  # W1 silent for 3 s: lost
    worker, retry = only(dispatched(out))
    assert worker == W2 and retry.ticket != first[1].ticket
    assert h.broker.stats()["retries"] == 1
    _rid, reply = only(replies(h.reply(W2, retry.ticket, body=b"done")))
    assert reply.request_id == b"a" and reply.body == (b"done",)


def test_r8_retry_limit_then_504() -> None:
    h = Harness(max_retries=1)
    h.worker(W1)
    h.client(C1)
    h.request(C1, b"a")
    h.worker(W2)
    h.send(BACK, W1, Disconnect(protocol=SIG_WORKER))  # retry 1 goes to W2
    out = h.send(BACK, W2, Disconnect(protocol=SIG_WORKER))
    _rid, reply = only(replies(out))
    assert error_of(reply)[0] == 504 and "2 attempt" in error_of(reply)[1]


def test_r9_request_past_its_deadline_in_flight_is_504_not_retried() -> None:
    h = Harness()
    h.worker(W1)
    h.worker(W2)
    h.client(C1)
    ticket = only(dispatched(h.request(C1, b"a")))[1].ticket
    for _ in range(5):  # keep everyone alive
        h.heartbeat(BACK, W1)
        h.heartbeat(BACK, W2)
        h.heartbeat(FRONT, C1)
        out = h.advance(1.0)
    _rid, reply = only(replies(out))
    assert reply.status == 504 and dispatched(out) == []
    # The late answer is dropped, and gives W1 its slot back.
    assert replies(h.reply(W1, ticket)) == []
    assert h.broker.services()["echo"]["ready"] == 2


def test_an_answered_request_no_longer_sets_the_next_deadline() -> None:
    """The node arms its one timer at next_deadline(): answered requests must not keep it busy."""
    h = Harness(request_timeout_ms=100)  # request deadlines come before every session timer
    h.worker(W1, heartbeat=False)
    h.client(C1)
    idle = h.broker.next_deadline()
    assert idle is not None and idle > h.now + 0.1
    for n in range(50):
        ticket = only(dispatched(h.request(C1, b"r%d" % n)))[1].ticket
        assert h.broker.next_deadline() == pytest.approx(h.now + 0.1)  # this one's deadline
        assert only(replies(h.reply(W1, ticket)))[1].status == 200
        assert h.broker.next_deadline() == idle
    # A request still running keeps its deadline, and still gets its 504 at it.
    ticket = only(dispatched(h.request(C1, b"late")))[1].ticket
    assert h.broker.next_deadline() == pytest.approx(h.now + 0.1)
    assert only(replies(h.advance(0.1)))[1].status == 504


def test_r9_partial_moves_the_deadline_and_streams_in_order() -> None:
    h = Harness()
    h.worker(W1, heartbeat=False)
    h.client(C1)
    ticket = only(dispatched(h.request(C1, b"a")))[1].ticket
    parts = []
    for i in range(3):
        h.advance(4.0)
        h.heartbeat(FRONT, C1)
        out = h.send(BACK, W1, WorkerPartial(ticket=ticket, body=(f"p{i}".encode(),)))
        parts += [m.body for r, m in sends(out, FRONT) if isinstance(m, ClientPartial)]
    assert parts == [(b"p0",), (b"p1",), (b"p2",)]
    assert only(replies(h.reply(W1, ticket, body=b"end")))[1].body == (b"end",)


# ---- R10: the reply cache ---------------------------------------------------------------------


def test_r10_retry_of_an_answered_request_gets_the_cached_reply() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1, client_id="alice")
    ticket = only(dispatched(h.request(C1, b"a")))[1].ticket
    first = only(replies(h.reply(W1, ticket, body=b"once")))[1]
    out = h.request(C1, b"a")
    assert dispatched(out) == [] and only(replies(out))[1] == first
    assert h.broker.stats()["cache_hits"] == 1


def test_r10_retry_from_a_new_connection_with_the_same_client_id_is_not_run_twice() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1, client_id="alice")
    ticket = only(dispatched(h.request(C1, b"a")))[1].ticket
    h.advance(1.5)
    h.heartbeat(BACK, W1)
    h.client(C2, client_id="alice")  # reconnected while the request runs
    assert dispatched(h.request(C2, b"a")) == []
    rid, _reply = only(replies(h.reply(W1, ticket)))
    assert rid == C2  # answered where the client now is


def test_r10_different_clients_may_use_the_same_request_id() -> None:
    h = Harness()
    h.worker(W1, capacity=2)
    h.client(C1, client_id="alice")
    h.client(C2, client_id="bob")
    assert len(dispatched(h.request(C1, b"a"))) == 1
    assert len(dispatched(h.request(C2, b"a"))) == 1


# ---- R11, R12: intervals and clocks -----------------------------------------------------------


def test_r11_shorter_interval_is_raised_and_announced() -> None:
    h = Harness()
    h.worker(W1, interval_ms=100)
    beat = only(sends(h.advance(1.0), BACK))[1]
    assert isinstance(beat, Heartbeat) and beat.hbeatinterval_ms == 1000
    h.advance(2.0)
    assert h.broker.stats()["workers"] == 0  # expiry uses 3 x 1000 ms, not 3 x 100 ms


def test_r11_longer_interval_is_kept() -> None:
    h = Harness()
    h.worker(W1, interval_ms=5000)
    assert sends(h.advance(4.9), BACK) == []
    beat = only(sends(h.advance(0.1), BACK))[1]
    assert beat.hbeatinterval_ms == 5000


def test_r12_clock_skew_gets_412_and_forgets_the_sender() -> None:
    h = Harness()
    h.worker(W1)
    msg = only(sends(h.heartbeat(BACK, W1, skew=31.0)))[1]
    assert isinstance(msg, DisconnectError) and msg.code == 412
    assert h.broker.stats()["workers"] == 0
    assert sends(h.heartbeat(BACK, W1, skew=29.0)) != []  # forgotten: asked to negotiate again


# ---- R13: error score and ban -----------------------------------------------------------------


def test_r13_errors_over_threshold_ban_then_silence() -> None:
    h = Harness(error_threshold=3, error_ban_s=60.0)
    for _ in range(3):
        msg = only(sends(h.garbage(FRONT, C1)))[1]
        assert isinstance(msg, DisconnectError) and msg.code == 400
    msg = only(sends(h.garbage(FRONT, C1)))[1]
    assert msg.code == 429
    assert h.broker.is_banned(C1, h.now)
    assert sends(h.garbage(FRONT, C1)) == []
    h.advance(59.9)
    assert h.broker.is_banned(C1, h.now)
    h.advance(0.1)
    assert not h.broker.is_banned(C1, h.now)


def test_r13_errors_spread_over_more_than_the_window_do_not_ban() -> None:
    h = Harness(error_threshold=3, error_window_s=10.0)
    for _ in range(10):
        h.garbage(FRONT, C1)
        h.advance(4.0)
    assert not h.broker.is_banned(C1, h.now)


def test_r13_unknown_command_is_answered_501() -> None:
    h = Harness()
    msg = only(sends(h.garbage(BACK, W1, code=501)))[1]
    assert msg.code == 501 and msg.protocol == SIG_WORKER


# ---- R14 .. R17 -------------------------------------------------------------------------------


def test_r14_reply_with_unknown_ticket_is_dropped_silently() -> None:
    h = Harness()
    h.worker(W1)
    assert sends(h.reply(W1, b"BOOT-no-such")) == []
    assert h.broker.stats()["dropped"] == 1


def test_r14_reply_from_another_worker_is_dropped() -> None:
    h = Harness()
    h.worker(W1)
    h.worker(W2)
    h.client(C1)
    worker, req = only(dispatched(h.request(C1, b"a")))
    other = W2 if worker == W1 else W1
    assert replies(h.reply(other, req.ticket)) == []
    assert only(replies(h.reply(worker, req.ticket)))[1].status == 200


@pytest.mark.parametrize("service", ["mmi.service", "scale0.admin"])
def test_r15_ready_for_a_reserved_service_is_refused(service: str) -> None:
    h = Harness()
    msg = only(sends(h.worker(W1, ("echo", service))))[1]
    assert isinstance(msg, DisconnectError) and msg.code == 400
    assert h.broker.services() == {}


def test_r15_ready_for_a_service_this_broker_does_not_route_is_refused() -> None:
    h = Harness(services=("echo",))
    msg = only(sends(h.worker(W1, ("time",))))[1]
    assert msg.code == 400 and "time" in msg.message


def test_r16_heartbeat_with_older_config_version_gets_forcenegotiate() -> None:
    h = Harness()
    h.client(C1)
    assert isinstance(only(sends(h.heartbeat(FRONT, C1, version=2)))[1], ForceNegotiate)
    assert isinstance(only(sends(h.heartbeat(FRONT, C1, version=3)))[1], Heartbeat)


def test_r17_shutdown_tells_everyone_disconnect() -> None:
    h = Harness()
    h.client(C1)
    h.worker(W1)
    told = {(r, m.protocol) for r, m in sends(h.shutdown()) if isinstance(m, Disconnect)}
    assert told == {(C1, SIG_CLIENT), (W1, SIG_WORKER)}


def test_r19_drain_finishes_what_is_in_flight_then_says_drained() -> None:
    h = Harness()
    h.client(C1)
    h.client(C2)
    h.worker(W1)
    h.worker(W2)
    (worker, job), *_ = dispatched(h.request(C1, b"r1"))
    effects = h.broker.handle(Drain(grace_ms=1000), h.now, h.wall)
    assert not any(isinstance(e, Drained) for e in effects)
    told = {(r, type(m)) for r, m in sends(effects)}
    idle_worker = W2 if worker == W1 else W1
    # The idle client and the idle worker are told DISCONNECT at once; C1 and its worker wait.
    assert told == {(C2, Disconnect), (idle_worker, Disconnect)}
    refused = only(sends(h.request(C2, b"r2")))[1]
    assert isinstance(refused, (DisconnectError, ForceNegotiate))
    effects = h.send(BACK, worker, WorkerReply(ticket=job.ticket, status=200, body=(b"ok",)))
    assert only(replies(effects))[1].body == (b"ok",)
    told = {(r, type(m)) for r, m in sends(effects) if not isinstance(m, ClientReply)}
    assert told == {(C1, Disconnect), (worker, Disconnect)}
    assert [e for e in effects if isinstance(e, Drained)] == [Drained()]


def test_r19_drain_with_nothing_in_flight_is_drained_at_once() -> None:
    h = Harness()
    h.client(C1)
    effects = h.broker.handle(Drain(grace_ms=1000), h.now, h.wall)
    assert Drained() in effects


# ---- the rest ---------------------------------------------------------------------------------


def test_other_reserved_services() -> None:
    h = Harness()
    h.client(C1)
    assert only(replies(h.request(C1, b"a", service="mmi.nothing")))[1].status == 501
    assert only(replies(h.request(C1, b"b", service="scale0.x")))[1].status == 404


def test_r15_empty_ready_keeps_the_session_and_takes_no_work() -> None:
    h = Harness()
    assert not any(isinstance(m, DisconnectError) for _, m in sends(h.worker(W1, ())))
    assert h.broker.stats()["workers"] == 1 and h.broker.services() == {}


def test_mmi_service_answers_from_live_state() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1)
    assert only(replies(h.request(C1, b"a", service="mmi.service", body=b"echo")))[1].body == (
        b"200",
    )
    assert only(replies(h.request(C1, b"b", service="mmi.service", body=b"nope")))[1].body == (
        b"404",
    )


def test_client_session_expires_without_heartbeats_and_must_negotiate_again() -> None:
    h = Harness()
    h.client(C1)
    h.advance(3.0)
    assert isinstance(only(sends(h.heartbeat(FRONT, C1)))[1], ForceNegotiate)


def test_config_view_loads_back_in_every_format() -> None:
    h = Harness()
    for config_type in ConfigType:
        document = h.broker.client_view(config_type)
        # A client view is a partial network config, so it is read as a plain tree.
        tree = parse(document, config_type.value).tree  # type: ignore[arg-type]
        assert tree["family"] == "test" and str(tree["config_version"]) == "3"


# ---- R21: a CHECKCONFIG flood -----------------------------------------------------------------


def test_r21_a_checkconfig_flood_is_answered_then_banned() -> None:
    h = Harness(error_threshold=3, error_ban_s=60.0)
    _rid, first = only(sends(h.client(C1)))
    assert isinstance(first, ConfigAck)
    # The same question again within one interval, holding the running config: answered, and
    # each one counted; past the threshold the sender is banned and told 429.
    for _ in range(3):
        assert isinstance(only(sends(h.client(C1)))[1], ConfigAck)
    msg = only(sends(h.client(C1)))[1]
    assert isinstance(msg, DisconnectError) and msg.code == 429
    assert h.broker.is_banned(C1, h.now)
    assert h.broker.stats()["checkconfig_repeated"] == 4


def test_r21_asking_once_an_interval_or_after_forcenegotiate_is_not_a_flood() -> None:
    h = Harness(error_threshold=3, error_ban_s=60.0)
    h.client(C1)
    for _ in range(10):
        h.advance(h.broker.core.interval_s)
        assert isinstance(only(sends(h.client(C1)))[1], ConfigAck)
    # An older version (a client told FORCENEGOTIATE after a config change): never counted.
    older = CheckConfig(config_type=ConfigType.JSON, config_version=1, protocol=SIG_CLIENT)
    for _ in range(10):
        assert isinstance(only(sends(h.send(FRONT, C1, older)))[1], Config)
    assert not h.broker.is_banned(C1, h.now)
    assert h.broker.stats().get("checkconfig_repeated", 0) == 0
