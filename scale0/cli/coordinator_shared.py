"""scale0-coordinator on PostgreSQL: one of several coordinators serving one store at once.

docs/tasks.md §7.2. The store's rules are G1-G5 of scale0.tasks.pgstore, the Book's M1-M4 of
scale0.tasks.shared; this module runs them: groups of decisions, each in one transaction,
decided again when the store refuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from scale0.cli.coordinator import EXIT_STORE_FAILED, Coordinator, log, record_transitions
from scale0.net.logs import log_event
from scale0.tasks import vespid, zerotask
from scale0.tasks.messages import Changes
from scale0.tasks.pgstore import Conflict, PostgresStore
from scale0.tasks.settings import CoordinatorConfig
from scale0.tasks.shared import SharedBook

__all__ = [
    "MAX_TRIES",
    "OPTIMISTIC_TRIES",
    "Group",
    "SharedCoordinator",
    "TooManyConflicts",
    "decide_group",
]

T = TypeVar("T")

#: A group refused this many times (G2) is decided alone the next time (G4).
OPTIMISTIC_TRIES = 3
#: ... and one refused this many times in all ends the process (exit 70): a bug, not a race.
MAX_TRIES = 10
#: How often the counts of groups and conflicts are logged (when they changed).
STATS_INTERVAL_S = 5.0

Decision = Callable[[SharedBook, float], T]


class TooManyConflicts(RuntimeError):
    """A group refused MAX_TRIES times (even decided alone): a bug, not a race."""


@dataclass(slots=True)
class Group:
    """What deciding a group gave: one (ok, value or exception) per decision, the changes
    committed, how many times the store refused it and whether it was decided alone."""

    outcomes: list[tuple[bool, Any]]
    changes: Changes
    conflicts: int
    exclusive: bool


def decide_group(
    book: SharedBook,
    store: PostgresStore,
    decisions: Sequence[Decision[Any]],
    count_refusals: bool = False,
    clock: Callable[[], float] = time.time,
) -> Group:
    """Decide ``decisions`` in order, in one transaction, until the store takes them (G2-G4,
    M1-M2). Store errors other than a Conflict propagate (the caller ends the process)."""
    conflicts = 0
    while True:
        exclusive = conflicts >= OPTIMISTIC_TRIES
        now = clock()
        fresh = store.begin(exclusive, count_refusals)
        book.absorb(fresh.tasks, fresh.nodes, fresh.clients, fresh.seen, now)
        if fresh.refusals is not None:
            book.refusals_total = fresh.refusals
        checkpoint = book.checkpoint()
        outcomes: list[tuple[bool, Any]] = []
        for decision in decisions:
            try:
                outcomes.append((True, decision(book, now)))
            except Exception as exc:  # a bug: that request fails, the others go on
                log.exception("decision failed")
                outcomes.append((False, exc))
        changes = book.take_changes()
        touched_tasks, touched_nodes = book.take_touched()
        try:
            store.commit(changes, touched_tasks, touched_nodes, book.last_heard())
        except Conflict as conflict:
            conflicts += 1
            log_event(
                log,
                logging.DEBUG,
                "coordinator_conflict",
                {"what": conflict.what[:5], "conflicts": conflicts},
            )
            if conflicts >= MAX_TRIES:
                raise TooManyConflicts(f"a group was refused {conflicts} times") from conflict
            rows = store.reread(
                set(changes.tasks) | touched_tasks,
                set(changes.nodes) | touched_nodes,
                changes.clients,
            )
            book.rollback(checkpoint, rows.tasks, rows.nodes, rows.clients, clock())
            continue
        return Group(outcomes, changes, conflicts, exclusive)


class SharedCoordinator(Coordinator):
    """One of several coordinators serving one PostgreSQL store at once (docs/tasks.md §7.2).

    Requests are decided in groups (every request the worker handed over in one loop turn),
    each in one transaction: take in what the others committed (G3, M1), decide, commit with
    every row fenced by its version (G2). When the store refuses the group (Conflict), the
    Book is put back (M2) and the whole group decided again on the fresh rows; after
    OPTIMISTIC_TRIES refusals it is decided under the exclusive lock (G4). Replies leave only
    after their group committed, so a request is answered as decided once, whatever was
    decided and thrown away before.
    """

    book_type = SharedBook

    def __init__(self, config: CoordinatorConfig, store: PostgresStore) -> None:
        super().__init__(config, store)
        self.pg = store
        self.shared: SharedBook = self.book  # type: ignore[assignment]
        self._group: list[tuple[Decision[Any], asyncio.Future[Any]]] = []
        self.stats.update(requests=0, conflicts=0, exclusive=0)

    async def decide(self, decision: Decision[T]) -> T:
        """``decision(book, now)`` in the next group; its value once the group committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.stats["requests"] += 1
        if not self._group:
            loop.call_soon(self._run_group)
        self._group.append((decision, future))
        return await future

    def _run_group(self, count_refusals: bool = False) -> None:
        entries, self._group = self._group, []
        try:
            group = decide_group(self.shared, self.pg, [d for d, _ in entries], count_refusals)
        except Exception:
            log_event(log, logging.CRITICAL, "store_commit_failed", exc_info=True)
            os._exit(EXIT_STORE_FAILED)
        self.stats["batches"] += 1
        self.stats["conflicts"] += group.conflicts
        self.stats["exclusive"] += group.exclusive
        for (ok, value), (_, future) in zip(group.outcomes, entries, strict=True):
            if isinstance(value, zerotask.Outcome) and value.poll is not None:
                # armed before the wake-ups below: news from this group on wakes it
                self._wake.setdefault(value.poll.key, asyncio.Event()).clear()
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        self._after_commit(group.changes)

    def _after_commit(self, changes: Changes) -> None:
        if self.events is not None and changes.transitions:
            record_transitions(self.events, changes, time.time_ns() // 1_000_000)
        for key in self.book.woken(time.time()):
            event = self._wake.get(key)
            if event is not None:
                event.set()

    async def serve_zerotask(self, body: list[bytes]) -> bytes:
        data = b"".join(body)
        outcome = await self.decide(lambda book, now: zerotask.handle(book, data, now))
        wait = outcome.poll
        if wait is None:
            return outcome.reply or b""
        event = self._wake.setdefault(wait.key, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait.wait_s)
        return await self.decide(lambda book, now: zerotask.finish_poll(book, wait, now))

    async def serve_vespid(self, body: list[bytes]) -> bytes:
        data = b"".join(body)
        outcome = await self.decide(lambda book, now: vespid.handle(book, data, now))
        return outcome.reply or b""

    async def ticker(self) -> None:
        """B3, M4 and periodic node status, every ``tick_s``, as one decision of a group;
        the refusal count is read from the store then (others refuse reports too). Every
        STATS_INTERVAL_S the counts of groups and conflicts are logged (``coordinator_stats``),
        when they changed."""
        loop = asyncio.get_running_loop()
        logged: dict[str, int] = {}
        next_stats = time.monotonic() + STATS_INTERVAL_S
        while True:
            await asyncio.sleep(self.config.tick_s)
            future: asyncio.Future[None] = loop.create_future()
            if not self._group:
                loop.call_soon(self._run_group, True)
            self._group.append((lambda book, now: book.tick(now), future))
            await future
            if time.monotonic() >= next_stats:
                next_stats = time.monotonic() + STATS_INTERVAL_S
                if self.stats != logged:
                    logged = dict(self.stats)
                    log_event(
                        log, logging.INFO, "coordinator_stats", {"pid": os.getpid(), **logged}
                    )
