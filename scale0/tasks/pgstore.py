"""The PostgreSQL store (psycopg 3): the same interface as SQLite, plus the coordinator lease.

Rules (docs/tasks.md §7.2; the store tests run against it too):

G1  D1, D3 and D4 of scale0.tasks.store hold unchanged: one ``commit`` is one transaction
    (READ COMMITTED, synchronous commit), ``load`` returns everything committed.
G2  Several coordinators may point at one database for availability. Exactly one of them is
    **active**: the one holding the session advisory lock LEASE_KEY on its store connection.
    The others wait in :meth:`PostgresStore.acquire` and do not join the family until they
    hold it, so no task runs twice while both are up.
G3  The lease and the writes share one connection: when the active coordinator dies (even
    SIGKILL) or loses the database, its session ends, PostgreSQL releases the lock and one
    standby takes over from what was committed. A coordinator whose connection broke cannot
    commit again (its commit fails and it exits), so two can never both write.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

import psycopg

from scale0.tasks.messages import Changes, Snapshot
from scale0.tasks.model import NodeRecord, TaskRecord
from scale0.tasks.store import SCHEMA_VERSION, StoreError

__all__ = ["LEASE_KEY", "PostgresStore"]

#: The advisory lock key of the coordinator lease (an arbitrary constant: "S0TASKS").
LEASE_KEY: Final = 0x5330_5441_534B_53

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS scale0_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS scale0_tasks ("
    " seq BIGSERIAL, name TEXT PRIMARY KEY, data JSONB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS scale0_nodes (name TEXT PRIMARY KEY, data JSONB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS scale0_clients ("
    " client_id TEXT PRIMARY KEY, time_connect DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS scale0_refusals ("
    " id BIGSERIAL PRIMARY KEY, time DOUBLE PRECISION NOT NULL, task TEXT NOT NULL,"
    " data JSONB NOT NULL)",
)


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class PostgresStore:
    """A store in one PostgreSQL database (``conninfo`` as psycopg takes it)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        try:
            self._db = psycopg.connect(conninfo, autocommit=True)
            with self._db.transaction():
                # Two coordinators creating the schema at once must not collide.
                self._db.execute("SELECT pg_advisory_xact_lock(%s)", (LEASE_KEY + 1,))
                for statement in _SCHEMA:
                    self._db.execute(statement)
                row = self._db.execute(
                    "SELECT value FROM scale0_meta WHERE key='schema'"
                ).fetchone()
                if row is None:
                    self._db.execute(
                        "INSERT INTO scale0_meta (key, value) VALUES ('schema', %s)",
                        (str(SCHEMA_VERSION),),
                    )
                elif int(row[0]) > SCHEMA_VERSION:
                    raise StoreError(
                        f"{_where(conninfo)}: schema {row[0]} is newer than this "
                        f"coordinator's {SCHEMA_VERSION}"
                    )
        except psycopg.Error as exc:
            raise StoreError(f"{_where(conninfo)}: {exc}") from exc

    # ---- the lease (G2, G3) ----

    def try_acquire(self) -> bool:
        """Take the coordinator lease if it is free (never blocks)."""
        row = self._db.execute("SELECT pg_try_advisory_lock(%s)", (LEASE_KEY,)).fetchone()
        return bool(row and row[0])

    def acquire(self, timeout_s: float, poll_s: float = 0.2) -> bool:
        """Wait up to ``timeout_s`` for the lease (G2); True once it is ours."""
        limit = time.monotonic() + timeout_s
        while True:
            if self.try_acquire():
                return True
            if time.monotonic() >= limit:
                return False
            time.sleep(poll_s)

    # ---- the Store interface ----

    def load(self) -> Snapshot:
        try:
            with self._db.transaction():
                tasks = tuple(
                    TaskRecord.from_json(data)
                    for (data,) in self._db.execute("SELECT data FROM scale0_tasks ORDER BY seq")
                )
                nodes = tuple(
                    NodeRecord.from_json(data)
                    for (data,) in self._db.execute("SELECT data FROM scale0_nodes ORDER BY name")
                )
                clients = {
                    str(client): float(since)
                    for client, since in self._db.execute(
                        "SELECT client_id, time_connect FROM scale0_clients"
                    )
                }
                row = self._db.execute("SELECT count(*) FROM scale0_refusals").fetchone()
        except (psycopg.Error, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{_where(self.conninfo)}: cannot read: {exc}") from exc
        return Snapshot(tasks, nodes, clients, int(row[0]) if row else 0)

    def commit(self, changes: Changes) -> None:
        if not changes:
            return
        db = self._db
        with db.transaction(), db.cursor() as cursor:
            if changes.tasks:
                cursor.executemany(
                    "INSERT INTO scale0_tasks (name, data) VALUES (%s, %s::jsonb) "
                    "ON CONFLICT (name) DO UPDATE SET data = excluded.data",
                    [(name, _dump(task.to_json())) for name, task in changes.tasks.items()],
                )
            for name, node in changes.nodes.items():
                if node is None:
                    cursor.execute("DELETE FROM scale0_nodes WHERE name = %s", (name,))
                else:
                    cursor.execute(
                        "INSERT INTO scale0_nodes (name, data) VALUES (%s, %s::jsonb) "
                        "ON CONFLICT (name) DO UPDATE SET data = excluded.data",
                        (name, _dump(node.to_json())),
                    )
            for client_id, since in changes.clients.items():
                if since is None:
                    cursor.execute("DELETE FROM scale0_clients WHERE client_id = %s", (client_id,))
                else:
                    cursor.execute(
                        "INSERT INTO scale0_clients (client_id, time_connect) VALUES (%s, %s) "
                        "ON CONFLICT (client_id) DO UPDATE"
                        " SET time_connect = excluded.time_connect",
                        (client_id, since),
                    )
            if changes.refusals:
                cursor.executemany(
                    "INSERT INTO scale0_refusals (time, task, data) VALUES (%s, %s, %s::jsonb)",
                    [(r["time"], r["task"], _dump(r)) for r in changes.refusals],
                )

    def refusals(self, task: str | None = None) -> list[dict[str, Any]]:
        if task is None:
            rows = self._db.execute("SELECT data FROM scale0_refusals ORDER BY id")
        else:
            rows = self._db.execute(
                "SELECT data FROM scale0_refusals WHERE task = %s ORDER BY id", (task,)
            )
        return [dict(data) for (data,) in rows]

    def close(self) -> None:
        self._db.close()


def _where(conninfo: str) -> str:
    """The conninfo without its password, for messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "postgresql"
    params.pop("password", None)
    return "postgresql " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
