"""The store interface and the SQLite store: every task, node, client and refusal, durably.

Rules (docs/tasks.md §7; tests/tasks/test_store.py asserts each, also with real processes
killed mid-write):

D1  ``commit(changes)`` writes the changes it is given (one operation's, or those of every
    operation the coordinator handled in one loop turn) in ONE transaction: all of it is
    stored or none of it. The coordinator answers only after it returned.
D2  SQLite runs in WAL mode with ``synchronous=FULL``: a commit that returned survives a crash
    of the process (and of the machine, as far as fsync does).
D3  ``load()`` returns everything committed; a process killed at any moment restarts with every
    task, result, error, node, client and refusal that was committed before it died.
D4  Records are stored as JSON text of their ``to_json`` form, keyed by name; the refusal log is
    append-only.
D5  A store file written by a newer schema is refused (StoreError), never half-read.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Final, Protocol

from scale0.tasks.messages import Changes, Snapshot
from scale0.tasks.model import NodeRecord, TaskRecord

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "Store", "StoreError"]

SCHEMA_VERSION: Final = 1

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (name TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients (client_id TEXT PRIMARY KEY, time_connect REAL NOT NULL);
CREATE TABLE IF NOT EXISTS refusals (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    task TEXT NOT NULL,
    data TEXT NOT NULL
);
"""


class StoreError(RuntimeError):
    """The store cannot be opened or read (names the file)."""


class Store(Protocol):
    """What the coordinator needs from a store (SQLite today; PostgreSQL fits the same shape)."""

    def load(self) -> Snapshot:
        """Everything committed (D3)."""
        ...

    def commit(self, changes: Changes) -> None:
        """One operation's changes in one transaction (D1)."""
        ...

    def refusals(self, task: str | None = None) -> list[dict[str, Any]]:
        """The refusal log (F3), oldest first; only ``task``'s when given."""
        ...

    def close(self) -> None: ...


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class SQLiteStore:
    """The default store: one SQLite file in WAL mode (D1-D5)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, one per commit() (D1).
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row[0]) > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema {row[0]} is newer than this coordinator's "
                    f"{SCHEMA_VERSION}"
                )
        except (sqlite3.Error, OSError, ValueError) as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    def load(self) -> Snapshot:
        try:
            tasks = tuple(
                TaskRecord.from_json(json.loads(data))
                for (data,) in self._db.execute("SELECT data FROM tasks ORDER BY rowid")
            )
            nodes = tuple(
                NodeRecord.from_json(json.loads(data))
                for (data,) in self._db.execute("SELECT data FROM nodes ORDER BY name")
            )
            clients = dict(self._db.execute("SELECT client_id, time_connect FROM clients"))
            (refused,) = self._db.execute("SELECT count(*) FROM refusals").fetchone()
        except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{self.path}: cannot read: {exc}") from exc
        return Snapshot(tasks, nodes, clients, int(refused))

    def commit(self, changes: Changes) -> None:
        if not changes:
            return
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT INTO tasks (name, data) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET data=excluded.data",
                [(name, _dump(task.to_json())) for name, task in changes.tasks.items()],
            )
            for name, node in changes.nodes.items():
                if node is None:
                    db.execute("DELETE FROM nodes WHERE name=?", (name,))
                else:
                    db.execute(
                        "INSERT INTO nodes (name, data) VALUES (?, ?) "
                        "ON CONFLICT(name) DO UPDATE SET data=excluded.data",
                        (name, _dump(node.to_json())),
                    )
            for client_id, since in changes.clients.items():
                if since is None:
                    db.execute("DELETE FROM clients WHERE client_id=?", (client_id,))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO clients (client_id, time_connect) VALUES (?, ?)",
                        (client_id, since),
                    )
            db.executemany(
                "INSERT INTO refusals (time, task, data) VALUES (?, ?, ?)",
                [(r["time"], r["task"], _dump(r)) for r in changes.refusals],
            )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def refusals(self, task: str | None = None) -> list[dict[str, Any]]:
        if task is None:
            rows = self._db.execute("SELECT data FROM refusals ORDER BY id")
        else:
            rows = self._db.execute("SELECT data FROM refusals WHERE task=? ORDER BY id", (task,))
        return [json.loads(data) for (data,) in rows]

    def close(self) -> None:
        self._db.close()
