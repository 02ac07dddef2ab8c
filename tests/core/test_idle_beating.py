"""R23, idle beating (docs/protocol.md §3.4): a HEARTBEAT's ``interval_ms`` is its sender's
promise; the broker keeps an idle client or worker for liveness x that promise, exactly, beats
an idle worker at it, and holds a sender that gets or sends work to its own interval again.
All on the harness's fake clock."""

from __future__ import annotations

import pytest

from scale0.core.effects import Effect, Log
from scale0.wire.client import DisconnectError, ForceNegotiate, Heartbeat
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER
from scale0.wire.registry import decode_to_broker
from tests.core.harness import BACK, FRONT, Harness, dispatched, only, sends

C1, W1, W2 = b"\x00c1", b"\x00w1", b"\x00w2"


def lost(effects: list[Effect]) -> list[dict[str, object]]:
    return [e.fields for e in effects if isinstance(e, Log) and e.event == "worker_lost"]


def beats_to(effects: list[Effect], rid: bytes) -> list[Heartbeat]:
    return [m for r, m in sends(effects, BACK) if r == rid and isinstance(m, Heartbeat)]


def test_r23_an_idle_worker_is_kept_past_liveness_intervals_and_lost_at_liveness_idle() -> None:
    h = Harness()
    h.worker(W1)
    h.worker(W2)  # beats at its interval, saying nothing: expired at 3 s as ever
    # The promise is answered at once with a HEARTBEAT saying it (the worker holds us to it).
    answer = only(sends(h.heartbeat(BACK, W1, promise=5000)))[1]
    assert isinstance(answer, Heartbeat)
    assert (answer.interval_ms, answer.hbeatinterval_ms) == (5000, 1000)
    assert sends(h.heartbeat(BACK, W1, promise=5000)) == []  # kept: nothing to say
    out = h.advance(2.9)
    out += h.heartbeat(BACK, W2)
    out += h.advance(2.0)  # 4.9 s: W1 would be gone by now without its promise
    assert h.broker.stats()["workers"] == 2 and lost(out) == []
    out = []
    for _ in range(10):
        out += h.advance(1.0)
    out += h.advance(0.099)  # 14.999 s after its promise
    assert h.broker.stats()["workers"] == 1 and [d["worker"] for d in lost(out)] == [W2.hex()]
    # The broker beat W1 at its promise, saying it, with the interval it enforces beside it.
    beats = beats_to(out, W1)
    assert len(beats) == 2 and {(b.interval_ms, b.hbeatinterval_ms) for b in beats} == {
        (5000, 1000)
    }
    out = h.advance(0.001)  # exactly liveness x idle: 15 s
    assert [d["worker"] for d in lost(out)] == [W1.hex()]
    assert only(lost(out))["silent_ms"] == 15000


def test_r23_an_idle_client_is_answered_with_its_promise_and_kept_for_liveness_idle() -> None:
    h = Harness()
    h.client(C1)
    answer = only(sends(h.heartbeat(FRONT, C1, promise=5000)))[1]
    assert isinstance(answer, Heartbeat) and answer.interval_ms == 5000
    h.advance(14.999)
    assert h.broker.stats()["clients"] == 1
    h.advance(0.001)
    assert h.broker.stats()["clients"] == 0
    assert isinstance(only(sends(h.heartbeat(FRONT, C1)))[1], ForceNegotiate)


def test_r23_a_heartbeat_without_a_promise_is_back_at_the_negotiated_interval() -> None:
    h = Harness()
    h.client(C1)
    h.worker(W1)
    h.heartbeat(FRONT, C1, promise=5000)
    h.heartbeat(BACK, W1, promise=5000)
    answer = only(sends(h.heartbeat(FRONT, C1)))[1]
    assert isinstance(answer, Heartbeat) and answer.interval_ms is None
    h.heartbeat(BACK, W1, promise=1000)  # the negotiated one, said: the same as nothing
    out = h.advance(1.0)
    assert [b.interval_ms for b in beats_to(out, W1)] == [None]
    h.advance(2.0)
    assert h.broker.stats()["clients"] == 0 and h.broker.stats()["workers"] == 0


