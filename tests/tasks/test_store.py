"""The stores: D1-D5, and a coordinator-shaped process SIGKILLed at random points (D3)."""

from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scale0.tasks import store as store_module
from scale0.tasks.model import Severity, TaskState
from scale0.tasks.store import SQLiteStore, StoreError
from tests.tasks.helpers import add_node, new_book, vespid
from tests.tasks.postgres import Server
from tests.tasks.stores import STORE_KINDS, open_store

REPO = Path(__file__).resolve().parents[2]
COUNT = 12
WAIT_S = 60.0


@pytest.fixture(params=STORE_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def where(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store location of ``kind``: a file, or a new database on the test server."""
    if kind == "postgresql":
        server: Server = request.getfixturevalue("postgres")
        return server.database()
    return str(tmp_path / "tasks.db")


def test_rules_header_lists_d1_to_d5() -> None:
    assert re.findall(r"^(D\d+)\s", store_module.__doc__ or "", re.MULTILINE) == [
        f"D{i}" for i in range(1, 6)
    ]


def test_round_trip_of_everything(kind: str, where: str) -> None:
    store = open_store(kind, where)
    book = new_book()
    book.client_connect("c", 0.0)
    add_node(book, "n", 1000, 4)
    book.create_vespid(vespid("v"), "alice", 0.5)
    book.create_zerotask("c", "m", {"x": [1, 2]}, "z", 0.5)
    book.node_connect("n", 0.6)
    book.node_task_request("z", "n", 0.7)
    book.finish("z", "n", 1, Severity.ERROR, 0.8, error={"code": 3, "message": "bad"})
    with pytest.raises(Exception, match="stale"):
        book.finish("z", "n", 7, Severity.OK, 0.9)
    store.commit(book.take_changes())
    store.close()
    again = open_store(kind, where)
    snapshot = again.load()
    assert {t.name: t for t in snapshot.tasks} == book.tasks
    assert {n.name: n for n in snapshot.nodes} == book.nodes
    assert dict(snapshot.clients) == {"c": 0.0}
    assert snapshot.refusals == 1
    assert again.refusals("z")[0]["attempt"] == 7
    assert again.refusals("v") == []
    again.close()


def test_d1_a_failed_commit_leaves_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tasks.db")
    book = new_book()
    book.create_vespid(vespid("a"), None, 0.0)
    changes = book.take_changes()
    changes.refusals.append({"time": 0.0})  # no "task": the insert fails midway
    with pytest.raises(KeyError):
        store.commit(changes)
    assert store.load().tasks == ()


def test_d2_wal_and_full_sync(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "tasks.db").close()
    db = sqlite3.connect(tmp_path / "tasks.db")
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()


def test_d5_newer_schema_and_garbage_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema 99 is newer"):
        SQLiteStore(path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"junk\.db"):
        SQLiteStore(junk)


def _run_driver(kind: str, db: str, kill_after: int | None) -> list[dict[str, Any]]:
    """Start the driver; SIGKILL it after ``kill_after`` ack lines (None: let it finish)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.tasks.store_driver", kind, str(db), str(COUNT)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    acks: list[dict[str, Any]] = []
    buffer = b""
    deadline = time.monotonic() + WAIT_S
    assert process.stdout is not None
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            if not ready:
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            acks.extend(json.loads(line) for line in lines if line)
            if kill_after is not None and len(acks) >= kill_after:
                os.kill(process.pid, signal.SIGKILL)
                break
        else:
            raise AssertionError("the driver did not finish in time")
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=10)
    if kill_after is None or process.returncode != -signal.SIGKILL:
        # it ended by itself: only a finished run may do that
        assert acks and acks[-1] == {"op": "done"}, stderr.decode()
    return acks


def test_d3_killed_at_random_points_loses_nothing(kind: str, where: str) -> None:
    db = where
    rng = random.Random(int(os.environ.get("SCALE0_SEED", "12")))
    finished: dict[str, list[dict[str, Any]]] = {}
    refused = 0
    for _round in range(5):
        acks = _run_driver(kind, db, kill_after=rng.randint(1, 40))
        store = open_store(kind, db)
        tasks = {t.name: t for t in store.load().tasks}
        for ack in acks:
            if ack["op"] == "created":
                assert ack["name"] in tasks
            elif ack["op"] == "finished":
                finished.setdefault(ack["name"], []).append(ack)
                task = tasks[ack["name"]]
                assert task.state is TaskState.COMPLETE
                assert task.result == ack.get("result")
                assert task.error == ack.get("error")
            elif ack["op"] == "refused":
                refused += 1
        assert store.load().refusals >= refused
        store.close()
    _run_driver(kind, db, kill_after=None)
    store = open_store(kind, db)
    snapshot = store.load()
    tasks = {t.name: t for t in snapshot.tasks}
    assert len(tasks) == 2 * COUNT
    for name, task in tasks.items():
        assert task.state is TaskState.COMPLETE, name
        assert task.finished_attempt == task.attempt
        assert len(finished.get(name, [])) <= 1  # completed once, never twice
    squares = {n: t.result for n, t in tasks.items() if n.startswith("z") and t.error is None}
    assert all(result == int(n[1:]) ** 2 for n, result in squares.items())
    assert snapshot.refusals >= refused
    store.close()
