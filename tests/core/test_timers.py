"""TimerHeap: what it fires, and in which order, whatever its handlers push while firing (the
entry that fires is replaced by the first push made meanwhile, scale0/core/timers.py)."""

from __future__ import annotations

import random

import pytest

from scale0.core.timers import TimerHeap


class Reference:
    """The plain semantics: keys due at ``now``, earliest first, ties in push order."""

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, int]] = []
        self.count = 0

    def push(self, due: float, key: int) -> None:
        self.entries.append((due, self.count, key))
        self.count += 1

    def pop(self, now: float) -> int | None:
        first = min(self.entries, default=None)
        if first is None or first[0] > now:
            return None
        self.entries.remove(first)
        return first[2]


def pushes(seed: int, key: int, now: float) -> list[tuple[float, int]]:
    """What a handler firing ``key`` at ``now`` pushes: nothing, itself again later, others
    (some due at once: those have a greater key, so a round ends)."""
    rng = random.Random(f"{seed}/{key}/{now}")
    out = []
    for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 3])):
        other = rng.randrange(1000)
        due = now if other > key and rng.random() < 0.4 else now + rng.uniform(0.01, 3)
        out.append((due, other))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_heap_whose_handlers_push_fires_as_the_plain_semantics_do(seed: int) -> None:
    rng = random.Random(seed)
    heap: TimerHeap[int] = TimerHeap()
    reference = Reference()
    for _ in range(rng.randrange(0, 30)):
        due, key = rng.choice([0.0, 1.0, rng.uniform(0, 10)]), rng.randrange(1000)
        heap.push(due, key)
        reference.push(due, key)
    now = 0.0
    for _ in range(60):
        now += rng.choice([0.0, rng.uniform(0, 1.5)])
        fired = []
        for key in heap.pop_due(now):
            fired.append(key)
            for due, other in pushes(seed, key, now):
                heap.push(due, other)
        expected = []
        while (key := reference.pop(now)) is not None:
            expected.append(key)
            for due, other in pushes(seed, key, now):
                reference.push(due, other)
        assert fired == expected
        assert len(heap) == len(reference.entries)
        assert heap.next_due() == min(reference.entries, default=(None,))[0]


def test_a_round_left_early_removes_the_entry_it_fired() -> None:
    heap: TimerHeap[str] = TimerHeap()
    heap.push(1.0, "a")
    heap.push(2.0, "b")
    for key in heap.pop_due(5.0):
        assert key == "a"
        break
    assert heap.head() == "b" and len(heap) == 1
    heap.push(3.0, "c")  # a push after the round does not replace anything
    assert len(heap) == 2
