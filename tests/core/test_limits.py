"""R20 (limits that hold under abuse) and the guessing rules of M1, driven with numbers."""

from __future__ import annotations

import json
from typing import Any

from scale0.core.broker import Broker
from scale0.core.commands import check_credentials
from scale0.core.effects import (
    Channel,
    Connected,
    Disconnected,
    Effect,
    Hangup,
    Malformed,
    Received,
    Tick,
)
from scale0.core.guard import (
    AUTH_DELAY_MAX_S,
    AUTH_FREE_FAILURES,
    AuthThrottle,
    address_key,
    peer_address_key,
)
from scale0.sim.fabric import Fabric, family_config
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.client import DisconnectError, ForceNegotiate
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import SIG_CLIENT
from scale0.wire.mdp import MDPC01, MdpClientRequest
from scale0.wire.peer import BrokerState, Hello, PeerHeartbeat, TableMode
from tests.core.harness import BACK, FRONT, Harness, only, replies, sends
from tests.core.test_admin import ADMINS, PASSWORDS

C1, C2, C3 = b"\x00c1", b"\x00c2", b"\x00c3"
W1 = b"\x00w1"


def hangups(effects: list[Effect]) -> list[tuple[str, int]]:
    return [(e.channel.value, e.conn) for e in effects if isinstance(e, Hangup)]


def connect(h: Harness, conn: int, address: str = "10.0.0.1", channel: Any = FRONT) -> list[Effect]:
    return h.broker.handle(Connected(channel, conn, address), h.now, h.wall)


# ---- sessions ---------------------------------------------------------------------------------


def test_r20_checkconfig_past_max_sessions_is_503_and_opens_nothing() -> None:
    h = Harness(max_sessions=2)
    h.client(C1)
    h.client(C2)
    _rid, refusal = only(sends(h.client(C3)))
    assert isinstance(refusal, DisconnectError) and refusal.code == 503
    assert "max_sessions" in refusal.message
    assert C3 not in h.broker.sessions.clients
    # A sender that has a session may renegotiate; the cap is per channel.
    assert only(sends(h.client(C1)))[1].COMMAND == b"CONFIGACK"
    h.worker(W1)
    assert W1 in h.broker.sessions.workers
    # One leaves: a new one gets in.
    h.broker.sessions.forget(FRONT, C2, h.now, [], "test")
    assert only(sends(h.client(C3)))[1].COMMAND == b"CONFIGACK"


def test_r20_majordomo_client_past_max_sessions_is_not_adopted() -> None:
    h = Harness(max_sessions=1)
    h.worker(W1)
    h.client(C1)
    request = MdpClientRequest(service="echo", body=(b"x",), protocol=MDPC01)
    assert sends(h.send(FRONT, C2, request)) == []
    assert C2 not in h.broker.sessions.clients


# ---- requests per client ------------------------------------------------------------------------


def test_r20_requests_past_max_requests_per_client_get_429_at_once() -> None:
    h = Harness(max_requests_per_client=2)
    h.worker(W1)
    h.client(C1)
    h.client(C2)
    h.request(C1, b"r1")  # at the worker
    h.request(C1, b"r2")  # waiting
    _rid, reply = only(replies(h.request(C1, b"r3")))
    assert reply.status == 429
    assert "max_requests_per_client" in json.loads(reply.body[0])["message"]
    # Another client is not affected; a resend of a held request joins it (R10), no 429.
    assert replies(h.request(C2, b"r1")) == []
    assert replies(h.request(C1, b"r2")) == []
    assert h.broker.ledger.held_by_client() == {
        b"b1." + C1.hex().encode(): 2,
        b"b1." + C2.hex().encode(): 1,
    }


def test_r20_an_answer_frees_the_client_slot() -> None:
    h = Harness(max_requests_per_client=1)
    h.worker(W1)
    h.client(C1, client_id="alice")
    out = h.request(C1, b"r1")
    (worker, request) = only([(r, m) for r, m in sends(out, BACK)])
    assert worker == W1
    assert only(replies(h.request(C1, b"r2")))[1].status == 429
    h.reply(W1, request.ticket, b"ok")
    assert h.broker.ledger.held_by_client() == {}
    assert replies(h.request(C1, b"r2")) == []  # held now, not refused
    # A failure answer frees it too (its worker is lost, then its deadline passes: 503).
    h.advance(10.0)
    h.advance(10.0)
    assert h.broker.ledger.held_by_client() == {}


