"""Who may connect, serve and call by CURVE key (scale0/core/trust.py, rules T1-T6), and what
the broker core does with it: READY and REQUEST refused with 403, FORWARD judged by its caller,
grants that end (rotation) ending the sessions that hold them."""

from __future__ import annotations

import dataclasses

from scale0.config.model import BrokerEntry, KeyGrant
from scale0.core.effects import Authenticated, Channel, Log, Received, Send
from scale0.core.trust import admits, allowed, may
from scale0.sim.fabric import Fabric, family_config
from scale0.wire.client import CheckConfig, ClientReply, ClientRequest, DisconnectError
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.peer import Forward, ForwardReply
from scale0.wire.worker import Ready

OLD = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
NEW = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
OTHER = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs"


def test_t1_no_grants_restrict_nothing() -> None:
    assert allowed((), OLD, 0.0) == "all"


def test_t2_a_named_key_gets_its_grants_in_force_and_never_the_default() -> None:
    grants = (
        KeyGrant(OLD, ("echo",), until=100),
        KeyGrant(OLD, ("report.*",)),
        KeyGrant("*", "all"),
    )
    assert allowed(grants, OLD, 100.0) == ("echo", "report.*")  # until is inclusive
    assert allowed(grants, OLD, 100.5) == ("report.*",)
    ended = (KeyGrant(OLD, "all", until=10), KeyGrant("*", "all"))
    assert allowed(ended, OLD, 11.0) == ()  # not the * grant: refused


def test_t3_an_unnamed_key_gets_the_default_or_nothing() -> None:
    assert allowed((KeyGrant(OLD, "all"), KeyGrant("*", ("echo",))), NEW, 0.0) == ("echo",)
    assert allowed((KeyGrant(OLD, "all"),), NEW, 0.0) == ()


def test_t4_patterns_match_with_star_and_all_matches_everything() -> None:
    assert may(("report.*",), "report.daily") and not may(("report.*",), "reports")
    assert may(("a*c",), "abbbc") and not may(("a*c",), "abd")
    assert may(("x.y",), "x.y") and not may(("x.y",), "xzy")  # '.' is no wildcard
    assert may("all", "anything") and not may((), "anything")


def test_t5_t6_zap_admits_by_socket_and_refuses_unknown_domains() -> None:
    network = family_config(clients=(KeyGrant(OLD, ("echo",)),), workers=())
    keyed = dataclasses.replace(
        network,
        brokers=tuple(
            dataclasses.replace(b, curve_public_key=OTHER) if b.identity == "a" else b
            for b in network.brokers
        ),
    )
    assert admits(keyed, "frontend", OLD, 0.0) is None
    assert "no grant in clients" in str(admits(keyed, "frontend", NEW, 0.0))
    assert admits(keyed, "backend", NEW, 0.0) is None  # no worker grants: T1
    assert admits(keyed, "peer", OTHER, 0.0) is None
    assert "not the curve_public_key" in str(admits(keyed, "config", NEW, 0.0))
    assert "unknown ZAP domain" in str(admits(keyed, "admin", OTHER, 0.0))
    joining = dataclasses.replace(keyed, brokers=())  # T6: no members known yet
    assert admits(joining, "peer", NEW, 0.0) is None
    assert isinstance(keyed.brokers[0], BrokerEntry)


def _fabric(**grants: tuple[KeyGrant, ...]) -> Fabric:
    fabric = Fabric(family_config(**grants))
    fabric.start()
    fabric.advance(1.0)
    return fabric


def _negotiate(fabric: Fabric, broker: str, channel: Channel, rid: bytes, key: str) -> list[object]:
    core = fabric.brokers[broker]
    core.core.curve = True
    core.handle(Authenticated(channel, rid, key), fabric.now, fabric.wall)
    protocol = SIG_CLIENT if channel is Channel.FRONTEND else SIG_WORKER
    check = CheckConfig(ConfigType.JSON, None, None, protocol=protocol)
    return list(core.handle(Received(channel, rid, check), fabric.now, fabric.wall))


