"""R20 (limits that hold under abuse) and the guessing rules of M1, driven with numbers."""

from __future__ import annotations

import json
from typing import Any

from scale0.core.commands import check_credentials
from scale0.core.effects import Connected, Disconnected, Effect, Hangup, Received
from scale0.core.guard import (
    AUTH_DELAY_MAX_S,
    AUTH_FREE_FAILURES,
    AuthThrottle,
    address_key,
)
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.client import DisconnectError, ForceNegotiate
from scale0.wire.frames import SIG_CLIENT
from scale0.wire.mdp import MDPC01, MdpClientRequest
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
    assert h.broker.dispatch.per_client == {
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
    assert h.broker.dispatch.per_client == {}
    assert replies(h.request(C1, b"r2")) == []  # held now, not refused
    # A failure answer frees it too (its worker is lost, then its deadline passes: 503).
    h.advance(10.0)
    h.advance(10.0)
    assert h.broker.dispatch.per_client == {}


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