# ---- connections that never negotiate -----------------------------------------------------------


def test_r20_a_connection_that_does_not_negotiate_in_time_is_hung_up() -> None:
    h = Harness(negotiate_timeout_ms=2000)
    assert hangups(connect(h, 7)) == []
    assert hangups(connect(h, 8)) == []
    # 8 negotiates (its CHECKCONFIG opens a session); 7 only talks.
    h.broker.handle(Received(FRONT, C2, _checkconfig(), 8), h.now, h.wall)
    request = h.broker.handle(Received(FRONT, C1, _request(), 7), h.now, h.wall)
    assert isinstance(only(sends(request))[1], ForceNegotiate)  # R1: no state kept for it
    assert hangups(h.advance(1.9)) == []
    assert hangups(h.advance(0.2)) == [("frontend", 7)]
    assert h.broker.guard.conns.keys() == {(FRONT, 8)}
    assert h.broker.counters["unnegotiated_timeout"] == 1
    assert hangups(h.advance(60.0)) == []  # the negotiated one stays


def test_r20_past_max_unnegotiated_the_oldest_waiting_connection_goes() -> None:
    h = Harness(max_unnegotiated=3)
    for conn in (1, 2, 3):
        assert hangups(connect(h, conn)) == []
    h.broker.handle(Received(BACK, W1, _checkconfig(), 1), h.now, h.wall)  # wrong channel
    assert hangups(connect(h, 4)) == [("frontend", 1)]
    h.broker.handle(Received(FRONT, C1, _checkconfig(), 2), h.now, h.wall)  # 2 negotiates
    assert hangups(connect(h, 5)) == []  # 3, 4, 5 wait
    assert hangups(connect(h, 6)) == [("frontend", 3)]
    assert len(h.broker.guard.conns) == 4  # 2 (negotiated), 4, 5, 6: bounded
    assert h.broker.counters["unnegotiated_over_limit"] == 2


def test_r20_a_closed_connection_is_forgotten_and_its_number_may_come_back() -> None:
    h = Harness(negotiate_timeout_ms=1000)
    connect(h, 9)
    h.broker.handle(Disconnected(FRONT, 9), h.now, h.wall)
    assert h.broker.guard.conns == {} and not h.broker.guard.unnegotiated
    h.advance(0.5)
    connect(h, 9)  # the same number, a new connection: its own full timeout
    assert hangups(h.advance(0.6)) == []  # the first connection's timer is stale
    assert hangups(h.advance(0.5)) == [("frontend", 9)]


# ---- guessing: by address, and slowed down per auth_id ----------------------------------------


def _login(h: Harness, rid: bytes, conn: int, password: str, auth_id: str = "root") -> Any:
    request = ManagementRequest(auth_id, password, "whoami", "m1")
    effects = h.broker.handle(Received(FRONT, rid, request, conn), h.now, h.wall)
    checks = [e for e in effects if e.__class__.__name__ == "Authenticate"]
    if not checks:
        return only(sends(effects))[1] if sends(effects) else None
    check = only(checks)
    ok = check_credentials(h.broker.network.admins, auth_id, password) is not None
    from scale0.core.effects import ManagementCall

    call = ManagementCall(check.channel, check.routing_id, check.sender, check.request, ok)
    return only(sends(h.broker.handle(call, h.now, h.wall)))[1]


def test_m1_a_guesser_reconnecting_for_every_try_is_banned_by_address() -> None:
    h = Harness(admins=ADMINS, error_threshold=3)
    codes = []
    for n in range(4):
        connect(h, 100 + n, "10.9.9.9")  # a new connection (and routing id) each try
        answer = _login(h, b"\x00g%d" % n, 100 + n, f"guess{n}", auth_id="nobody")
        codes.append(answer.code)
    assert codes == [401, 401, 401, 429]
    assert h.broker.is_banned(address_key("10.9.9.9"), h.now)
    connect(h, 200, "10.9.9.9")
    assert _login(h, b"\x00g9", 200, PASSWORDS["root"]) is None  # silence while banned
    # Another address is served.
    connect(h, 201, "10.1.1.1")
    assert _login(h, b"\x00ok", 201, PASSWORDS["root"]).code == 200


