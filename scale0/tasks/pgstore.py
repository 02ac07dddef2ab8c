"""The PostgreSQL store (psycopg 3): the same interface as SQLite, for several coordinators at once.

Rules (docs/tasks.md §7.2; the store tests run against it too, tests/tasks/test_pgstore.py
asserts the rest with two stores on one real server):

G1  D1, D3 and D4 of scale0.tasks.store hold unchanged: one ``commit`` is one transaction
    (READ COMMITTED, synchronous commit), ``load`` returns everything committed.
G2  Several coordinators may serve one database at once. Every task and node row carries a
    ``version`` (from one sequence, new at each write). A store remembers the version of each
    row as it last read or wrote it, and ``commit`` writes a row only if it is still at that
    version: the rows are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED``, and a row that
    another coordinator changed since, or holds locked in its own transaction right now, makes
    the whole transaction roll back with :class:`Conflict` (nothing of it is stored). So two
    coordinators can never both assign, finish or re-queue the same attempt: the second one's
    decision was taken on an old version and is refused (fencing by version, on top of F1-F3's
    fencing by attempt). A task or client that exists already (created by the other one) is a
    conflict too.
G3  :meth:`PostgresStore.begin` opens the transaction of one group of decisions and returns
    what the others committed since this store last looked (rows whose ``xid`` is not below the
    oldest transaction then running: nothing committed is missed, some rows are read twice and
    dropped by version). The coordinator takes them in before it decides, so a request that
    follows another's reply (a client that connected through one coordinator and submits
    through the other) is decided on a state that includes it.
G4  Optimistic transactions take the advisory lock LOCK_KEY shared; ``begin(exclusive=True)``
    takes it exclusively, so no other transaction writes while it reads, decides and commits:
    a group refused again and again is decided alone (no livelock).
G5  Every wait for a row lock is bounded (``lock_timeout``); a deadlock, a lock timeout or a
    serialization failure is a :class:`Conflict`. Node heartbeats (``seen``) go to their own
    table and only ever rise (GREATEST), so they never conflict.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors

from scale0.tasks.messages import Changes, Snapshot
from scale0.tasks.model import NodeRecord, TaskRecord
from scale0.tasks.store import SCHEMA_VERSION, StoreError

__all__ = ["LOCK_KEY", "Conflict", "Fresh", "PostgresStore"]

#: The advisory lock of G4 (an arbitrary constant: "S0TASKS").
LOCK_KEY: Final = 0x5330_5441_534B_53

#: G5: the longest a statement waits for another transaction's row lock.
LOCK_TIMEOUT: Final = "5s"

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
    "CREATE TABLE IF NOT EXISTS scale0_node_seen ("
    " name TEXT PRIMARY KEY, seen DOUBLE PRECISION NOT NULL)",
    "CREATE SEQUENCE IF NOT EXISTS scale0_version",
    # G2/G3 (added to a store written before several coordinators could share it)
    "ALTER TABLE scale0_tasks ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0,"
    " ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL DEFAULT pg_current_xact_id()",
    "ALTER TABLE scale0_nodes ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0,"
    " ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL DEFAULT pg_current_xact_id()",
    "ALTER TABLE scale0_clients ADD COLUMN IF NOT EXISTS gone BOOLEAN NOT NULL DEFAULT false,"
    " ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL DEFAULT pg_current_xact_id()",
    "CREATE INDEX IF NOT EXISTS scale0_tasks_xid ON scale0_tasks (xid)",
    "CREATE INDEX IF NOT EXISTS scale0_nodes_xid ON scale0_nodes (xid)",
    "CREATE INDEX IF NOT EXISTS scale0_clients_xid ON scale0_clients (xid)",
)

#: G4, and the next G3 horizon (taken at the statement's start: no later than the lock).
_LOCK_SHARED: Final = (
    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, pg_advisory_xact_lock_shared(%s)"
)
_LOCK_EXCLUSIVE: Final = (
    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, pg_advisory_xact_lock(%s)"
)

#: G3: every row committed at or after the horizon ``h``, but those of our own transactions
#: (``own``); all the heartbeats.
_CHANGED_SINCE: Final = (
    "SELECT 0, name, data::text, version, NULL::float8 FROM scale0_tasks"
    " WHERE xid >= %(h)s::xid8 AND NOT (xid = ANY(%(own)s::text[]::xid8[]))"
    " UNION ALL SELECT 1, name, data::text, version, NULL FROM scale0_nodes"
    " WHERE xid >= %(h)s::xid8 AND NOT (xid = ANY(%(own)s::text[]::xid8[]))"
    " UNION ALL SELECT 2, client_id, NULL, gone::int, time_connect FROM scale0_clients"
    " WHERE xid >= %(h)s::xid8 AND NOT (xid = ANY(%(own)s::text[]::xid8[]))"
    " UNION ALL SELECT 3, name, NULL, NULL, seen FROM scale0_node_seen"
)
_REFUSAL_COUNT: Final = " UNION ALL SELECT 4, NULL, NULL, count(*), NULL FROM scale0_refusals"

#: G5: what PostgreSQL says when two transactions collide.
_COLLISIONS: Final = (
    pg_errors.DeadlockDetected,
    pg_errors.LockNotAvailable,
    pg_errors.SerializationFailure,
)


class Conflict(Exception):
    """G2: another coordinator changed (or is changing) rows this transaction's decisions
    were based on; nothing of the transaction was stored."""

    def __init__(self, what: Iterable[str]) -> None:
        self.what = sorted(what)
        super().__init__("changed by another coordinator: " + ", ".join(self.what[:5]))


@dataclass(slots=True)
class Fresh:
    """Rows committed by others (G3), or the current rows of what a refused group changed.

    ``tasks``/``nodes``/``clients`` map a name to its row, or None when there is none (a
    client that disconnected, a task that was never committed). ``seen``: node heartbeats.
    """

    tasks: dict[str, TaskRecord | None] = field(default_factory=dict)
    nodes: dict[str, NodeRecord | None] = field(default_factory=dict)
    clients: dict[str, float | None] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    refusals: int | None = None


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class PostgresStore:
    """A store in one PostgreSQL database (``conninfo`` as psycopg takes it)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self._task_versions: dict[str, int] = {}
        self._node_versions: dict[str, int] = {}
        self._seen_written: dict[str, float] = {}
        #: Our own committed transactions at or above the horizon: G3 need not read them.
        self._own_xids: set[str] = set()
        self._horizon = "0"
        self._xid = "0"
        try:
            self._db = psycopg.connect(conninfo, autocommit=True)
            self._db.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
            with self._db.transaction():
                # Two coordinators creating the schema at once must not collide.
                self._db.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY + 1,))
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
            self._db.autocommit = False
        except psycopg.Error as exc:
            raise StoreError(f"{_where(conninfo)}: {exc}") from exc

    # ---- the Store interface ----

    def load(self) -> Snapshot:
        db = self._db
        try:
            horizon = self._take_horizon()
            tasks = []
            self._task_versions.clear()
            for data, version in db.execute("SELECT data, version FROM scale0_tasks ORDER BY seq"):
                task = TaskRecord.from_json(data)
                tasks.append(task)
                self._task_versions[task.name] = int(version)
            nodes = []
            self._node_versions.clear()
            for data, version in db.execute("SELECT data, version FROM scale0_nodes ORDER BY name"):
                node = NodeRecord.from_json(data)
                nodes.append(node)
                self._node_versions[node.name] = int(version)
            clients = {
                str(client): float(since)
                for client, since in db.execute(
                    "SELECT client_id, time_connect FROM scale0_clients WHERE NOT gone"
                )
            }
            row = db.execute("SELECT count(*) FROM scale0_refusals").fetchone()
            db.rollback()
        except (psycopg.Error, ValueError, KeyError, TypeError) as exc:
            self._end()
            raise StoreError(f"{_where(self.conninfo)}: cannot read: {exc}") from exc
        self._horizon = horizon
        return Snapshot(tuple(tasks), tuple(nodes), clients, int(row[0]) if row else 0)

    def commit(
        self,
        changes: Changes,
        touched_tasks: Iterable[str] = (),
        touched_nodes: Iterable[str] = (),
        seen: Mapping[str, float] | None = None,
    ) -> None:
        """D1/G2: write ``changes`` (and bump the versions of the rows ``touched``) in the
        transaction :meth:`begin` opened (or a new one), only if every row is still at the
        version this store last saw; else roll back and raise :class:`Conflict`. ``seen``:
        node heartbeats to share (G5)."""
        touched_tasks = set(touched_tasks) - set(changes.tasks)
        touched_nodes = set(touched_nodes) - set(changes.nodes)
        heard = self._heard(seen or {})
        if not changes and not touched_tasks and not touched_nodes and not heard:
            self._end()
            return
        try:
            _, task_versions, node_versions = self._write(
                changes, touched_tasks, touched_nodes, heard
            )
        except Conflict:
            self._end()
            raise
        except _COLLISIONS as exc:
            self._end()
            raise Conflict([type(exc).__name__]) from exc
        except BaseException:
            self._end()
            raise
        self._task_versions.update(task_versions)
        for name, version in node_versions.items():
            if version is None:
                self._node_versions.pop(name, None)
            else:
                self._node_versions[name] = version
        self._seen_written.update(heard)
        self._own_xids.add(self._xid)

    def refusals(self, task: str | None = None) -> list[dict[str, Any]]:
        try:
            if task is None:
                rows = self._db.execute("SELECT data FROM scale0_refusals ORDER BY id").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT data FROM scale0_refusals WHERE task = %s ORDER BY id", (task,)
                ).fetchall()
        finally:
            self._end()
        return [dict(data) for (data,) in rows]

    def close(self) -> None:
        self._db.close()

    # ---- several coordinators (G2-G5) ----

    def begin(self, exclusive: bool = False, count_refusals: bool = False) -> Fresh:
        """G3/G4: open the transaction of one group of decisions; what others committed since
        this store last looked (rows it already holds at the same version are left out).

        One round trip (pipeline mode): the lock with the next horizon, then one statement
        for every kind of row changed since the last horizon."""
        db = self._db
        self._end()
        lock = _LOCK_EXCLUSIVE if exclusive else _LOCK_SHARED
        since = {"h": self._horizon, "own": sorted(self._own_xids)}
        query = _CHANGED_SINCE + (_REFUSAL_COUNT if count_refusals else "")
        with db.pipeline():  # one round trip; the server runs them in order
            locked = db.execute(lock, (LOCK_KEY,))
            changed = db.execute(query, since)
            row = locked.fetchone()
            rows = changed.fetchall()
        assert row is not None
        horizon = str(row[0])
        fresh = Fresh()
        tasks, nodes = self._task_versions, self._node_versions
        for kind, name, data, number, value in rows:
            if kind == 0 and tasks.get(name) != number:
                fresh.tasks[name] = TaskRecord.from_json(json.loads(data))
                tasks[name] = int(number)
            elif kind == 1 and nodes.get(name) != number:
                fresh.nodes[name] = NodeRecord.from_json(json.loads(data))
                nodes[name] = int(number)
            elif kind == 2:
                fresh.clients[str(name)] = None if number else float(value)
            elif kind == 3:
                fresh.seen[str(name)] = float(value)
            elif kind == 4:
                fresh.refusals = int(number)
        self._horizon = horizon
        floor = int(horizon)
        self._own_xids = {xid for xid in self._own_xids if int(xid) >= floor}
        return fresh

    def abort(self) -> None:
        """Roll back the open transaction (nothing of it is stored)."""
        self._end()

    def reread(self, tasks: Iterable[str], nodes: Iterable[str], clients: Iterable[str]) -> Fresh:
        """The rows named, as committed now (None: there is none): after a :class:`Conflict`
        the coordinator puts these back in place of what its refused decisions wrote."""
        db = self._db
        fresh = Fresh()
        try:
            names = sorted(set(tasks))
            fresh.tasks = dict.fromkeys(names)
            for name, data, version in db.execute(
                "SELECT name, data, version FROM scale0_tasks WHERE name = ANY(%s)", (names,)
            ):
                fresh.tasks[name] = TaskRecord.from_json(data)
                self._task_versions[name] = int(version)
            for name in names:
                if fresh.tasks[name] is None:
                    self._task_versions.pop(name, None)
            names = sorted(set(nodes))
            fresh.nodes = dict.fromkeys(names)
            for name, data, version in db.execute(
                "SELECT name, data, version FROM scale0_nodes WHERE name = ANY(%s)", (names,)
            ):
                fresh.nodes[name] = NodeRecord.from_json(data)
                self._node_versions[name] = int(version)
            for name in names:
                if fresh.nodes[name] is None:
                    self._node_versions.pop(name, None)
            names = sorted(set(clients))
            fresh.clients = dict.fromkeys(names)
            for client, since, gone in db.execute(
                "SELECT client_id, time_connect, gone FROM scale0_clients"
                " WHERE client_id = ANY(%s)",
                (names,),
            ):
                fresh.clients[str(client)] = None if gone else float(since)
        finally:
            self._end()
        return fresh

    # ---- inside ----

    def _end(self) -> None:
        """End whatever transaction is open (a read is never left idle in a transaction: that
        would hold back every other coordinator's G3 horizon)."""
        if self._db.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._db.rollback()

    def _take_horizon(self) -> str:
        row = self._db.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
        assert row is not None
        return str(row[0])

    def _heard(self, seen: Mapping[str, float]) -> dict[str, float]:
        written = self._seen_written
        return {name: when for name, when in seen.items() if when > written.get(name, 0.0) + 0.05}

    def _write(
        self,
        changes: Changes,
        touched_tasks: set[str],
        touched_nodes: set[str],
        heard: Mapping[str, float],
    ) -> tuple[int, dict[str, int], dict[str, int | None]]:
        """G2: claim, check, write and commit, in two round trips (psycopg's pipeline mode):
        the claims, inserts and client changes, whose answers decide; then the updates and
        the COMMIT. Rows get ``currval`` of the version sequence, drawn once per transaction."""
        db = self._db
        task_names = sorted(set(changes.tasks) | touched_tasks)
        known = self._task_versions
        old = [name for name in task_names if name in known]
        new = [name for name in task_names if name not in known and name in changes.tasks]
        node_names = sorted(set(changes.nodes) | touched_nodes)
        node_known = self._node_versions
        old_nodes = [name for name in node_names if name in node_known]
        new_nodes = [
            name
            for name in node_names
            if name not in node_known and changes.nodes.get(name) is not None
        ]
        clients = sorted(changes.clients.items())
        stale: list[str] = []
        with db.pipeline():
            head = db.execute("SELECT nextval('scale0_version'), pg_current_xact_id()::text")
            claimed = None
            if old:
                claimed = db.execute(
                    "SELECT name, version FROM scale0_tasks WHERE name = ANY(%s)"
                    " ORDER BY name FOR UPDATE SKIP LOCKED",
                    (old,),
                )
            inserted = None
            if new:
                inserted = db.execute(
                    "INSERT INTO scale0_tasks (name, data, version)"
                    " SELECT n, d, currval('scale0_version')"
                    " FROM unnest(%s::text[], %s::jsonb[]) AS u(n, d)"
                    " ON CONFLICT (name) DO NOTHING RETURNING name",
                    (new, [_dump(changes.tasks[n].to_json()) for n in new]),
                )
            nodes_claimed = None
            if old_nodes:
                nodes_claimed = db.execute(
                    "SELECT name, version FROM scale0_nodes WHERE name = ANY(%s)"
                    " ORDER BY name FOR UPDATE SKIP LOCKED",
                    (old_nodes,),
                )
            nodes_inserted = [
                db.execute(
                    "INSERT INTO scale0_nodes (name, data, version)"
                    " VALUES (%s, %s::jsonb, currval('scale0_version'))"
                    " ON CONFLICT (name) DO NOTHING RETURNING name",
                    (name, _dump(record.to_json())),
                )
                for name in new_nodes
                if (record := changes.nodes[name]) is not None
            ]
            clients_done = [
                db.execute(
                    "UPDATE scale0_clients SET gone = true, xid = pg_current_xact_id()"
                    " WHERE client_id = %s AND NOT gone RETURNING client_id",
                    (client_id,),
                )
                if since is None
                else db.execute(
                    "INSERT INTO scale0_clients (client_id, time_connect) VALUES (%s, %s)"
                    " ON CONFLICT (client_id) DO UPDATE SET time_connect = excluded.time_connect,"
                    " gone = false, xid = pg_current_xact_id() WHERE scale0_clients.gone"
                    " RETURNING client_id",
                    (client_id, since),
                )
                for client_id, since in clients
            ]
            # -- the answers (one round trip) --
            row = head.fetchone()
            assert row is not None
            version, self._xid = int(row[0]), str(row[1])
            if claimed is not None:
                got: dict[str, int] = dict(claimed.fetchall())
                stale += [f"task {n}" for n in old if got.get(n) != known[n]]
            if inserted is not None:
                done = {name for (name,) in inserted.fetchall()}
                stale += [f"task {n} exists" for n in new if n not in done]
            if nodes_claimed is not None:
                got_nodes: dict[str, int] = dict(nodes_claimed.fetchall())
                stale += [f"node {n}" for n in old_nodes if got_nodes.get(n) != node_known[n]]
            for name, cursor in zip(new_nodes, nodes_inserted, strict=True):
                if cursor.fetchone() is None:
                    stale.append(f"node {name} exists")
            for (client_id, _), cursor in zip(clients, clients_done, strict=True):
                if cursor.fetchone() is None:
                    stale.append(f"client {client_id}")
            if stale:
                raise Conflict(stale)
            # -- the writes and the COMMIT (one round trip) --
            updated = [name for name in old if name in changes.tasks]
            if updated:
                db.execute(
                    "UPDATE scale0_tasks t SET data = u.d, version = currval('scale0_version'),"
                    " xid = pg_current_xact_id()"
                    " FROM unnest(%s::text[], %s::jsonb[]) AS u(n, d) WHERE t.name = u.n",
                    (updated, [_dump(changes.tasks[n].to_json()) for n in updated]),
                )
            bumped = [name for name in old if name not in changes.tasks]
            if bumped:
                db.execute(
                    "UPDATE scale0_tasks SET version = currval('scale0_version'),"
                    " xid = pg_current_xact_id() WHERE name = ANY(%s)",
                    (bumped,),
                )
            for name in old_nodes:
                record = changes.nodes.get(name)
                if name in changes.nodes and record is None:
                    db.execute("DELETE FROM scale0_nodes WHERE name = %s", (name,))
                elif record is None:
                    db.execute(
                        "UPDATE scale0_nodes SET version = currval('scale0_version'),"
                        " xid = pg_current_xact_id() WHERE name = %s",
                        (name,),
                    )
                else:
                    db.execute(
                        "UPDATE scale0_nodes SET data = %s::jsonb,"
                        " version = currval('scale0_version'), xid = pg_current_xact_id()"
                        " WHERE name = %s",
                        (_dump(record.to_json()), name),
                    )
            if changes.refusals:
                db.cursor().executemany(
                    "INSERT INTO scale0_refusals (time, task, data) VALUES (%s, %s, %s::jsonb)",
                    [(r["time"], r["task"], _dump(r)) for r in changes.refusals],
                )
            if heard:
                names = sorted(heard)
                db.execute(
                    "INSERT INTO scale0_node_seen (name, seen)"
                    " SELECT * FROM unnest(%s::text[], %s::float8[])"
                    " ON CONFLICT (name) DO UPDATE"
                    " SET seen = GREATEST(scale0_node_seen.seen, excluded.seen)",
                    (names, [heard[n] for n in names]),
                )
            db.commit()
        node_versions: dict[str, int | None] = {
            name: None if name in changes.nodes and changes.nodes[name] is None else version
            for name in old_nodes + new_nodes
        }
        return version, dict.fromkeys(old + new, version), node_versions


def _where(conninfo: str) -> str:
    """The conninfo without its password, for messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "postgresql"
    params.pop("password", None)
    return "postgresql " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
