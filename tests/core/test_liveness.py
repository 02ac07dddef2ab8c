"""Liveness by sweep and round (R8, R11; docs/performance.md, "Liveness"): a silent session
ends at exactly last_seen + liveness x interval, the broker beats each worker once per interval,
and neither costs the timer heap an entry per connection. The clock is the harness's fake one,
passed to the core as it takes it (``handle(event, now, wall)``)."""

from __future__ import annotations

import itertools
import random

from scale0.core.effects import Log
from scale0.core.timers import BEAT_SLOTS
from scale0.wire.client import ForceNegotiate, Heartbeat
from tests.core.harness import BACK, FRONT, Harness, sends


def rid(kind: str, n: int) -> bytes:
    return b"\x00" + kind.encode() + b"%d" % n


def live(h: Harness) -> tuple[set[bytes], set[bytes]]:
    sessions = h.broker.sessions
    return set(sessions.clients), set(sessions.workers)


def test_sessions_heard_at_different_times_each_end_at_exactly_their_own_timeout() -> None:
    h = Harness()  # interval 1 s, liveness 3: timeout 3 s
    heard: dict[bytes, float] = {}
    for n in range(10):
        h.client(rid("c", n))
        h.worker(rid("w", n))
        heard[rid("c", n)] = heard[rid("w", n)] = h.now
        h.advance(0.25)
    # The first five speak again later (clients with a HEARTBEAT, workers with one too).
    for n in range(5):
        h.heartbeat(FRONT, rid("c", n))
        h.heartbeat(BACK, rid("w", n))
        heard[rid("c", n)] = heard[rid("w", n)] = h.now
    for when in sorted(set(heard.values())):
        expires = when + 3.0
        h.advance(expires - 0.001 - h.now)
        clients, workers = live(h)
        due = {r for r, t in heard.items() if t == when}
        assert due <= clients | workers, f"ended before {expires}"
        h.advance(0.001)
        clients, workers = live(h)
        assert not due & (clients | workers), f"still there at {expires}"
        still = {r for r, t in heard.items() if t > when}
        assert still <= clients | workers


def test_a_worker_that_replies_is_heard_and_moves_to_the_end_of_the_order() -> None:
    h = Harness()
    w1, w2 = rid("w", 1), rid("w", 2)
    h.worker(w1)
    h.worker(w2)
    h.client(rid("c", 1))
    h.advance(2.0)
    effects = h.request(rid("c", 1), b"r1")
    ticket = next(m.ticket for r, m in sends(effects, BACK) if hasattr(m, "ticket"))
    worker = next(r for r, m in sends(effects, BACK) if hasattr(m, "ticket"))
    h.reply(worker, ticket)  # any message counts (R8), the hot path's inline touch
    h.advance(0.999)  # 2.999 s after READY: nobody due
    assert len(live(h)[1]) == 2
    h.advance(0.001)
    assert live(h)[1] == {worker}  # the other one, silent 3 s, ended; the one that replied not
    h.advance(1.999)
    assert live(h)[1] == {worker}
    h.advance(0.001)
    assert live(h)[1] == set()


def test_a_new_ready_moves_a_worker_to_its_new_timeout() -> None:
    h = Harness()
    w = rid("w", 1)
    h.worker(w, interval_ms=1000)
    h.advance(1.0)
    h.worker(w, interval_ms=4000)  # renegotiates and says READY with a longer interval
    h.advance(11.999)
    assert live(h)[1] == {w}
    h.advance(0.001)  # 3 x 4 s after the second READY
    assert live(h)[1] == set()


def test_a_worker_that_turns_heartbeat_on_is_expired_and_one_that_turns_it_off_is_not() -> None:
    h = Harness()
    w1, w2 = rid("w", 1), rid("w", 2)
    h.worker(w1, heartbeat=False)
    h.worker(w2, heartbeat=True)
    h.advance(1.0)
    h.worker(w1, heartbeat=True)
    h.worker(w2, heartbeat=False)
    h.advance(2.999)
    assert live(h)[1] == {w1, w2}
    h.advance(0.001)
    assert live(h)[1] == {w2}
    h.advance(3600)
    assert live(h)[1] == {w2}