def test_m1_failures_per_auth_id_slow_down_new_addresses_not_known_ones() -> None:
    h = Harness(admins=ADMINS, error_threshold=1000)
    connect(h, 1, "10.0.0.5")
    assert _login(h, b"\x00admin", 1, PASSWORDS["root"]).code == 200  # the admin's address
    for n in range(AUTH_FREE_FAILURES):
        connect(h, 10 + n, f"10.6.6.{n}")  # an attacker spreading over addresses
        assert _login(h, b"\x00a%d" % n, 10 + n, "wrong").code == 401
    connect(h, 50, "10.6.6.99")
    slowed = _login(h, b"\x00a99", 50, "wrong")
    assert isinstance(slowed, ManagementReply) and slowed.code == 429
    assert "try again in 1 s" in (slowed.message or "")
    # The admin's own address is not slowed down...
    connect(h, 51, "10.0.0.5")
    assert _login(h, b"\x00admin2", 51, PASSWORDS["root"]).code == 200
    # ...and a success resets the count for everyone.
    connect(h, 52, "10.7.7.7")
    assert _login(h, b"\x00new", 52, PASSWORDS["root"]).code == 200


def test_auth_throttle_waits_double_and_are_capped() -> None:
    throttle = AuthThrottle()
    admins = {"root"}
    now = 0.0
    waits = []
    for _ in range(AUTH_FREE_FAILURES + 8):
        throttle.failed("root", admins, now)
        waits.append(throttle.wait_s("root", b"x", now))
    assert waits[: AUTH_FREE_FAILURES - 1] == [0.0] * (AUTH_FREE_FAILURES - 1)
    assert waits[AUTH_FREE_FAILURES - 1 : AUTH_FREE_FAILURES + 3] == [1.0, 2.0, 4.0, 8.0]
    assert max(waits) == AUTH_DELAY_MAX_S  # an attacker delays a real admin 30 s at most
    assert throttle.wait_s("root", b"x", now + AUTH_DELAY_MAX_S) == 0.0
    # Unknown auth_ids are not kept (bounded by the admins list).
    throttle.failed("made-up", admins, now)
    assert "made-up" not in throttle.failures


def _checkconfig() -> Any:
    from scale0.wire.client import CheckConfig
    from scale0.wire.frames import ConfigType

    return CheckConfig(config_type=ConfigType.JSON, config_version=3, protocol=SIG_CLIENT)


def _request() -> Any:
    from scale0.wire.client import ClientRequest

    return ClientRequest(service="echo", request_id=b"r", body=(b"x",))


# ---- W7: the ids a REQUEST carries to a worker that asks for them -----------------------------


def test_a_request_ids_worker_gets_idrequest_with_the_client_s_ids() -> None:
    from scale0.wire.worker import Ready, WorkerIdRequest, WorkerRequest

    h = Harness()
    h.send(BACK, W1, _checkconfig_worker())
    ready = Ready(("echo",), True, 1000, h.wall, 3, 1, request_ids=True)
    assert Ready.from_frames(ready.to_frames()) == ready
    h.send(BACK, W1, ready)
    h.client(C1, client_id="alice")
    (rid, request) = only(sends(h.request(C1, b"r-7", body=b"payload"), BACK))
    assert rid == W1 and isinstance(request, WorkerIdRequest)
    assert (request.client_id, request.request_id, request.body) == ("alice", b"r-7", (b"payload",))
    assert WorkerIdRequest.from_frames(request.to_frames()) == request
    # A worker that did not ask gets REQUEST, the body alone (existing workers are unchanged).
    h2 = Harness()
    h2.worker(W1)
    h2.client(C1, client_id="alice")
    (_rid, plain) = only(sends(h2.request(C1, b"r-7", body=b"payload"), BACK))
    assert isinstance(plain, WorkerRequest) and plain.body == (b"payload",)


def _checkconfig_worker() -> Any:
    from scale0.wire.client import CheckConfig
    from scale0.wire.frames import SIG_WORKER, ConfigType

    return CheckConfig(config_type=ConfigType.JSON, config_version=3, protocol=SIG_WORKER)


def test_r20_the_fast_path_marks_a_majordomo_client_s_connection_negotiated() -> None:
    h = Harness(negotiate_timeout_ms=1000)
    h.worker(W1)
    connect(h, 7)
    assert not h.broker.mark_negotiated(FRONT, C2, 7)  # no session yet: still waiting
    request = MdpClientRequest(service="echo", body=(b"x",), protocol=MDPC01)
    h.send(FRONT, C2, request)  # its session opens (as on the fast path, no conn given)
    assert h.broker.mark_negotiated(FRONT, C2, 7)
    assert (FRONT, 7) not in h.broker.guard.unnegotiated
    assert hangups(h.advance(2.0)) == []


