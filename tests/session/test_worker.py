"""scale0.session.worker: READY, requests, leaving and stopping of a worker, with numbers only."""

from __future__ import annotations

import pytest

from scale0.session.failover import Failover
from scale0.session.link import BrokerLink
from scale0.session.worker import WorkerSession
from scale0.wire.client import Disconnect, DisconnectError
from scale0.wire.frames import SIG_WORKER, ConfigType
from scale0.wire.registry import decode_to_broker
from scale0.wire.worker import Ready, WorkerRequest
from tests.session.helpers import WALL, config_frames, network

SEED = "tcp://127.0.0.1:7100"  # b0's backend in helpers.network()


def _worker(capacity: int = 2, interval_s: float = 0.5) -> WorkerSession:
    link = BrokerLink(SIG_WORKER, heartbeat_interval_s=interval_s)
    session = WorkerSession(link, Failover(SEED, "backend"), ("echo", "upper"), capacity)
    session.arrived(0.0)
    return session


def _commands(session: WorkerSession) -> list[bytes]:
    commands = [frames[2] for frames in session.outbox]
    session.outbox.clear()
    return commands


@pytest.mark.parametrize("config_type", list(ConfigType))
def test_config_in_any_format_is_answered_with_ready(config_type: ConfigType) -> None:
    session = _worker()
    session.link.config_type = config_type
    assert _commands(session) == [b"CHECKCONFIG"] and not session.registered
    config = network(3, default_heartbeat_interval_ms=800)
    assert session.receive(config_frames(config, config_type, SIG_WORKER), 1.0, WALL) is None
    [frames] = session.outbox
    ready = decode_to_broker(frames, max_frame_bytes=1 << 20)
    assert isinstance(ready, Ready)
    assert ready.services == ("echo", "upper") and ready.capacity == 2
    assert ready.time == WALL and ready.hbeatinterval_ms == 800 and ready.config_version == 1
    assert session.registered
    assert session.failover.endpoints == [f"tcp://127.0.0.1:{7100 + n}" for n in range(3)]


def test_a_request_is_handed_to_the_owner() -> None:
    session = _worker()
    session.receive(config_frames(network(), ConfigType.JSON, SIG_WORKER), 0.0, WALL)
    request = WorkerRequest(b"t1", "echo", (b"hi",))
    assert session.receive(request.to_frames(), 0.1, WALL) == request


@pytest.mark.parametrize(
    ("message", "endpoint"),
    [
        (Disconnect(protocol=SIG_WORKER), "tcp://127.0.0.1:7101"),
        (DisconnectError(503, "disabled", protocol=SIG_WORKER), "tcp://127.0.0.1:7101"),
        (DisconnectError(301, "go", "tcp://127.0.0.1:7999", protocol=SIG_WORKER), None),
    ],
)
def test_disconnect_503_and_301_leave_once(message: object, endpoint: str | None) -> None:
    session = _worker()
    session.receive(config_frames(network(), ConfigType.JSON, SIG_WORKER), 0.0, WALL)
    session.outbox.clear()
    frames = message.to_frames()  # type: ignore[attr-defined]
    session.receive(frames, 5.0, WALL)
    move = session.move
    assert move is not None and session.ended() and not session.registered
    assert move.endpoint == (endpoint or "tcp://127.0.0.1:7999") and move.at == 5.0
    # More of what the broker being left had queued moves nothing again.
    session.receive(DisconnectError(503, "again", protocol=SIG_WORKER).to_frames(), 5.0, WALL)
    assert session.move is move and session.failover.failovers == 1
    request = WorkerRequest(b"t9", "echo", (b"late",)).to_frames()
    assert session.receive(request, 5.0, WALL) is None  # no new work from a broker we left
    assert session.outbox == []
    session.arrived(move.at)
    assert not session.ended() and _commands(session) == [b"CHECKCONFIG"]


def test_a_silent_broker_is_left_and_401_stops() -> None:
    session = _worker(interval_s=0.5)
    session.receive(config_frames(network(), ConfigType.JSON, SIG_WORKER), 0.0, WALL)
    session.tick(2.9, WALL)  # config interval 1 s x liveness 3
    assert session.move is None
    session.tick(3.1, WALL)
    assert session.move is not None and "answered nothing" in session.move.reason
    assert session.next_wakeup() == session.move.at
    stopped = _worker()
    stopped.receive(DisconnectError(401, "no", protocol=SIG_WORKER).to_frames(), 0.0, WALL)
    assert stopped.stopped and stopped.ended() and stopped.move is None


def test_nonsense_capacity_or_no_services_is_refused() -> None:
    link = BrokerLink(SIG_WORKER)
    with pytest.raises(ValueError):
        WorkerSession(link, Failover(SEED, "backend"), ("echo",), 0)
    with pytest.raises(ValueError):
        WorkerSession(link, Failover(SEED, "backend"), (), 1)
