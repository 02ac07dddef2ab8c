"""scale0.session.link: one DEALER's negotiation, heartbeats and liveness, with numbers only."""

from __future__ import annotations

import pytest

from scale0.session.link import BrokerLink, LinkEvent
from scale0.wire.client import DisconnectError, Heartbeat
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.registry import decode_to_broker
from tests.session.helpers import WALL, config_frames, network


def _negotiate(link: BrokerLink, frames: list[bytes], now: float) -> LinkEvent | None:
    message = link.decode(frames)
    assert message is not None
    return link.handle(message, now)


def test_heartbeat_carries_the_wall_time_it_is_given() -> None:
    link = BrokerLink(SIG_WORKER, heartbeat_interval_s=1.0)
    link.reset(10.0)
    link.outbox.clear()
    _negotiate(link, config_frames(network(), ConfigType.JSON, SIG_WORKER), 10.0)
    assert not link.tick(11.0, WALL + 3.25)
    [frames] = link.outbox
    heartbeat = decode_to_broker(frames, max_frame_bytes=1 << 20)
    assert isinstance(heartbeat, Heartbeat) and heartbeat.time == WALL + 3.25


@pytest.mark.parametrize("config_type", list(ConfigType))
def test_the_config_interval_and_liveness_apply_in_every_format(config_type: ConfigType) -> None:
    link = BrokerLink(SIG_CLIENT, config_type=config_type, heartbeat_interval_s=0.2)
    link.reset(0.0)
    config = network(default_heartbeat_interval_ms=750, liveness=4)
    assert _negotiate(link, config_frames(config, config_type, SIG_CLIENT), 0.0) is (
        LinkEvent.NEGOTIATED
    )
    assert link.interval_s == 0.75 and link.liveness == 4
    assert link.settle_s == 3.0
    assert link.next_wakeup() == 0.75  # the first heartbeat
    assert not link.tick(3.0, WALL) and link.tick(3.01, WALL)


def test_refusal_back_off_uses_the_jitter_it_is_given() -> None:
    halves = BrokerLink(SIG_CLIENT, jitter=lambda: 0.0)
    full = BrokerLink(SIG_CLIENT)  # no jitter source: the whole delay, deterministic
    for link in (halves, full):
        link.reset(0.0)
        link.handle(DisconnectError(429, "slow down", protocol=SIG_CLIENT), 1.0)
        link.handle(DisconnectError(429, "slow down", protocol=SIG_CLIENT), 1.0)
    assert halves.retry_at == pytest.approx(1.0 + 0.2 * 0.5)
    assert full.retry_at == pytest.approx(1.0 + 0.2)


def test_leave_silences_the_link_until_the_next_socket() -> None:
    link = BrokerLink(SIG_CLIENT, heartbeat_interval_s=0.5)
    link.reset(0.0)
    _negotiate(link, config_frames(network(), ConfigType.JSON, SIG_CLIENT), 0.0)
    link.handle(DisconnectError(301, "go", "tcp://127.0.0.1:9", protocol=SIG_CLIENT), 0.1)
    link.leave()
    assert link.move_to is None and not link.negotiated and link.outbox == []
    link.tick(5.0, WALL)
    assert link.outbox == []  # no HEARTBEAT to a broker we left
    link.reset(5.0)
    assert [frames[2] for frames in link.outbox] == [b"CHECKCONFIG"]


def _beats(link: BrokerLink) -> list[Heartbeat]:
    out = [decode_to_broker(frames, max_frame_bytes=1 << 20) for frames in link.outbox]
    link.outbox.clear()
    return [m for m in out if isinstance(m, Heartbeat)]


@pytest.mark.parametrize("config_type", list(ConfigType))
def test_an_idle_link_beats_at_the_idle_interval_promising_it(config_type: ConfigType) -> None:
    """§3.4: no work for liveness intervals, the link beats every idle interval with interval_ms;
    it holds the broker to the interval the broker's HEARTBEAT promises; work wakes it."""
    link = BrokerLink(SIG_WORKER, config_type=config_type, heartbeat_interval_s=1.0)
    link.reset(0.0)
    config = network(default_heartbeat_interval_ms=1000, idle_heartbeat_interval_ms=4000)
    _negotiate(link, config_frames(config, config_type, SIG_WORKER), 0.0)
    assert link.idle_interval_s == 4.0
    link.outbox.clear()
    promises = []
    for t in (1.0, 2.0, 3.0):  # active: liveness (3) intervals since the negotiation
        link.heard(t)
        assert not link.tick(t, WALL)
        promises += [b.interval_ms for b in _beats(link)]
    assert promises == [None, None, 4000]  # the third beat: no work for 3 intervals
    assert link.next_wakeup() == 6.0  # the broker's silence (3 x 1 s) before the next beat
    # The broker's beat says its promise: it is dead only after 3 x 4 s.
    link.handle(Heartbeat(WALL, 0, 1000, 4000, protocol=SIG_WORKER), 4.0)
    link.heard(4.0)
    assert link.next_wakeup() == 7.0  # our next beat, at 3 + 4 s
    assert not link.tick(7.0, WALL) and [b.interval_ms for b in _beats(link)] == [4000]
    assert not link.tick(15.9, WALL) and link.tick(16.01, WALL)  # 4 + 12 s
    assert [b.interval_ms for b in _beats(link)] == [4000]  # the one due at 11 s
    # Work: the next beat within one interval, promising nothing.
    link.heard(16.0)
    link.note_work(16.0)
    assert not link.tick(17.0, WALL) and [b.interval_ms for b in _beats(link)] == [None]


def test_a_busy_link_never_goes_idle_and_idle_off_never_promises() -> None:
    for idle_ms, busy in ((4000, True), (0, False)):
        link = BrokerLink(SIG_CLIENT, heartbeat_interval_s=1.0)
        link.reset(0.0)
        config = network(idle_heartbeat_interval_ms=idle_ms)
        _negotiate(link, config_frames(config, ConfigType.JSON, SIG_CLIENT), 0.0)
        link.outbox.clear()
        link.busy = busy
        promises = []
        for t in range(1, 11):
            link.heard(float(t))
            link.tick(float(t), WALL)
            promises += [b.interval_ms for b in _beats(link)]
        assert promises == [None] * 10