# ---- the peer port (R22) ------------------------------------------------------------------------

PEER = Channel.PEER
STRANGER = "10.9.9.9"
MEMBER_HOST = "10.0.0.2"


def _family(**overrides: Any) -> tuple[Fabric, Broker]:
    """Broker a of family "fam" (a, b, c) running alone: b and c have not linked to it yet."""
    fabric = Fabric(family_config(**overrides))
    fabric.start("a")
    return fabric, fabric.brokers["a"]


def _at(fabric: Fabric, broker: Broker, event: Any) -> list[Effect]:
    return broker.handle(event, fabric.now, fabric.wall)


def _hello(broker_id: str = "b", family: str = "fam") -> Hello:
    return Hello(broker_id, family, BrokerState.ACTIVE, 1, {}, TableMode.PULL)


def _peer_hangups(fabric: Fabric, broker: Broker, seconds: float) -> list[int]:
    fabric.now += seconds
    fabric.wall += seconds
    out = broker.handle(Tick(), fabric.now, fabric.wall)
    return [e.conn for e in out if isinstance(e, Hangup) and e.channel is PEER]


def _codes(out: list[Effect]) -> list[int]:
    return [m.code for _, m in sends(out, PEER) if isinstance(m, DisconnectError)]


def test_r22_a_peer_connection_that_never_says_a_valid_hello_is_hung_up() -> None:
    fabric, a = _family(negotiate_timeout_ms=2000)
    for conn, address in ((5, STRANGER), (6, STRANGER), (7, MEMBER_HOST), (8, STRANGER)):
        assert _at(fabric, a, Connected(PEER, conn, address)) == []
    beat = PeerHeartbeat("b", fabric.wall, BrokerState.ACTIVE, 1, 0)
    assert sends(_at(fabric, a, Received(PEER, b"early", beat, 5))) == []  # F2: ignored
    assert _codes(_at(fabric, a, Received(PEER, b"x", _hello("zed"), 6))) == [401]
    # 7 is member b's link: its HELLO is answered, and the connection stays for good.
    answer = only(sends(_at(fabric, a, Received(PEER, b"b-link", _hello(), 7)), PEER))[1]
    assert isinstance(answer, Hello) and answer.broker_id == "a"
    assert _peer_hangups(fabric, a, 1.9) == []
    assert sorted(_peer_hangups(fabric, a, 0.2)) == [5, 6, 8]
    assert a.counters["unnegotiated_timeout"] == 3
    assert a.guard.conns.keys() == {(PEER, 7)}
    # The link reconnects (a cut): the new connection carries the same routing id (the peer
    # ROUTER hands it over) and no new HELLO; its first message makes it negotiated.
    _at(fabric, a, Connected(PEER, 9, MEMBER_HOST))
    _at(fabric, a, Received(PEER, b"b-link", beat, 9))
    assert _peer_hangups(fabric, a, 60.0) == []
    assert a.guard.conns.keys() == {(PEER, 7), (PEER, 9)}


def test_r22_the_peer_port_has_its_own_pool_of_max_unnegotiated() -> None:
    fabric, a = _family(max_unnegotiated=2)
    for conn in (1, 2):
        assert hangups(_at(fabric, a, Connected(FRONT, conn, STRANGER))) == []
        assert hangups(_at(fabric, a, Connected(PEER, conn, STRANGER))) == []
    # A third on the peer port pushes out the oldest peer connection, not a client's...
    assert hangups(_at(fabric, a, Connected(PEER, 3, STRANGER))) == [("peer", 1)]
    # ...and a flood on the frontend never pushes out a member's link waiting for its HELLO.
    for conn in range(3, 50):
        _at(fabric, a, Connected(FRONT, conn, STRANGER))
    assert set(a.guard.unnegotiated_peers) == {(PEER, 2), (PEER, 3)}
    _at(fabric, a, Received(PEER, b"b-link", _hello(), 3))
    assert set(a.guard.unnegotiated_peers) == {(PEER, 2)}
    stats = a.stats()  # what status shows: both pools, and every connection open
    assert (stats["unnegotiated"], stats["unnegotiated_peers"], stats["connections"]) == (2, 1, 4)


