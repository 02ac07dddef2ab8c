"""The broker's request metrics: replies by status, latency histograms per service, and history.

Pure bookkeeping, fed by the core when a request gets its final answer (``observe``) and on the
sweep timer (``maybe_sample``); read by the ``status`` management command and by ``/metrics``
(scale0/mgmt/metrics.py renders the Prometheus text). Memory is bounded: at most
``MAX_SERVICES`` services get their own histogram (the rest share ``OTHER_SERVICE``), and the
history keeps ``HISTORY_SAMPLES`` samples.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

#: Upper bounds (seconds) of the latency histogram buckets; +Inf is implied.
LATENCY_BUCKETS_S: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: Services with a histogram of their own; later ones are counted under OTHER_SERVICE.
MAX_SERVICES: Final = 1000
OTHER_SERVICE: Final = "(other)"
#: One history sample every SAMPLE_INTERVAL_S, HISTORY_SAMPLES of them (10 minutes).
SAMPLE_INTERVAL_S: Final = 5.0
HISTORY_SAMPLES: Final = 120


@dataclass(slots=True)
class Histogram:
    """Cumulative-friendly latency histogram: per-bucket counts (last = +Inf), sum and count."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    sum_s: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds
        self.count += 1

    def cumulative(self) -> list[int]:
        """Counts of observations <= each bound, +Inf last (Prometheus ``le`` buckets)."""
        total = 0
        out = []
        for n in self.counts:
            total += n
            out.append(total)
        return out

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding the q-quantile (None when empty or in +Inf)."""
        if self.count == 0:
            return None
        rank = q * self.count
        for bound, seen in zip(LATENCY_BUCKETS_S, self.cumulative(), strict=False):
            if seen >= rank:
                return bound
        return None


@dataclass(slots=True)
class ServiceMetrics:
    """One service: final answers by status and their latency (request in to answer out)."""

    replies: dict[int, int] = field(default_factory=dict)
    latency: Histogram = field(default_factory=Histogram)


class Metrics:
    """All request metrics of one broker."""

    __slots__ = ("_next_sample", "history", "replies", "services")

    def __init__(self) -> None:
        self.replies: dict[int, int] = {}
        self.services: dict[str, ServiceMetrics] = {}
        self.history: deque[dict[str, float]] = deque(maxlen=HISTORY_SAMPLES)
        self._next_sample: float | None = None

    def reply(self, status: int) -> None:
        """A final answer the broker gave without a service's worker (404, cache hit, ...)."""
        self.replies[status] = self.replies.get(status, 0) + 1

    def observe(self, service: str, status: int, seconds: float) -> None:
        """A request of ``service`` got its final answer ``status`` after ``seconds``."""
        replies = self.replies
        replies[status] = replies.get(status, 0) + 1  # self.reply(status), inline
        stats = self.services.get(service)
        if stats is None:
            if len(self.services) >= MAX_SERVICES:
                service = OTHER_SERVICE
            stats = self.services.setdefault(service, ServiceMetrics())
        stats.replies[status] = stats.replies.get(status, 0) + 1
        latency = stats.latency  # latency.observe(seconds), inline: the hot path
        seconds = max(0.0, seconds)
        latency.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        latency.sum_s += seconds
        latency.count += 1

    def merge(self, service: str, status: int, counts: Sequence[int], sum_s: float) -> None:
        """Answers of ``service`` observed elsewhere (the C lane), as one histogram's bucket
        ``counts`` (one per LATENCY_BUCKETS_S bound, +Inf last) and their latencies' sum:
        the same as an ``observe`` for each."""
        if len(counts) != len(LATENCY_BUCKETS_S) + 1:
            raise ValueError(f"{len(counts)} bucket counts, not {len(LATENCY_BUCKETS_S) + 1}")
        count = sum(counts)
        if not count:
            return
        replies = self.replies
        replies[status] = replies.get(status, 0) + count
        stats = self.services.get(service)
        if stats is None:
            if len(self.services) >= MAX_SERVICES:
                service = OTHER_SERVICE
            stats = self.services.setdefault(service, ServiceMetrics())
        stats.replies[status] = stats.replies.get(status, 0) + count
        latency = stats.latency
        for index, n in enumerate(counts):
            latency.counts[index] += n
        latency.sum_s += sum_s
        latency.count += count

    def totals(self) -> dict[str, float]:
        """Cumulative counts over every service: replies, errors (status >= 400), latency."""
        latency_sum = sum(s.latency.sum_s for s in self.services.values())
        latency_count = sum(s.latency.count for s in self.services.values())
        return {
            "replies": sum(self.replies.values()),
            "errors": sum(n for status, n in self.replies.items() if status >= 400),
            "latency_sum_s": latency_sum,
            "latency_count": latency_count,
        }

    def maybe_sample(self, now: float, wall: float, gauges: dict[str, float]) -> None:
        """Append a history sample if SAMPLE_INTERVAL_S passed since the last one."""
        if self._next_sample is not None and now < self._next_sample:
            return
        self._next_sample = now + SAMPLE_INTERVAL_S
        self.history.append({"time": wall, **self.totals(), **gauges})