def test_a_ready_for_a_service_the_key_may_not_serve_gets_403_and_is_logged() -> None:
    fabric = _fabric(workers=(KeyGrant(OLD, ("echo",)),), clients=())
    a = fabric.brokers["a"]
    _negotiate(fabric, "a", Channel.BACKEND, b"w1", OLD)
    ready = Ready(("echo", "secret"), True, 1000, fabric.wall, 1)
    out = a.handle(Received(Channel.BACKEND, b"w1", ready), fabric.now, fabric.wall)
    (refusal,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(refusal, DisconnectError) and refusal.code == 403
    assert "may not serve secret" in refusal.message
    logs = [e for e in out if isinstance(e, Log) and e.event == "key_refused"]
    assert logs and logs[0].fields["key"] == OLD
    assert a.ledger.worker_count() == 0  # registered nothing


def test_a_request_for_a_service_the_key_may_not_call_gets_403() -> None:
    fabric = _fabric(clients=(KeyGrant(OLD, ("echo",)),))
    a = fabric.brokers["a"]
    _negotiate(fabric, "a", Channel.FRONTEND, b"c1", OLD)
    out = a.handle_request(b"c1", "admin.reset", b"r1", (b"x",), fabric.now)
    (reply,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(reply, ClientReply) and reply.status == 403
    request = ClientRequest("admin.reset", b"r2", (b"x",))
    out = a.handle(Received(Channel.FRONTEND, b"c1", request), fabric.now, fabric.wall)
    (reply,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(reply, ClientReply) and reply.status == 403  # the typed path too


def test_a_connection_with_no_key_on_a_curve_broker_gets_only_the_default() -> None:
    fabric = _fabric(clients=(KeyGrant(OLD, "all"),))
    out = _negotiate(fabric, "a", Channel.FRONTEND, b"c1", "")
    assert any(
        isinstance(e, Send) and isinstance(e.message, DisconnectError) and e.message.code == 403
        for e in out
    )


def test_a_forward_is_judged_by_its_callers_key_at_the_serving_broker() -> None:
    fabric = _fabric(clients=(KeyGrant(OLD, ("echo",)),))
    b = fabric.brokers["b"]
    a_rid = next(rid for rid, name in b.family.broker_of.items() if name == "a")
    forward = Forward(b"T1", "admin.reset", "a", (b"x",), caller=OLD)
    out = b.handle(Received(Channel.PEER, a_rid, forward), fabric.now, fabric.wall)
    (answer,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(answer, ForwardReply) and answer.status == 403 and answer.ticket == b"T1"
    allowed_forward = Forward(b"T2", "echo", "a", (b"x",), caller=OLD)
    out = b.handle(Received(Channel.PEER, a_rid, allowed_forward), fabric.now, fabric.wall)
    assert not [
        e
        for e in out
        if isinstance(e, Send) and isinstance(e.message, ForwardReply) and e.message.status == 403
    ]


def test_forward_carries_its_caller_on_the_wire_and_refuses_a_bad_one() -> None:
    from scale0.wire.errors import ProtocolError
    from scale0.wire.frames import SIG_BROKER
    from scale0.wire.registry import decode_from_broker as decode_any

    def decode_from_broker(frames: list[bytes]) -> object:
        return decode_any(frames, signature=SIG_BROKER, max_frame_bytes=1 << 20)

    message = Forward(b"T1", "echo", "a", (b"x", b"y"), caller=OLD)
    frames = message.to_frames()
    assert frames[2] == b"FORWARDAS" and frames[6] == OLD.encode()
    assert decode_from_broker(frames) == message
    # Without a caller it is the brief's FORWARD, byte for byte: no frame an older broker
    # would read as body (docs/protocol.md §5.4).
    plain = Forward(b"T1", "echo", "a", (b"x",))
    assert plain.to_frames() == [b"", b"S0B1", b"FORWARD", b"T1", b"echo", b"a", b"x"]
    assert decode_from_broker(plain.to_frames()) == plain
    for bad in ([*frames[:6], b"not a key", *frames[7:]], [*frames[:6], b"", *frames[7:]]):
        try:
            decode_from_broker(bad)
        except ProtocolError as exc:
            assert str(exc).startswith("frame 6: caller is not a CURVE key"), exc
        else:
            raise AssertionError(f"a bad caller frame was accepted: {bad[6]!r}")


def test_a_grant_that_ends_ends_the_sessions_that_hold_it() -> None:
    fabric = _fabric(
        clients=(KeyGrant(OLD, "all", until=0), KeyGrant(NEW, "all")),
    )
    a = fabric.brokers["a"]
    until = int(fabric.wall) + 5
    a.core.network = dataclasses.replace(
        a.core.network, clients=(KeyGrant(OLD, "all", until=until), KeyGrant(NEW, "all"))
    )
    _negotiate(fabric, "a", Channel.FRONTEND, b"old", OLD)
    _negotiate(fabric, "a", Channel.FRONTEND, b"new", NEW)
    assert set(a.sessions.clients) == {b"old", b"new"}
    while fabric.wall <= until + 1:
        for rid in (b"old", b"new"):  # both keep talking
            a.handle_request(rid, "echo", b"hb", (), fabric.now)
        fabric.advance(0.5)
    assert set(a.sessions.clients) == {b"new"}
    refused = [e for e in fabric.effects["a"] if isinstance(e, Log) and e.event == "key_refused"]
    assert refused and refused[-1].fields["key"] == OLD


def test_f2_a_hello_whose_curve_key_is_another_brokers_gets_401() -> None:
    from scale0.wire.peer import BrokerState, Hello, TableMode

    network = family_config()
    keyed = dataclasses.replace(
        network,
        brokers=tuple(
            dataclasses.replace(b, curve_public_key=key)
            for b, key in zip(network.brokers, (OLD, NEW, OTHER), strict=True)
        ),
    )
    fabric = Fabric(keyed)
    fabric.start()
    fabric.advance(1.0)
    a = fabric.brokers["a"]
    hello = Hello("b", "fam", BrokerState.ACTIVE, 1, {}, TableMode.PULL)
    a.handle(Authenticated(Channel.PEER, b"spoof", OTHER), fabric.now, fabric.wall)  # c's key
    out = a.handle(Received(Channel.PEER, b"spoof", hello), fabric.now, fabric.wall)
    (refusal,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(refusal, DisconnectError) and refusal.code == 401
    assert "CURVE key" in refusal.message
    a.handle(Authenticated(Channel.PEER, b"real", NEW), fabric.now, fabric.wall)  # b's own
    out = a.handle(Received(Channel.PEER, b"real", hello), fabric.now, fabric.wall)
    codes = [
        e.message.code
        for e in out
        if isinstance(e, Send) and isinstance(e.message, DisconnectError)
    ]
    assert 401 not in codes  # (409: the fabric's own link of b is live, F2)