def test_an_expired_client_must_negotiate_again_and_its_new_session_has_a_full_timeout() -> None:
    h = Harness()
    c = rid("c", 1)
    h.client(c)
    h.advance(3.0)
    assert isinstance(sends(h.heartbeat(FRONT, c))[0][1], ForceNegotiate)
    h.client(c)
    h.advance(2.999)
    assert live(h)[0] == {c}
    h.advance(0.001)
    assert live(h)[0] == set()


def test_thousands_of_sessions_hold_a_constant_number_of_timer_entries() -> None:
    h = Harness()
    for n in range(1000):
        h.client(rid("c", n))
        h.worker(rid("w", n))
        if n % 100 == 0:
            h.advance(0.1)
    for step in range(30):  # ten seconds of everyone heartbeating, spread over the interval
        for n in range(1000):
            if (n + step) % 3 == 0:
                h.heartbeat(FRONT, rid("c", n))
                h.heartbeat(BACK, rid("w", n))
        h.advance(0.34)
        # One sweep entry (and at times one superseded), a round per slot of the interval, the
        # sweep of old scores: nothing per connection.
        assert len(h.broker.core.timers) <= BEAT_SLOTS + 3
    clients, workers = live(h)
    assert len(clients) == 1000 and len(workers) == 1000


def test_the_sweep_agrees_with_a_model_of_every_session() -> None:
    """Random heartbeats, READYs and ticks: the live sessions are exactly those heard within
    their timeout, at every step (a session once ended stays ended in the model, as it does in
    the broker: its next HEARTBEAT gets FORCENEGOTIATE)."""
    for seed in range(5):
        rng = random.Random(seed)
        h = Harness()
        timeout: dict[tuple[str, int], float] = {}
        heard: dict[tuple[str, int], float] = {}
        for step in range(400):
            kind = rng.choice(("c", "w"))
            n = rng.randrange(20)
            key = (kind, n)
            action = rng.random()
            if action < 0.15 and key not in heard:
                if kind == "c":
                    h.client(rid(kind, n))
                    timeout[key] = 3.0
                else:
                    interval = rng.choice((1000, 1500, 2000))
                    h.worker(rid(kind, n), interval_ms=interval)
                    timeout[key] = 3 * interval / 1000
                heard[key] = h.now
            elif action < 0.7 and key in heard:
                h.heartbeat(FRONT if kind == "c" else BACK, rid(kind, n))
                heard[key] = h.now
            else:
                h.advance(rng.choice((0.001, 0.1, 0.5, 1.0, 2.999)))
                for k in [k for k, t in heard.items() if t + timeout[k] <= h.now]:
                    del heard[k]
            clients, workers = live(h)
            want = {rid(k, n) for (k, n) in heard}
            assert clients | workers == want, (seed, step)


STEP = 0.05  # the tests' clock moves by this much between two Ticks: beats are seen this late
LATE = STEP + 1e-6  # (and the float sums of it)


def _beats(
    h: Harness, workers: list[bytes], steps: int, beats: dict[bytes, list[float]] | None = None
) -> dict[bytes, list[float]]:
    """``steps`` x STEP of every worker heartbeating: when each got a beat."""
    beats = {w: [] for w in workers} if beats is None else beats
    for _ in range(steps):
        for w in workers:
            h.heartbeat(BACK, w)
        for r, message in sends(h.advance(STEP), BACK):
            assert isinstance(message, Heartbeat) and message.hbeatinterval_ms == 1000
            beats[r].append(round(h.now, 6))
    return beats


