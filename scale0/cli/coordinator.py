"""scale0-coordinator: the task coordinator as a worker of the family (docs/tasks.md §9).

``scale0-coordinator --config FILE``. It opens the SQLite store under ``data_dir``, restores
every task, and serves the ``zerotask`` and ``vespid`` services through the broker backend
named by ``endpoint`` (a seed: it fails over to the family's other brokers like any worker, so
every broker of the family reaches it). Each request is decided by scale0.tasks (pure), the
changes are committed in one transaction (one for all the requests handed over in one loop
turn: group commit), and only then is the reply sent. A commit that fails
ends the process at once (exit 70): its memory would be ahead of its store, and a restart
recovers from the store. SIGINT/SIGTERM stop it cleanly (exit 0); a bad config exits 2.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from types import FrameType

import click

from scale0.cli.options import config_option, log_level_option
from scale0.mgmt.taskpage import TaskStatusServer
from scale0.net.logs import configure, log_event
from scale0.net.worker import Worker
from scale0.tasks import vespid, zerotask
from scale0.tasks.auth import Authorizer
from scale0.tasks.book import Book
from scale0.tasks.messages import Changes
from scale0.tasks.model import trend_state
from scale0.tasks.report import report
from scale0.tasks.settings import ConfigFileError, CoordinatorConfig, load_coordinator
from scale0.tasks.store import SQLiteStore, Store, StoreError
from scale0.trend.eventlog import EventLogWriter

__all__ = ["Coordinator", "main"]

log = logging.getLogger("scale0.coordinator")

EXIT_STORE_FAILED = 70


#: The name a coordinator's records carry in the event log's ``broker`` field and directory.
EVENT_LOG_NAME = "coordinator"


def record_transitions(events: EventLogWriter, changes: Changes, ts_ms: int) -> None:
    """One ``task`` record per committed change of a task's state (docs/trend.md), written
    only after the commit, so the log never shows a state the store could lose."""
    for before, after in changes.transitions:
        state = trend_state(after)
        previous = trend_state(before) if before is not None else None
        if state == previous:
            continue  # waiting -> pending are both "queued" to the trending job
        fields: dict[str, object] = {"task_id": after.name, "state": state}
        if previous is not None:
            fields["prev_state"] = previous
        events.event("task", ts_ms, **fields)


class Coordinator:
    """The Book, its store and the node wake-ups, behind two async request handlers."""

    #: The Book it decides with (SharedCoordinator: scale0.tasks.shared.SharedBook).
    book_type: type[Book] = Book

    def __init__(self, config: CoordinatorConfig, store: Store) -> None:
        self.config = config
        self.store = store
        snapshot = self.store.load()
        self.book = self.book_type(lambda: uuid.uuid4().hex, config.settings, snapshot, time.time())
        #: Parked waits (zerotask Z5) by what wakes them, ``node:NAME`` or ``task:NAME``; an
        #: event is dropped once set, so one found here has not fired yet.
        self._wake: dict[str, asyncio.Event] = {}
        #: How many requests wait on each key of ``_wake`` (a key nobody waits on is dropped).
        self._waiting: dict[str, int] = {}
        self._flush: asyncio.Future[None] | None = None
        self.stats = {"batches": 0}
        if config.admins is not None:
            self.book.authorizer = Authorizer(config.admins, config.submit_roles)
        else:  # A4
            log_event(log, logging.WARNING, "task_submissions_open", {"hint": "admins_from"})
        counts = self.book.counts()
        log_event(log, logging.INFO, "coordinator_restored", counts)
        #: /metrics and the status page (docs/tasks.md §11.2), when the config asks for them.
        self.http: TaskStatusServer | None = None
        if config.http_port is not None:
            self.http = TaskStatusServer(
                lambda: report(self.book), config.http_address, config.http_port
            )
        #: Every task transition, for the trending job (docs/trend.md), when configured.
        self.events: EventLogWriter | None = None
        if config.event_log_dir is not None:
            self.events = EventLogWriter(config.event_log_dir, broker=EVENT_LOG_NAME).start()
        self.worker = Worker(
            config.endpoint,
            {
                config.zerotask_service: self.serve_zerotask,
                config.vespid_service: self.serve_vespid,
            },
            capacity=config.capacity,
            heartbeat_interval=config.heartbeat_interval_s,
        )

    def commit(self) -> None:
        """Write what changed in one transaction (D1), then wake the nodes that have news."""
        changes = self.book.take_changes()
        self.stats["batches"] += 1
        try:
            self.store.commit(changes)
        except Exception:
            log_event(log, logging.CRITICAL, "store_commit_failed", exc_info=True)
            os._exit(EXIT_STORE_FAILED)
        if self.events is not None and changes.transitions:
            record_transitions(self.events, changes, time.time_ns() // 1_000_000)
        parked = {key[5:] for key in self._waiting if key.startswith("node:")}
        for key in self.book.woken(time.time(), parked):
            event = self._wake.pop(key, None)  # its waiters hold it; a later wait makes anew
            if event is not None:
                event.set()

    async def committed(self) -> None:
        """Wait until what this request changed is committed (group commit: every request the
        worker handed over in one loop turn shares one transaction and one fsync)."""
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.create_future()
            loop.call_soon(self._flush_now)
        await asyncio.shield(self._flush)

    def _flush_now(self) -> None:
        flush, self._flush = self._flush, None
        self.commit()
        if flush is not None and not flush.done():
            flush.set_result(None)

    async def serve_zerotask(self, body: list[bytes]) -> bytes:
        outcome = zerotask.handle(self.book, b"".join(body), time.time())
        wait = outcome.poll
        if wait is None:
            await self.committed()
            return outcome.reply or b""
        # Armed before the commit: news committed after this point wakes us (Book.woken).
        key = wait.key
        event = self._wake.get(key)
        if event is None:
            event = self._wake[key] = asyncio.Event()
        self._waiting[key] = self._waiting.get(key, 0) + 1
        woken = True
        try:
            if wait.kind == "node":  # a node_poll records the node as heard: commit that first
                await self.committed()
            async with asyncio.timeout(wait.wait_s):
                await event.wait()
        except TimeoutError:
            woken = False
        finally:
            left = self._waiting[key] - 1
            if left:
                self._waiting[key] = left
            else:
                del self._waiting[key]
                if self._wake.get(key) is event:
                    del self._wake[key]  # timed out, and nobody else waits on it
        reply = zerotask.finish_poll(self.book, wait, time.time())
        # A node's answer may carry changes (announcements, resends); a task's answer after its
        # wake-up reads what that commit stored, after a timeout what this turn may still hold.
        if wait.kind == "node" or not woken:
            await self.committed()
        return reply

    async def serve_vespid(self, body: list[bytes]) -> bytes:
        outcome = vespid.handle(self.book, b"".join(body), time.time())
        await self.committed()
        return outcome.reply or b""

    async def ticker(self) -> None:
        """B3 and periodic node status, every ``tick_s``."""
        while True:
            await asyncio.sleep(self.config.tick_s)
            self.book.tick(time.time())
            self.commit()

    async def run_async(self) -> None:
        ticker = asyncio.get_running_loop().create_task(self.ticker())
        if self.http is not None:
            self.http.serve()
        log_event(
            log,
            logging.INFO,
            "coordinator_ready",
            {"endpoint": self.config.endpoint, "pid": os.getpid()},
        )
        try:
            await self.worker.run_async()
        finally:
            ticker.cancel()
            if self.http is not None:
                self.http.stop()
            log_event(log, logging.INFO, "coordinator_stopped", self.stats)
            self.store.close()
            if self.events is not None:
                self.events.close()


@click.command(name="scale0-coordinator")
@config_option("The coordinator's YAML or JSON config (docs/tasks.md §9).")
@log_level_option()
def main(config_path: Path, log_level: str) -> None:
    """Serve the zerotask and vespid services of the task coordinator until SIGINT/SIGTERM."""
    configure(log_level)
    stopping = threading.Event()
    coordinator: Coordinator | None = None

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        if coordinator is not None:
            coordinator.worker.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        config = load_coordinator(config_path)
        store = open_store(config)
        if config.database is None:
            coordinator = Coordinator(config, store)
        else:  # several may serve one database at once (docs/tasks.md §7.2)
            from scale0.cli.coordinator_shared import SharedCoordinator  # noqa: PLC0415

            coordinator = SharedCoordinator(config, store)  # type: ignore[arg-type]
        if coordinator.http is not None:
            try:
                url = coordinator.http.listen()
            except OSError as exc:
                store.close()
                where = f"{config.http_address}:{config.http_port}"
                raise ConfigFileError(
                    f"{config_path}: http_port: cannot listen on {where}: {exc.strerror or exc}"
                ) from None
            log_event(log, logging.INFO, "coordinator_http", {"url": url})
    except (ConfigFileError, StoreError) as exc:
        click.echo(f"scale0-coordinator: {exc}", err=True)
        sys.exit(2)
    if stopping.is_set():
        store.close()
        return
    asyncio.run(coordinator.run_async())


def open_store(config: CoordinatorConfig) -> Store:
    """SQLite under data_dir, or PostgreSQL (shared with any other coordinator, §7.2)."""
    if config.database is None:
        return SQLiteStore(config.data_dir / "tasks.db")
    try:  # psycopg is only needed here (the "postgresql" extra)
        from scale0.tasks.pgstore import PostgresStore  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigFileError(
            "database: the PostgreSQL store needs psycopg 3 "
            f"(pip install 'scale0[postgresql]'): {exc}"
        ) from None
    return PostgresStore(config.database)
