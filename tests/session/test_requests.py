"""scale0.session.requests: ids, resends, deadlines and answers of a client, with numbers only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.session.errors import BrokerRefused, RequestTimeout, ServiceUnavailable
from scale0.session.failover import Failover
from scale0.session.link import BrokerLink
from scale0.session.requests import ClientSession, RequestIds, body_frames, take
from scale0.wire.client import ClientPartial, ClientReply, ConfigAck, DisconnectError
from scale0.wire.frames import SIG_CLIENT, ConfigType
from tests.session.helpers import WALL, config_frames, network

PREFIX = b"\x01" * 8


def _session(retries: int, interval_s: float = 1000.0) -> ClientSession:
    """A negotiated session whose broker never falls silent within the test's times."""
    link = BrokerLink(SIG_CLIENT, heartbeat_interval_s=interval_s)
    failover = Failover("tcp://127.0.0.1:5001", "frontend")
    session = ClientSession(link, retries, failover, id_prefix=PREFIX)
    session.arrived(0.0)
    session.receive(config_frames(network(), ConfigType.JSON, SIG_CLIENT), 0.0)
    link.outbox.clear()
    return session


def _sent(session: ClientSession) -> list[bytes]:
    ids = [frames[4] for frames in session.link.outbox if frames[2] == b"REQUEST"]
    session.link.outbox.clear()
    return ids


def test_request_ids_are_the_given_prefix_and_a_counter() -> None:
    ids = RequestIds(PREFIX)
    assert [ids.next() for _ in range(3)] == [PREFIX + n.to_bytes(8, "big") for n in (1, 2, 3)]
    with pytest.raises(ValueError):
        RequestIds(b"short")
    session = _session(retries=0)
    assert session.submit("svc", b"x", 1.0, 0.0).request_id == PREFIX + (1).to_bytes(8, "big")


def test_body_frames_accepts_one_frame_or_many() -> None:
    assert body_frames(b"a") == (b"a",)
    assert body_frames(bytearray(b"a")) == (b"a",)
    assert body_frames([b"a", memoryview(b"b")]) == (b"a", b"b")


def test_resend_schedule_then_timeout() -> None:
    session = _session(retries=2)
    request = session.submit("svc", b"x", 3.0, 0.0)
    assert _sent(session) == [request.request_id]
    for now, expected in ((0.99, 0), (1.0, 1), (1.5, 0), (2.0, 1), (2.9, 0)):
        session.tick(now, WALL)
        assert len(_sent(session)) == expected, now
    assert session.next_wakeup() == 3.0
    session.tick(3.0, WALL)
    assert _sent(session) == [] and request.done
    with pytest.raises(RequestTimeout):
        take(request)


def test_a_partial_is_news_and_postpones_the_resend() -> None:
    session = _session(retries=1)
    request = session.submit("svc", b"x", 4.0, 0.0)
    _sent(session)
    session.receive(ClientPartial("svc", request.request_id, (b"p",)).to_frames(), 1.5)
    session.tick(2.0, WALL)
    assert _sent(session) == []  # attempt 2 s from the PARTIAL at 1.5, not from 0
    session.tick(3.5, WALL)
    assert _sent(session) == [request.request_id]
    assert take(request) == (False, [b"p"])


def test_an_error_reply_raises_its_type_and_a_late_duplicate_is_dropped() -> None:
    session = _session(retries=0)
    request = session.submit("svc", b"x", 4.0, 0.0)
    failure = ClientReply.failure("svc", request.request_id, 503, "nobody")
    session.receive(failure.to_frames(), 1.0)
    session.receive(ClientReply("svc", request.request_id, 200, (b"late",)).to_frames(), 1.1)
    assert len(request.outcomes) == 1
    with pytest.raises(ServiceUnavailable) as raised:
        take(request)
    assert raised.value.request_id == request.request_id


def test_401_fails_every_request_with_broker_refused() -> None:
    session = _session(retries=0)
    requests = [session.submit("svc", b"%d" % n, 4.0, 0.0) for n in range(3)]
    session.receive(DisconnectError(401, "who are you", protocol=SIG_CLIENT).to_frames(), 1.0)
    assert session.pending == {}
    for request in requests:
        with pytest.raises(BrokerRefused) as refused:
            take(request)
        assert refused.value.status == 401


def test_requests_queued_before_negotiation_go_out_once_it_is_done() -> None:
    link = BrokerLink(SIG_CLIENT)
    session = ClientSession(link, 1, Failover("tcp://127.0.0.1:5001", "frontend"), id_prefix=PREFIX)
    session.arrived(0.0)
    link.outbox.clear()
    request = session.submit("svc", b"x", 4.0, 0.0)
    assert _sent(session) == []  # C1: nothing but CHECKCONFIG before an answer
    session.receive(ConfigAck(1, "c.1", protocol=SIG_CLIENT).to_frames(), 0.5)
    assert _sent(session) == [request.request_id]


@settings(max_examples=200, deadline=None)
@given(
    timeout_s=st.floats(0.01, 100.0),
    retries=st.integers(0, 5),
    ticks=st.lists(st.floats(0.0, 120.0), max_size=40),
)
def test_resends_are_bounded_and_the_deadline_always_ends_a_request(
    timeout_s: float, retries: int, ticks: list[float]
) -> None:
    session = _session(retries=retries)
    request = session.submit("svc", b"x", timeout_s, 0.0)
    sends = len(_sent(session))
    for now in sorted(ticks):
        session.tick(now, WALL)
        sends += len(_sent(session))
        if now < timeout_s:
            assert not request.done
            # Never more than one send per elapsed attempt period, never over 1 + retries.
            assert sends <= min(1 + retries, 1 + int(now / request.attempt_s + 1e-9))
    session.tick(timeout_s, WALL)
    assert request.done and sends <= 1 + retries
    [outcome] = request.outcomes
    assert isinstance(outcome, RequestTimeout)
    assert session.pending == {}
