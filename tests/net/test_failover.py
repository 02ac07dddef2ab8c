"""Failover rules V1-V6 (scale0.session.failover) and C7/W6 driven with numbers: no sockets.

The real-socket scenarios (SIGKILLed brokers, 301 and 503 from test peers) are in
tests/net/test_family.py.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import zmq

from scale0.config.model import BrokerEntry, NetworkConfig
from scale0.core.broker import Broker
from scale0.net.client import Client
from scale0.session.errors import BrokerRefused, RequestTimeout
from scale0.session.failover import Failover, backoff_delay, broker_endpoints, valid_endpoint
from scale0.session.link import BrokerLink, LinkEvent
from scale0.session.requests import ClientSession
from scale0.session.view import parse_config_document
from scale0.wire.client import (
    ClientReply,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
)
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType

A, B, C = "tcp://127.0.0.1:5001", "tcp://127.0.0.1:5002", "tcp://127.0.0.1:5003"
BACK_A, BACK_B, BACK_C = "tcp://127.0.0.1:6001", "tcp://127.0.0.1:6002", "tcp://127.0.0.1:6003"
#: The UNIX time passed to the session (it only goes into HEARTBEAT).
WALL = 1_700_000_000.0


def entry(frontend: str, backend: str, **more: Any) -> dict[str, Any]:
    return {"identity": frontend[-4:], "frontend": frontend, "backend": backend, **more}


def view(*entries: Any) -> dict[str, Any]:
    return {"family": "f", "config_version": 1, "brokers": list(entries)}


def fixed(value: float) -> Any:
    return lambda: value


# ---- V1: the known brokers --------------------------------------------------------------------


def test_v1_the_seed_first_then_the_family_of_each_config() -> None:
    failover = Failover(B, "frontend")
    assert failover.endpoints == [B] and failover.current == B
    failover.learn(view(entry(A, BACK_A), entry(B, BACK_B), entry(C, BACK_C)))
    assert failover.endpoints == [A, B, C]  # the view's order; the seed is one of them
    workers = Failover(BACK_B, "backend")
    workers.learn(view(entry(A, BACK_A), entry(B, BACK_B)))
    assert workers.endpoints == [BACK_A, BACK_B]


def test_v1_standby_brokers_come_last_duplicates_once_an_unlisted_seed_stays() -> None:
    failover = Failover("tcp://localhost:5001", "frontend")
    failover.learn(
        view(entry(A, BACK_A, role="standby"), entry(B, BACK_B), entry(B, BACK_B), entry(C, BACK_C))
    )
    assert failover.endpoints == [B, C, A, "tcp://localhost:5001"]


def test_v1_a_view_without_brokers_keeps_the_seed_only_and_configack_changes_nothing() -> None:
    failover = Failover(A, "frontend")
    failover.learn(view(entry(A, BACK_A), entry(B, BACK_B)))
    failover.learn({})  # what a CONFIGACK leaves: no document
    assert failover.endpoints == [A, B]
    failover.learn({"family": "f", "config_version": 2})
    assert failover.endpoints == [A]


# ---- V2: every format's shape, and garbage ----------------------------------------------------


def _network(count: int) -> NetworkConfig:
    brokers = tuple(
        BrokerEntry(
            identity=f"b{i}",
            frontend=f"tcp://127.0.0.1:{7000 + i}",
            backend=f"tcp://127.0.0.1:{7100 + i}",
            peer=f"tcp://127.0.0.1:{7200 + i}",
            config_pub=f"tcp://127.0.0.1:{7300 + i}",
            config_source=i == 0,
            role="standby" if i == 1 and count > 2 else "active",
        )
        for i in range(count)
    )
    return NetworkConfig(family="f", config_version=1, brokers=brokers)


@pytest.mark.parametrize("config_type", list(ConfigType))
@pytest.mark.parametrize("count", [1, 2, 3])
def test_v2_views_in_json_xml_and_zfl_give_the_same_endpoints(
    config_type: ConfigType, count: int
) -> None:
    # The broker core renders the view exactly as it sends it in CONFIG (§3.2).
    core = Broker("b0", _network(count), state="active", boot_id=b"x" * 8, signature=None, now=0)
    document = parse_config_document(config_type, core.client_view(config_type))
    fronts = [f"tcp://127.0.0.1:{7000 + i}" for i in range(count)]
    backs = [f"tcp://127.0.0.1:{7100 + i}" for i in range(count)]
    if count > 2:  # b1 is a standby there: it goes last
        fronts.append(fronts.pop(1))
        backs.append(backs.pop(1))
    assert broker_endpoints(document, "frontend") == fronts
    assert broker_endpoints(document, "backend") == backs


def test_v2_text_format_shapes_lone_entries_and_string_scalars() -> None:
    lone = {"brokers": {"broker": entry(A, BACK_A, role="active", config_source="true")}}
    assert broker_endpoints(lone, "frontend") == [A]
    assert broker_endpoints({"brokers": {"broker": [entry(A, BACK_A)]}}, "backend") == [BACK_A]
    assert broker_endpoints({"brokers": entry(B, BACK_B)}, "frontend") == [B]


def test_v2_malformed_brokers_are_skipped_with_a_warning_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "scale0.failover")
    garbage = view(
        "not a table",
        42,
        None,
        {"identity": "x"},  # no frontend
        entry("udp://127.0.0.1:1", BACK_A),
        entry("tcp://127.0.0.1:99999", BACK_A),
        entry("tcp://127.0.0.1", BACK_A),
        {"frontend": ["tcp://127.0.0.1:1"]},
        entry(C, BACK_C),
    )
    assert broker_endpoints(garbage, "frontend") == [C]
    assert sum("skipped" in record.message for record in caplog.records) == 8
    for shape in ("tcp://127.0.0.1:1", 7, True, {"broker": "x"}):
        assert broker_endpoints({"brokers": shape}, "frontend") in (None, [])
    failover = Failover(A, "frontend")
    failover.learn(view(entry(B, BACK_B)))
    failover.learn({"brokers": "nonsense", "family": "f"})
    assert failover.endpoints == [A]  # a brokers value that is no list counts as absent
    failover.learn(view({"frontend": "tcp://:1"}))
    assert failover.endpoints == [A]  # nothing usable: the seed


def test_v2_one_view_is_read_once_and_an_unparsable_one_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    failover = Failover(A, "frontend")
    document = view(entry(A, BACK_A), "junk", entry(B, BACK_B))
    failover.learn(document)
    failover.learn(document)  # renegotiated: CONFIGACK keeps the same view object
    assert failover.endpoints == [A, B]
    assert sum("skipped" in record.message for record in caplog.records) == 1
    for config_type, garbage in (
        (ConfigType.XML, b"<network><brokers>"),
        (ConfigType.ZFL, b"\x00"),
    ):
        failover.learn(parse_config_document(config_type, garbage))
        assert failover.endpoints == [A, B]
    assert sum("does not parse" in record.message for record in caplog.records) == 2


def test_valid_endpoint_is_the_schema_check() -> None:
    assert valid_endpoint("tcp://127.0.0.1:5555")
    assert valid_endpoint("tcp://broker-1.example:1")
    assert valid_endpoint("tcp://[::1]:5555")
    for bad in ("tcp://h:0", "tcp://h:65536", "ipc:///tmp/x", "tcp://h", "", None, 5, "garbage"):
        assert not valid_endpoint(bad)


# ---- V3-V6: leaving -------------------------------------------------------------------------


def test_v4_round_robin_after_the_failed_one_and_f3_a_301_goes_where_it_says() -> None:
    failover = Failover(A, "frontend", jitter=fixed(0.0))
    failover.learn(view(entry(A, BACK_A), entry(B, BACK_B), entry(C, BACK_C)))
    assert failover.leave("silent", 10.0, settle_s=1.0).endpoint == B
    assert failover.leave("silent", 11.0, settle_s=1.0).endpoint == C
    assert failover.leave("silent", 12.0, settle_s=1.0).endpoint == A
    move = failover.leave("301", 13.0, settle_s=1.0, redirect="tcp://10.0.0.9:4000")
    assert move.endpoint == "tcp://10.0.0.9:4000" == failover.current
    # From an endpoint the list does not know, the first known one.
    assert failover.leave("503", 14.0, settle_s=1.0).endpoint == A
    assert failover.failovers == 5


def test_v3_a_301_with_a_garbage_endpoint_is_a_503(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "scale0.failover")
    failover = Failover(A, "frontend")
    failover.learn(view(entry(A, BACK_A), entry(B, BACK_B)))
    move = failover.leave("301 go", 1.0, settle_s=1.0, redirect="ipc:///etc/passwd")
    assert move.endpoint == B  # round robin, as for 503
    assert "handled as 503" in move.reason
    assert any("not tcp://host:port" in record.message for record in caplog.records)


def test_v4_the_only_known_broker_is_tried_again() -> None:
    failover = Failover(A, "frontend")
    assert failover.leave("silent", 1.0, settle_s=1.0).endpoint == A
    assert failover.failovers == 1


def test_v5_first_move_immediate_then_bounded_exponential_back_off_with_jitter() -> None:
    failover = Failover(A, "frontend", initial=0.1, cap=0.5, jitter=fixed(1.0))
    failover.learn(view(entry(A, BACK_A), entry(B, BACK_B)))
    delays = [failover.leave("x", 100.0, settle_s=3.0).at - 100.0 for _ in range(6)]
    assert delays == pytest.approx([0.0, 0.1, 0.2, 0.4, 0.5, 0.5])
    half = Failover(A, "frontend", initial=0.1, cap=0.5, jitter=fixed(0.0))
    half.leave("x", 0.0, settle_s=3.0)
    assert half.leave("x", 0.0, settle_s=3.0).at == pytest.approx(0.05)  # jitter 0 -> half


def test_v5_a_session_that_lasted_resets_the_back_off_a_short_one_does_not() -> None:
    failover = Failover(A, "frontend", initial=0.1, jitter=fixed(1.0))
    failover.leave("x", 0.0, settle_s=3.0)
    failover.leave("x", 0.0, settle_s=3.0)
    failover.negotiated(1.0)
    assert failover.leave("x", 2.0, settle_s=3.0).at == pytest.approx(2.0 + 0.2)  # 1 s < 3 s
    failover.negotiated(10.0)
    assert failover.leave("x", 13.0, settle_s=3.0).at == 13.0  # lasted 3 s: immediate again


def test_v6_every_move_is_counted_and_logged_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "scale0.failover")
    failover = Failover(A, "frontend", jitter=fixed(0.5))
    failover.learn(view(entry(A, BACK_A), entry(B, BACK_B)))
    failover.leave("DISCONNECTERROR 503 broker b1 is disabled", 0.0, settle_s=1.0)
    [record] = caplog.records
    assert A in record.message and B in record.message
    assert "503 broker b1 is disabled" in record.message and "failover 1" in record.message
    assert failover.failovers == 1 and failover.current == B


def test_backoff_delay_is_bounded_and_jittered() -> None:
    assert backoff_delay(0, 0.1, 5.0, fixed(1.0)) == pytest.approx(0.1)
    assert backoff_delay(0, 0.1, 5.0, fixed(0.0)) == pytest.approx(0.05)
    assert backoff_delay(1000, 0.1, 5.0, fixed(1.0)) == pytest.approx(5.0)
    assert backoff_delay(3, 0.1, 5.0, fixed(7.0)) == pytest.approx(0.8)  # jitter clamped to 1


def test_failover_refuses_a_nonsense_back_off() -> None:
    with pytest.raises(ValueError):
        Failover(A, "frontend", initial=0.0)
    with pytest.raises(ValueError):
        Failover(A, "frontend", initial=1.0, cap=0.5)


# ---- C7: the client session leaves, moves, resends -------------------------------------------


def _config(version: int, client_id: str, document: dict[str, Any]) -> list[bytes]:
    return Config(
        ConfigType.JSON,
        version,
        "0" * 64,
        client_id,
        json.dumps(document).encode(),
        protocol=SIG_CLIENT,
    ).to_frames()


def _session(retries: int = 0) -> tuple[BrokerLink, ClientSession, Failover]:
    link = BrokerLink(SIG_CLIENT, heartbeat_interval_s=0.5)
    failover = Failover(A, "frontend", jitter=fixed(1.0))
    session = ClientSession(link, retries, failover, id_prefix=bytes(8))
    link.reset(0.0)
    link.outbox.clear()
    session.receive(_config(1, "a.1", view(entry(A, BACK_A), entry(B, BACK_B))), 0.0)
    return link, session, failover


def _requests_sent(link: BrokerLink) -> list[bytes]:
    ids = [frames[4] for frames in link.outbox if frames[2] == b"REQUEST"]
    link.outbox.clear()
    return ids


def test_c7_the_client_learns_the_family_from_config() -> None:
    _link, _unused, failover = _session()
    assert failover.endpoints == [A, B]


def test_c7_silence_moves_the_client_and_every_unanswered_request_is_resent() -> None:
    link, session, failover = _session()
    first = session.submit("svc", b"1", 30.0, 1.0)
    second = session.submit("svc", b"2", 30.0, 1.0)
    assert _requests_sent(link) == [first.request_id, second.request_id]
    session.tick(1.4, WALL)  # 1.4 s since CONFIG, the last word heard: < 3 x 0.5
    assert session.move is None
    session.tick(2.6, WALL)
    move = session.move
    assert move is not None and move.endpoint == B and move.at == 2.6  # lasted: at once
    assert "answered nothing" in move.reason
    assert not link.negotiated and link.outbox == []
    assert session.next_wakeup() == 2.6
    # The owner opens a DEALER to B (link.reset) and CHECKCONFIG goes first (C1).
    session.move = None
    link.reset(2.6)
    assert [frames[2] for frames in link.outbox] == [b"CHECKCONFIG"]
    link.outbox.clear()
    session.receive(ConfigAck(1, "a.1", protocol=SIG_CLIENT).to_frames(), 2.7)
    assert _requests_sent(link) == [first.request_id, second.request_id]  # the same ids (C2)
    assert failover.endpoints == [A, B]  # CONFIGACK keeps what CONFIG taught
    session.receive(ClientReply("svc", first.request_id, 200, (b"ok",)).to_frames(), 2.8)
    assert list(first.outcomes) == [(True, [b"ok"])]
    assert failover.failovers == 1


@pytest.mark.parametrize(
    ("error", "endpoint"),
    [
        (DisconnectError(503, "broker a is disabled", protocol=SIG_CLIENT), B),
        (
            DisconnectError(301, "go", "tcp://127.0.0.1:5009", protocol=SIG_CLIENT),
            "tcp://127.0.0.1:5009",
        ),
        (DisconnectError(301, "go", "not-an-endpoint", protocol=SIG_CLIENT), B),
        (Disconnect(protocol=SIG_CLIENT), B),
    ],
)
def test_c7_disconnect_503_and_301_move_the_client(error: Any, endpoint: str) -> None:
    link, session, failover = _session()
    request = session.submit("svc", b"1", 30.0, 1.0)
    link.outbox.clear()
    session.receive(error.to_frames(), 1.5)
    assert session.move is not None and session.move.endpoint == endpoint
    assert failover.current == endpoint and link.move_to is None
    assert not request.done


def test_c7_what_the_broker_we_leave_still_says_moves_us_once_and_replies_still_count() -> None:
    link, session, failover = _session()
    request = session.submit("svc", b"1", 30.0, 1.0)
    for frames in (
        DisconnectError(503, "disabled", protocol=SIG_CLIENT).to_frames(),
        DisconnectError(301, "go", C, protocol=SIG_CLIENT).to_frames(),
        ConfigAck(1, "a.1", protocol=SIG_CLIENT).to_frames(),
        ClientReply("svc", request.request_id, 200, (b"late",)).to_frames(),
    ):
        session.receive(frames, 1.5)  # one drained batch from the old socket
    assert failover.failovers == 1 and session.move is not None and session.move.endpoint == B
    assert not link.negotiated
    assert list(request.outcomes) == [(True, [b"late"])]  # a real answer is an answer


def test_c7_a_request_timeout_bounds_it_across_moves() -> None:
    _link, session, _failover = _session()
    request = session.submit("svc", b"1", 4.0, 1.0)
    now = 1.0
    while not request.done and now < 60.0:  # every broker silent: move after move
        now += 0.1
        session.tick(now, WALL)
        if session.move is not None and now >= session.move.at:
            session.arrived(now)
    assert request.done and now == pytest.approx(5.0, abs=0.11)
    [outcome] = request.outcomes
    assert isinstance(outcome, RequestTimeout)


def test_c7_if_every_broker_refuses_the_deadline_says_503() -> None:
    _link, session, _failover = _session()
    request = session.submit("svc", b"1", 2.0, 1.0)
    session.receive(DisconnectError(503, "disabled", protocol=SIG_CLIENT).to_frames(), 1.1)
    session.tick(3.1, WALL)
    [outcome] = request.outcomes
    assert isinstance(outcome, BrokerRefused) and outcome.status == 503


def test_w6_the_worker_link_reports_why_it_leaves() -> None:
    link = BrokerLink(SIG_WORKER)
    link.reset(0.0)
    link.handle(ConfigAck(1, "w", protocol=SIG_WORKER), 0.0)
    event = link.handle(DisconnectError(301, "go", BACK_B, protocol=SIG_WORKER), 1.0)
    assert event is LinkEvent.RECONNECT and link.move_to == BACK_B
    assert link.leave_reason.startswith("DISCONNECTERROR 301")
    link.move_to = None
    assert link.handle(DisconnectError(503, "no", protocol=SIG_WORKER), 2.0) is LinkEvent.RECONNECT
    assert link.move_to is None and "503" in link.leave_reason


def test_a_seed_libzmq_refuses_is_an_error_at_once() -> None:
    with pytest.raises(zmq.ZMQError):
        Client("not-an-endpoint")
