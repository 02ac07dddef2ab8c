"""One heap for every timer of a broker: heartbeat rounds, expiry, request deadlines, sweeps.

Entries are never removed; an entry carries the generation of what it watches, and a fired entry
whose generation is stale is ignored. So rescheduling is a push. Liveness does not use an entry
per connection: one sweep entry expires silent sessions and one round entry per slot (a tenth)
of each heartbeat interval beats the workers (docs/performance.md, "Liveness"), so a thousand
idle connections cost the heap nothing.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from enum import Enum
from typing import Generic, NamedTuple, NewType, TypeVar

from scale0.core.effects import Channel

K = TypeVar("K")


class TimerHeap(Generic[K]):
    """A min-heap of (due, key) with lazy deletion by the caller."""

    __slots__ = ("_counter", "_firing", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, K]] = []
        self._counter = itertools.count()  # ties fire in the order they were scheduled
        # True while pop_due has yielded the head's key and not removed the entry yet: the
        # first push in that time replaces it (one sift instead of a pop's and a push's; a
        # heartbeat or expiry timer that fires re-arms itself, thousands of times a second).
        self._firing = False

    def push(self, due: float, key: K) -> None:
        if self._firing:
            self._firing = False
            heapq.heapreplace(self._heap, (due, next(self._counter), key))
        else:
            heapq.heappush(self._heap, (due, next(self._counter), key))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def head(self) -> K | None:
        """The key of the earliest entry (None when empty)."""
        return self._heap[0][2] if self._heap else None

    def drop_head(self) -> None:
        """Remove the earliest entry without firing it (its owner knows it is stale)."""
        heapq.heappop(self._heap)

    def pop_due(self, now: float) -> Iterator[K]:
        """Yield the keys due at ``now``, earliest first (new pushes for now are yielded too)."""
        heap = self._heap
        try:
            while heap and heap[0][0] <= now:
                self._firing = True
                yield heap[0][2]
                if self._firing:  # not replaced by a push: remove it
                    self._firing = False
                    heapq.heappop(heap)
        finally:
            if self._firing:  # the consumer stopped (or raised) while the head was firing
                self._firing = False
                heapq.heappop(heap)

    def __len__(self) -> int:
        return len(self._heap)


# ---- what a broker's timers watch (scale0.core.broker) ---------------------------------------


#: A request's deadline (R6, R9): the request's own number (``Pending.seq``) among those the
#: broker holds, so arming one for every request allocates nothing (docs/performance.md).
RequestDue = NewType("RequestDue", int)


class ExpiryDue(NamedTuple):
    """The liveness sweep (R8): when the longest-silent client or worker session would expire.

    One entry for all sessions (scale0/core/sessions.py keeps them in order of silence, so the
    sweep looks only at those that are due); ``at`` tells the live entry from one superseded by
    an earlier arming.
    """

    at: float


class BeatRound(NamedTuple):
    """The broker's HEARTBEATs to the workers of one enforced interval (R11) whose beats fall in
    one of its BEAT_SLOTS slots: one entry per slot in use, re-armed every interval while any
    worker is in it (a coarse timing wheel; scale0/core/dispatch.py). ``promise_s`` not 0: the
    idle workers of that interval that promised to beat every ``promise_s`` (§3.4), beaten at
    that period instead, each beat saying it as ``interval_ms``."""

    interval_s: float
    slot: int
    promise_s: float = 0.0

    @property
    def period_s(self) -> float:
        return self.promise_s or self.interval_s


#: Slots per heartbeat interval: the broker's beats to workers go out in at most this many
#: rounds per interval (not all in one burst, not one timer per worker).
BEAT_SLOTS = 10


class ConnDue(NamedTuple):
    """A connection's time to negotiate ends (R20); ``gen`` tells it from a reused number's."""

    channel: Channel
    conn: int
    gen: int


class Periodic(Enum):
    """The broker's own rounds: one entry each in the heap, re-armed when it fires."""

    SWEEP = "sweep"  # forget old error scores, bans, cached replies; sample history
    PEERS = "peers"  # expire silent peers, HELLO or HEARTBEAT on every link (F1, F3)
    TABLE = "table"  # commit the worker changes gathered into one table version (F5)
    REPUBLISH = "republish"  # a config source publishes its config again (F11)
    GOSSIP = "gossip"  # half an interval after a probe: PINGREQ if no ACK came (G4)


TimerKey = RequestDue | ExpiryDue | BeatRound | ConnDue | Periodic
