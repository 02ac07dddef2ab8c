"""A worker's memory of the requests it ran lately, by the client's ids (W7, scale0/net/worker.py).

A client whose broker dies resends its request, with the same client id and request id, to
another broker; a worker that moved there too may be handed the request a second time, with a
new ticket. :class:`RecentRequests` recognises it: a request still running here is joined (its
reply goes to the newest ticket), one that finished is answered with the stored reply, and the
handler does not run again. Pure: times are passed in. Bounded in entries, bytes and age.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

__all__ = [
    "RECENT_AGE_S",
    "RECENT_BYTES",
    "RECENT_ENTRIES",
    "Decision",
    "RecentKey",
    "RecentRequests",
]

#: Defaults: how many finished requests, how many reply bytes, and for how long.
RECENT_ENTRIES: Final = 10_000
RECENT_BYTES: Final = 64 << 20
RECENT_AGE_S: Final = 600.0

#: (service, client id, request id)
RecentKey = tuple[str, str, bytes]


class Decision(Enum):
    RUN = "run"  # new: run the handler, then :meth:`RecentRequests.finished`
    JOIN = "join"  # running here already: its reply will go to this ticket too
    REPLAY = "replay"  # ran here already: answer :meth:`RecentRequests.reply_of`


@dataclass(slots=True)
class _Entry:
    tickets: list[bytes] = field(default_factory=list)  # running: who waits for the reply
    status: int = 0
    body: tuple[bytes, ...] = ()
    size: int = 0
    expires: float = 0.0  # finished: when it is forgotten (0: still running)


class RecentRequests:
    """Requests running or answered lately, by :data:`RecentKey`, oldest finished first out."""

    __slots__ = ("_bytes", "_done", "_running", "max_age_s", "max_bytes", "max_entries")

    def __init__(
        self,
        *,
        max_entries: int = RECENT_ENTRIES,
        max_bytes: int = RECENT_BYTES,
        max_age_s: float = RECENT_AGE_S,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._running: dict[RecentKey, _Entry] = {}
        self._done: OrderedDict[RecentKey, _Entry] = OrderedDict()
        self._bytes = 0

    def begin(self, key: RecentKey, ticket: bytes, now: float) -> Decision:
        """A REQUEST with the client's ids arrived under ``ticket``: what to do with it."""
        self._prune(now)
        running = self._running.get(key)
        if running is not None:
            running.tickets.append(ticket)
            return Decision.JOIN
        if key in self._done:
            return Decision.REPLAY
        self._running[key] = _Entry([ticket])
        return Decision.RUN

    def reply_of(self, key: RecentKey) -> tuple[int, tuple[bytes, ...]]:
        """The stored final reply (status, body) of a finished request (after REPLAY)."""
        entry = self._done[key]
        return entry.status, entry.body

    def finished(
        self, key: RecentKey, status: int, body: tuple[bytes, ...], now: float
    ) -> list[bytes]:
        """The handler ended with this reply: remember it; returns the tickets to answer (the
        first, and any that joined it; the newest is the one the current broker knows)."""
        entry = self._running.pop(key, None)
        tickets = entry.tickets if entry is not None else []
        size = sum(map(len, body))
        if size <= self.max_bytes:
            self._done.pop(key, None)
            self._done[key] = _Entry([], status, body, size, now + self.max_age_s)
            self._bytes += size
            while len(self._done) > self.max_entries or self._bytes > self.max_bytes:
                self._drop_oldest()
        return tickets

    def abandoned(self, key: RecentKey) -> None:
        """The handler will not answer (the worker stops): forget that it runs."""
        self._running.pop(key, None)

    def __len__(self) -> int:
        return len(self._running) + len(self._done)

    def _prune(self, now: float) -> None:
        done = self._done
        while done:
            key = next(iter(done))
            if done[key].expires > now:
                return
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _key, entry = self._done.popitem(last=False)
        self._bytes -= entry.size