def test_r23_a_request_to_an_idle_worker_holds_it_to_its_interval_from_the_dispatch() -> None:
    h = Harness()
    h.worker(W1)
    h.heartbeat(BACK, W1, promise=5000)
    h.advance(4.0)
    h.client(C1)
    assert len(dispatched(h.request(C1, b"r1"))) == 1
    out = h.advance(1.0)  # the broker beats it at its interval again, saying no promise
    assert [b.interval_ms for b in beats_to(out, W1)] == [None]
    out += h.advance(1.999)
    assert lost(out) == [] and h.broker.stats()["workers"] == 1
    out = h.advance(0.001)  # 3 s after the dispatch, not 15 s after its promise
    assert only(lost(out))["worker"] == W1.hex()


def test_r23_a_worker_holding_a_request_is_held_to_its_interval_whatever_it_promises() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1)
    assert len(dispatched(h.request(C1, b"r1"))) == 1
    assert sends(h.heartbeat(BACK, W1, promise=5000)) == []  # crossed the REQUEST: accepted
    h.advance(2.999)
    assert h.broker.stats()["workers"] == 1
    assert only(lost(h.advance(0.001)))["worker"] == W1.hex()


def test_r23_a_request_from_an_idle_client_holds_it_to_the_interval() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1)
    h.heartbeat(FRONT, C1, promise=5000)
    h.advance(1.0)
    h.heartbeat(BACK, W1)
    h.request(C1, b"r1")
    h.advance(2.0)
    h.heartbeat(BACK, W1)
    h.advance(0.999)
    assert h.broker.stats()["clients"] == 1
    h.advance(0.001)  # 3 s after its REQUEST
    assert h.broker.stats()["clients"] == 0


@pytest.mark.parametrize(
    ("promise", "why"),
    [
        (999, "interval_ms 999 is below the negotiated interval (1000)"),
        (1, "interval_ms 1 is below the negotiated interval (1000)"),
        (5001, "interval_ms 5001 is above idle_heartbeat_interval_ms (5000)"),
        (2**31 - 1, "is above idle_heartbeat_interval_ms (5000)"),
    ],
)
def test_r23_a_bad_promise_is_400_naming_it_and_ends_the_session(promise: int, why: str) -> None:
    for channel, rid in ((FRONT, C1), (BACK, W1)):
        h = Harness()
        h.client(C1)
        h.worker(W1)
        h.worker(W2)
        out = h.heartbeat(channel, rid, promise=promise)
        error = only(sends(out))[1]
        assert isinstance(error, DisconnectError) and error.code == 400
        assert why in error.message and "interval_ms" in error.message
        assert isinstance(only(sends(h.heartbeat(channel, rid)))[1], ForceNegotiate)
        assert h.broker.stats()["malformed"] == 1  # the error score went up (R13)
        assert h.broker.stats()["workers"] == (1 if channel is BACK else 2)


def test_r23_a_worker_promises_at_least_its_own_interval() -> None:
    h = Harness()
    h.worker(W1, interval_ms=2000)
    error = only(sends(h.heartbeat(BACK, W1, promise=1500)))[1]
    assert isinstance(error, DisconnectError) and "below the negotiated interval (2000)" in (
        error.message
    )
    h.worker(W1, interval_ms=2000)
    assert sends(h.heartbeat(BACK, W1, promise=2000)) == []  # its own: nothing new
    assert only(beats_to(h.heartbeat(BACK, W1, promise=5000), W1)).interval_ms == 5000


def test_r23_idle_beating_off_refuses_any_promise() -> None:
    for promise in (5000, 1000):
        h = Harness(idle_heartbeat_interval_ms=0)
        h.client(C1)
        error = only(sends(h.heartbeat(FRONT, C1, promise=promise)))[1]
        assert isinstance(error, DisconnectError) and error.code == 400
        assert f"interval_ms {promise}: idle beating is off" in error.message
    h = Harness(idle_heartbeat_interval_ms=0)
    h.client(C1)
    assert isinstance(only(sends(h.heartbeat(FRONT, C1)))[1], Heartbeat)  # none: as ever


@pytest.mark.parametrize("value", [b'"5000"', b"5000.5", b"0", b"-1", b"true", b"2147483648"])
def test_r23_a_promise_that_is_not_an_interval_does_not_decode(value: bytes) -> None:
    """Not an int 1..2^31-1: the typed decoder's 400 names the option (the broker answers it
    as any malformed message, R13)."""
    for signature in (SIG_CLIENT, SIG_WORKER):
        options = b'{"time":1.5,"config_version":3,"interval_ms":%s}' % value
        with pytest.raises(ProtocolError) as info:
            decode_to_broker([b"", signature, b"HEARTBEAT", options], max_frame_bytes=1 << 20)
        assert info.value.code == 400 and "interval_ms" in str(info.value)