def test_r22_refused_hellos_and_garbage_ban_the_address_and_a_member_still_joins() -> None:
    fabric, a = _family(error_threshold=3, error_window_s=10.0, error_ban_s=60.0)
    garbage = ProtocolError(400, "frame 2: garbage")
    # A stranger reconnects for every try: a new connection, a new routing id each time.
    _at(fabric, a, Connected(PEER, 10, STRANGER))
    assert _codes(_at(fabric, a, Received(PEER, b"s0", _hello("zed"), 10))) == [401]
    _at(fabric, a, Connected(PEER, 11, STRANGER))
    assert _codes(_at(fabric, a, Malformed(PEER, b"s1", garbage, conn=11))) == [400]
    _at(fabric, a, Connected(PEER, 12, STRANGER))
    assert _codes(_at(fabric, a, Received(PEER, b"s2", _hello("b", "other"), 12))) == [401]
    _at(fabric, a, Connected(PEER, 13, STRANGER))
    _at(fabric, a, Connected(PEER, 14, MEMBER_HOST))  # another address: not touched
    out = _at(fabric, a, Received(PEER, b"s3", _hello("zed"), 13))
    assert _codes(out) == [429]  # the fourth error bans the address, once
    assert a.guard.is_banned(peer_address_key(STRANGER), fabric.now)
    assert not a.guard.is_banned(address_key(STRANGER), fabric.now)  # management: its own
    # Banned: from its connections only a HELLO is read, and refusals go unanswered.
    _at(fabric, a, Connected(PEER, 15, STRANGER))
    assert a.peer_unread(b"s4", 15, b"HEARTBEAT", fabric.now)
    assert not a.peer_unread(b"s4", 15, b"HELLO", fabric.now)
    assert sends(_at(fabric, a, Received(PEER, b"s4", _hello("zed"), 15))) == []
    assert sends(_at(fabric, a, Malformed(PEER, b"s4", garbage, conn=15))) == []
    assert not a.peer_unread(b"s5", 14, b"HEARTBEAT", fabric.now)  # other address
    # Member b's broker runs on the banned host: its HELLO is read, accepted, and its link is
    # then heard whatever it says; it is never hung up for the address.
    answer = only(sends(_at(fabric, a, Received(PEER, b"b-link", _hello(), 15)), PEER))[1]
    assert isinstance(answer, Hello)
    assert not a.peer_unread(b"b-link", 15, b"HEARTBEAT", fabric.now)
    assert (PEER, 15) not in a.guard.unnegotiated_peers
    assert a.is_banned(b"b-link", fabric.now) is False
    # The ban ends: a stranger from there is answered (and scored) again.
    fabric.now += 61.0
    _at(fabric, a, Connected(PEER, 16, STRANGER))
    assert _codes(_at(fabric, a, Received(PEER, b"s6", _hello("zed"), 16))) == [401]


def test_r22_a_members_link_is_scored_by_routing_id_not_by_address() -> None:
    fabric, a = _family(error_threshold=2)
    _at(fabric, a, Connected(PEER, 20, MEMBER_HOST))
    _at(fabric, a, Received(PEER, b"b-link", _hello(), 20))
    garbage = ProtocolError(400, "frame 2: garbage")
    for _ in range(3):  # a member's bug: its routing id is scored (R13), never its host
        _at(fabric, a, Malformed(PEER, b"b-link", garbage, conn=20))
    assert not a.guard.is_banned(peer_address_key(MEMBER_HOST), fabric.now)
    assert a.guard.is_banned(b"b-link", fabric.now)


def test_r22_a_joining_broker_keeps_a_connection_that_says_hello_of_its_family() -> None:
    fabric = Fabric(family_config())
    joining = Broker(
        "d", None, state="active", boot_id=b"BOOT", signature=None, now=fabric.now, family="fam"
    )
    assert joining.state is BrokerState.JOINING
    joining.handle(Connected(PEER, 1, MEMBER_HOST), fabric.now, fabric.wall)
    joining.handle(Connected(PEER, 2, STRANGER), fabric.now, fabric.wall)
    joining.handle(Received(PEER, b"b-link", _hello(), 1), fabric.now, fabric.wall)
    joining.handle(Received(PEER, b"s", _hello("b", "other"), 2), fabric.now, fabric.wall)
    assert set(joining.guard.unnegotiated_peers) == {(PEER, 2)}