def test_every_worker_gets_one_beat_per_interval_the_first_within_one_of_ready() -> None:
    h = Harness()
    workers = [rid("w", n) for n in range(8)]
    ready: dict[bytes, float] = {}
    beats: dict[bytes, list[float]] = {w: [] for w in workers}
    for w in workers:
        h.worker(w)
        ready[w] = h.now
        _beats(h, workers[: len(ready)], 3, beats)  # READY 0.15 s apart: other slots
    _beats(h, workers, 120, beats)  # 6 s
    for w, times in beats.items():
        assert 0 < times[0] - ready[w] <= 1.0 + LATE
        assert len(times) in (5, 6, 7)
        gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
        assert all(1.0 - LATE <= gap <= 1.0 + LATE for gap in gaps)
    rounds = {t for times in beats.values() for t in times}
    assert len(rounds) > len(beats[workers[0]])  # spread over the interval, not one burst


def test_workers_ready_within_one_slot_are_beaten_in_one_round() -> None:
    h = Harness()
    h.advance(1.0 - h.now % 1.0 + 0.001)  # at the start of a slot
    workers = [rid("w", n) for n in range(8)]
    for w in workers:
        h.worker(w)
        h.advance(0.01)  # all 8 within a tenth of the interval
    beats = _beats(h, workers, 80)
    assert len({tuple(times) for times in beats.values()}) == 1


def test_a_new_worker_is_beaten_at_most_one_interval_after_ready_and_a_lost_one_not_at_all() -> (
    None
):
    h = Harness()
    w1, w2, w3 = rid("w", 1), rid("w", 2), rid("w", 3)
    h.worker(w1)
    h.advance(0.6)
    h.worker(w2)
    h.worker(w3, interval_ms=2500)  # its own round
    beats = _beats(h, [w1, w3], 20)  # W2 silent from its READY on
    beats.update({w2: []})
    assert len(beats[w1]) == 1 and len(beats[w3]) == 0
    lost: list[Log] = []
    for _ in range(100):
        h.heartbeat(BACK, w1)
        h.heartbeat(BACK, w3)
        effects = h.advance(STEP)
        lost += [e for e in effects if isinstance(e, Log) and e.event == "worker_lost"]
        for r, _ in sends(effects, BACK):
            beats[r].append(round(h.now, 6))
    assert {bytes.fromhex(str(e.fields["worker"])) for e in lost} == {w2}  # silent 3 s
    # W2 got its beats while it lived (at most an interval after READY, then every interval),
    # none after it was lost at 3.6 s.
    assert beats[w2] and all(t <= 1003.6 + LATE for t in beats[w2])
    assert 1000.6 < beats[w2][0] <= 1001.6 + LATE
    assert 1000.6 < beats[w3][0] <= 1003.1 + LATE  # its own interval, 2.5 s
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(beats[w3])]
    assert gaps and all(2.5 - LATE <= gap <= 2.5 + LATE for gap in gaps)


def test_a_worker_that_renegotiates_is_beaten_once_per_round_not_twice() -> None:
    h = Harness()
    w = rid("w", 1)
    h.worker(w)
    h.advance(0.5)
    h.worker(w)  # CHECKCONFIG and READY again: a new session of the same worker
    for _ in range(4):
        h.heartbeat(BACK, w)
        beats = sends(h.advance(0.5), BACK) + sends(h.advance(0.5), BACK)
        assert [r for r, _ in beats] == [w]


def test_after_a_stall_of_several_intervals_each_worker_is_beaten_once_then_every_interval() -> (
    None
):
    h = Harness(liveness=10)  # nobody expires in the stall
    workers = [rid("w", n) for n in range(4)]
    for w in workers:
        h.worker(w)
        h.advance(0.3)
    effects = h.advance(3.5)  # the loop stalled: every round is late by several intervals
    beaten = [r for r, _ in sends(effects, BACK)]
    assert sorted(beaten) == sorted(workers)  # once each, not once per interval missed
    beats = _beats(h, workers, 60)
    for times in beats.values():
        gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
        assert gaps and all(1.0 - LATE <= gap <= 1.0 + LATE for gap in gaps)
