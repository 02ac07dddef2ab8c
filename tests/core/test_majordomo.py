"""Majordomo clients and workers in the pure core: rules D1-D4 of scale0/core/majordomo.py."""

from __future__ import annotations

import json

from scale0.core.effects import Effect, Malformed, Send
from scale0.wire.client import (
    CheckConfig,
    ClientReply,
    ConfigAck,
    DisconnectError,
    ForceNegotiate,
)
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import SIG_WORKER, ConfigType
from scale0.wire.mdp import (
    MDPC01,
    MDPC02,
    MDPW01,
    MDPW02,
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
from scale0.wire.worker import WorkerRequest
from tests.core.harness import BACK, FRONT, Harness, dispatched, only, replies, sends
from tests.core.test_family import started

MC = b"\x00mc"  # a Majordomo client
MW = b"\x00mw"  # a Majordomo worker
SC = b"\x00sc"  # an S0P client
SW = b"\x00sw"  # an S0P worker


def mdp_worker(
    h: Harness, rid: bytes = MW, protocol: bytes = MDPW01, service: str = "echo"
) -> list[Effect]:
    return h.send(BACK, rid, MdpWorkerReady(service, protocol=protocol))


def mdp_request(
    h: Harness, service: str = "echo", protocol: bytes = MDPC01, rid: bytes = MC
) -> list[Effect]:
    return h.send(FRONT, rid, MdpClientRequest(service, (b"hi",), protocol=protocol))


def test_d1_a_majordomo_client_needs_no_checkconfig_and_reaches_an_s0p_worker() -> None:
    h = Harness()
    h.worker(SW)
    out = mdp_request(h)
    worker, request = only(dispatched(out))
    assert worker == SW and request.body == (b"hi",)
    answer = only(sends(h.reply(SW, request.ticket, b"done"), FRONT))
    assert answer == (MC, MdpClientReply("echo", (b"done",), protocol=MDPC01))


def test_d1_d2_an_s0p_client_reaches_a_majordomo_worker_and_its_reply_is_200() -> None:
    h = Harness()
    assert sends(mdp_worker(h), BACK) == []  # READY needs no answer
    h.client(SC)
    rid, message = only(sends(h.request(SC, b"r1"), BACK))
    assert rid == MW and isinstance(message, MdpWorkerRequest) and message.protocol == MDPW01
    assert message.body == (b"hi",)
    out = h.send(BACK, MW, MdpWorkerReply(message.ticket, (b"done",), protocol=MDPW01))
    reply = only(replies(out))[1]
    assert reply.status == 200 and reply.body == (b"done",) and reply.request_id == b"r1"


def test_d2_a_majordomo_worker_takes_one_request_at_a_time() -> None:
    h = Harness()
    mdp_worker(h, protocol=MDPW02)
    first = only(sends(mdp_request(h, protocol=MDPC02), BACK))[1]
    assert sends(mdp_request(h, protocol=MDPC02, rid=b"\x00m2"), BACK) == []  # waits (R6)
    out = h.send(BACK, MW, MdpWorkerReply(first.ticket, (b"1",), protocol=MDPW02))
    assert only(sends(out, FRONT)) == (MC, MdpClientReply("echo", (b"1",), protocol=MDPC02))
    second = only(sends(out, BACK))[1]
    assert isinstance(second, MdpWorkerRequest) and second.ticket != first.ticket


def test_d2_the_broker_heartbeats_a_majordomo_worker_in_its_version_and_loses_a_silent_one() -> (
    None
):
    h = Harness()
    mdp_worker(h, protocol=MDPW02)
    beats = [m for _, m in sends(h.advance(1.0), BACK)]
    assert beats == [MdpWorkerHeartbeat(protocol=MDPW02)]
    h.send(BACK, MW, MdpWorkerHeartbeat(protocol=MDPW02))
    h.advance(2.5)
    assert h.broker.stats()["workers"] == 1  # heard within liveness x interval
    h.advance(3.5)
    assert h.broker.stats()["workers"] == 0  # silent: lost (R8)


def test_d3_mdpc02_partials_as_they_come_and_mdpc01_partials_folded_into_the_reply() -> None:
    for protocol in (MDPC02, MDPC01):
        h = Harness()
        mdp_worker(h, protocol=MDPW02)
        ticket = only(sends(mdp_request(h, protocol=protocol), BACK))[1].ticket
        out = h.send(BACK, MW, MdpWorkerPartial(ticket, (b"p1",)))
        partials = sends(out, FRONT)
        out = h.send(BACK, MW, MdpWorkerReply(ticket, (b"end",), protocol=MDPW02))
        final = only(sends(out, FRONT))[1]
        if protocol == MDPC02:
            assert partials == [(MC, MdpClientPartial("echo", (b"p1",)))]
            assert final == MdpClientReply("echo", (b"end",), protocol=MDPC02)
        else:
            assert partials == []
            assert final == MdpClientReply("echo", (b"p1", b"end"), protocol=MDPC01)


def test_d3_a_broker_made_error_is_the_reply_with_the_json_error_body() -> None:
    h = Harness()
    h.advance(10.0)  # past the start-up grace: an unknown service is 404 at once (R7)
    out = mdp_request(h, service="nobody")
    reply = only(sends(out, FRONT))[1]
    assert isinstance(reply, MdpClientReply) and reply.service == "nobody"
    error = json.loads(reply.body[0])
    assert error["code"] == 404 and "nobody" in error["message"]


def test_d3_mmi_service_answers_a_majordomo_client() -> None:
    h = Harness()
    mdp_worker(h)
    out = h.send(FRONT, MC, MdpClientRequest("mmi.service", (b"echo",), protocol=MDPC01))
    assert only(sends(out, FRONT))[1] == MdpClientReply("mmi.service", (b"200",), protocol=MDPC01)
    out = h.send(FRONT, MC, MdpClientRequest("mmi.service", (b"other",), protocol=MDPC01))
    assert only(sends(out, FRONT))[1].body == (b"404",)


def test_d4_a_majordomo_worker_gets_disconnect_of_its_version_instead_of_an_error() -> None:
    h = Harness()
    out = mdp_worker(h, protocol=MDPW02, service="mmi.service")  # reserved (R15)
    assert only(sends(out, BACK)) == (MW, MdpWorkerDisconnect(protocol=MDPW02))
    assert h.broker.stats()["workers"] == 0
    # An unknown worker's heartbeat: it is told to start over.
    out = h.send(BACK, b"\x00gone", MdpWorkerHeartbeat(protocol=MDPW01))
    assert only(sends(out, BACK)) == (b"\x00gone", MdpWorkerDisconnect(protocol=MDPW01))


def test_d4_nothing_a_majordomo_peer_cannot_understand_is_sent_to_it() -> None:
    h = Harness()
    mdp_worker(h, protocol=MDPW01)
    mdp_request(h)
    h.client(SC)
    # A new config makes the broker tell every session FORCENEGOTIATE: only S0P peers hear it.
    effects: list[Effect] = []
    h.broker.sessions.renegotiate_all("test", effects)
    h.broker.majordomo.translate(effects)
    told = {e.routing_id for e in effects if isinstance(e, Send)}
    assert told == {SC}
    assert all(isinstance(e.message, ForceNegotiate) for e in effects if isinstance(e, Send))


def test_d1_a_broker_that_is_not_active_refuses_majordomo_peers() -> None:
    h = Harness(state="disabled")
    out = mdp_worker(h, protocol=MDPW01)
    assert only(sends(out, BACK)) == (MW, MdpWorkerDisconnect(protocol=MDPW01))
    assert sends(mdp_request(h), FRONT) == []  # no error command towards a Majordomo client
    assert h.broker.counters["dropped"] == 1
    assert h.broker.state is BrokerState.DISABLED


def test_a_majordomo_worker_that_says_disconnect_is_forgotten_and_its_request_goes_elsewhere() -> (
    None
):
    h = Harness()
    mdp_worker(h, protocol=MDPW01)
    h.worker(SW)
    h.client(SC)
    h.request(SC, b"r1")
    h.request(SC, b"r2")  # one for each worker (LRU)
    out = h.send(BACK, MW, MdpWorkerDisconnect(protocol=MDPW01))
    # Its request is dispatched again, to the S0P worker once it is free, or waits (R8).
    assert h.broker.stats()["workers"] == 1
    assert not [m for _, m in sends(out, BACK) if isinstance(m, MdpWorkerRequest)]
    assert all(isinstance(m, WorkerRequest) for _, m in sends(out, BACK))
    assert not [m for _, m in sends(out, FRONT) if isinstance(m, (ClientReply, DisconnectError))]


def test_mmi_workers_and_services_and_a_bare_501_for_majordomo_clients() -> None:
    h = Harness()
    mdp_worker(h, protocol=MDPW01)
    h.worker(SW, services=("echo", "time"))

    def ask(service: str, *body: bytes) -> MdpClientReply:
        out = h.send(FRONT, MC, MdpClientRequest(service, body, protocol=MDPC01))
        reply = only(sends(out, FRONT))[1]
        assert isinstance(reply, MdpClientReply)
        return reply

    assert ask("mmi.workers", b"echo").body == (b"2",)
    assert ask("mmi.workers", b"nobody").body == (b"0",)
    assert ask("mmi.services").body == (b"echo", b"time")
    assert ask("mmi.nothing").body == (b"501",)  # 8/MMI: a bare code, not the JSON error


def test_mmi_answers_from_the_whole_family() -> None:
    fabric = started()
    fabric.worker("c", SW, services=("far",))
    fabric.advance(1.1)  # c's table reaches a
    fabric.client("a", SC)
    for service, body, expected in [
        ("mmi.service", b"far", (b"200",)),
        ("mmi.workers", b"far", (b"1",)),
        ("mmi.services", b"", (b"far",)),
    ]:
        fabric.request_with("a", SC, service, body)
        reply = only(fabric.replies("a"))[1]
        assert reply.body == expected, service


def test_a_malformed_majordomo_message_is_answered_in_majordomo_or_not_at_all() -> None:
    h = Harness()
    error = ProtocolError(400, "frame 3: garbage")
    out = h.broker.handle(Malformed(BACK, MW, error, MDPW02), h.now, h.wall)
    assert only(sends(out, BACK)) == (MW, MdpWorkerDisconnect(protocol=MDPW02))
    out = h.broker.handle(Malformed(FRONT, MC, error, MDPC01), h.now, h.wall)
    assert sends(out) == []  # a Majordomo client has no error command (§2.4)
    assert h.broker.counters["malformed"] == 2  # both count towards the senders' scores


def test_a_connection_that_speaks_s0p_after_majordomo_is_answered_in_s0p() -> None:
    """The last protocol a connection spoke is the one it is answered in: a CONFIGACK to a
    connection that sent a Majordomo READY before is not swallowed (found by the garbage soak
    of tests/net/test_node.py, whose random frames can form valid Majordomo messages)."""
    h = Harness()
    mdp_worker(h, rid=MW, protocol=MDPW02)
    out = h.send(BACK, MW, CheckConfig(ConfigType.JSON, 3, "again", protocol=SIG_WORKER))
    assert [type(m) for _, m in sends(out, BACK)] == [ConfigAck]


def test_d1_a_majordomo_answer_is_not_kept_in_the_reply_cache_an_s0p_one_is() -> None:
    """A Majordomo request has no request id, so no retry could reach a cached answer (D1)."""
    h = Harness()
    h.worker(SW)
    h.client(SC)
    ticket = only(dispatched(mdp_request(h)))[1].ticket
    assert only(sends(h.reply(SW, ticket, b"done"), FRONT))[0] == MC
    assert h.broker.ledger.cached_count() == 0
    ticket = only(dispatched(h.request(SC, b"r1")))[1].ticket
    assert only(replies(h.reply(SW, ticket, b"done")))[0] == SC
    assert h.broker.ledger.cached_count() == 1
