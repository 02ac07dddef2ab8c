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
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
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
from scale0.tasks.report import report
from scale0.tasks.settings import ConfigFileError, CoordinatorConfig, load_coordinator
from scale0.tasks.store import SQLiteStore, Store, StoreError

__all__ = ["Coordinator", "main"]

log = logging.getLogger("scale0.coordinator")

EXIT_STORE_FAILED = 70


class Coordinator:
    """The Book, its store and the node wake-ups, behind two async request handlers."""

    def __init__(self, config: CoordinatorConfig, store: Store) -> None:
        self.config = config
        self.store = store
        snapshot = self.store.load()
        self.book = Book(lambda: uuid.uuid4().hex, config.settings, snapshot, time.time())
        self._wake: dict[str, asyncio.Event] = {}
        #: The batch collecting changes now, whether one is being written, the writer thread.
        self._open: asyncio.Future[None] | None = None
        self._writing = False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="scale0-store")
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
        self.worker = Worker(
            config.endpoint,
            {
                config.zerotask_service: self.serve_zerotask,
                config.vespid_service: self.serve_vespid,
            },
            capacity=config.capacity,
            heartbeat_interval=config.heartbeat_interval_s,
        )

    def _write(self, changes: Changes) -> None:
        """Write one batch in one transaction (D1), in the writer thread; a failure ends the
        process at once (exit 70): nothing of this batch has been answered yet."""
        try:
            self.store.commit(changes)
        except Exception:
            log_event(log, logging.CRITICAL, "store_commit_failed", exc_info=True)
            os._exit(EXIT_STORE_FAILED)

    async def committed(self) -> None:
        """Wait until everything this request changed (and everything before it) is committed.

        Group commit, pipelined: the requests handled while no write is under way share the
        next transaction (one fsync); while one is being written (in the writer thread, so the
        loop keeps deciding), the requests that arrive form the next one, written as soon as
        the first returns. Batches are written one at a time and in order, and a request
        waits for the batch still open when it asks (so for every change it may have seen),
        so no reply reveals anything that is not on disk (D1)."""
        if self._open is None:
            self._open = asyncio.get_running_loop().create_future()
            if not self._writing:
                asyncio.get_running_loop().call_soon(self._start_write)
        await asyncio.shield(self._open)

    def _start_write(self) -> None:
        batch, self._open = self._open, None
        if batch is None or self._writing:
            self._open = batch
            return
        self._writing = True
        changes = self.book.take_changes()
        done = asyncio.get_running_loop().run_in_executor(self._writer, self._write, changes)
        done.add_done_callback(lambda _: self._written(batch))

    def _written(self, batch: asyncio.Future[None]) -> None:
        """A batch is on disk: answer its requests, wake the parked polls that have news (they
        answer after the batch then open, D1), and start writing the next batch."""
        self._writing = False
        self.stats["batches"] += 1
        if not batch.done():
            batch.set_result(None)
        for key in self.book.woken(time.time()):
            event = self._wake.get(key)
            if event is not None:
                event.set()
        if self._open is not None:
            self._start_write()

    async def serve_zerotask(self, body: list[bytes]) -> bytes:
        outcome = zerotask.handle(self.book, b"".join(body), time.time())
        wait = outcome.poll
        if wait is not None:  # armed before the commit: news after this point wakes us
            event = self._wake.setdefault(wait.key, asyncio.Event())
            event.clear()
        await self.committed()
        if wait is None:
            return outcome.reply or b""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait.wait_s)
        reply = zerotask.finish_poll(self.book, wait, time.time())
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
            await self.committed()

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
            self._writer.shutdown(wait=True)  # a batch being written ends first
            log_event(log, logging.INFO, "coordinator_stopped", self.stats)
            self.store.close()


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
        store = open_store(config, stopping)
        if store is None:
            return
        coordinator = Coordinator(config, store)
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


def open_store(config: CoordinatorConfig, stopping: threading.Event) -> Store | None:
    """SQLite under data_dir, or PostgreSQL once this coordinator holds the lease (G2).

    None when a signal came while waiting for the lease.
    """
    if config.database is None:
        return SQLiteStore(config.data_dir / "tasks.db")
    try:  # psycopg is only needed here (the "postgresql" extra)
        from scale0.tasks.pgstore import PostgresStore  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigFileError(
            "database: the PostgreSQL store needs psycopg 3 "
            f"(pip install 'scale0[postgresql]'): {exc}"
        ) from None

    store = PostgresStore(config.database)
    if not store.try_acquire():
        log_event(log, logging.INFO, "coordinator_standby", {"pid": os.getpid()})
        while not store.acquire(timeout_s=0.5):
            if stopping.is_set():
                store.close()
                return None
    log_event(log, logging.INFO, "coordinator_lease", {"pid": os.getpid()})
    return store
