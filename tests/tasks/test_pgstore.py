"""Several coordinators on one PostgreSQL store (G1-G5 of pgstore, M1-M4 of shared): claims
fenced by version, groups decided again after a Conflict, two stores claiming at once."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from scale0.cli.coordinator_shared import decide_group
from scale0.tasks import pgstore, shared
from scale0.tasks.book import Settings
from scale0.tasks.errors import ErrorCode, Refused
from scale0.tasks.model import Severity, TaskRecord, TaskState
from scale0.tasks.pgstore import Conflict, PostgresStore
from scale0.tasks.shared import SharedBook
from tests.tasks.helpers import vespid
from tests.tasks.postgres import Server

WAIT_S = 60.0


class Side:
    """One coordinator's Book and store, deciding in groups as SharedCoordinator does."""

    def __init__(self, dsn: str, tag: str) -> None:
        self.store = PostgresStore(dsn)
        counter = itertools.count(1)
        self.book = SharedBook(
            lambda: f"{tag}{next(counter)}",
            Settings(node_timeout_s=1e9),
            self.store.load(),
            time.time(),
        )
        self.conflicts = 0
        self.clock = time.time

    def __call__(self, *decisions: Any) -> list[Any]:
        """Decide in one group; a Refused outcome is returned as the Refused."""

        def wrap(decision: Any) -> Any:
            def call(book: SharedBook, now: float) -> Any:
                try:
                    return decision(book, now)
                except Refused as exc:
                    return exc

            return call

        group = decide_group(self.book, self.store, [wrap(d) for d in decisions], clock=self.clock)
        self.conflicts += group.conflicts
        return [value for _, value in group.outcomes]

    def one(self, decision: Any) -> Any:
        return self(decision)[0]

    def close(self) -> None:
        self.store.close()


def stored_tasks(dsn: str) -> dict[str, TaskRecord]:
    store = PostgresStore(dsn)
    try:
        return {t.name: t for t in store.load().tasks}
    finally:
        store.close()


@pytest.fixture
def pair(postgres: Server) -> Any:
    dsn = postgres.database()
    a, b = Side(dsn, "a"), Side(dsn, "b")
    yield a, b
    a.close()
    b.close()


def test_rules_headers() -> None:
    assert re.findall(r"^(G\d+)\s", pgstore.__doc__ or "", re.MULTILINE) == [
        f"G{i}" for i in range(1, 6)
    ]
    assert re.findall(r"^(M\d+)\s", shared.__doc__ or "", re.MULTILINE) == [
        f"M{i}" for i in range(1, 5)
    ]


def _setup(a: Side) -> None:
    a.one(lambda book, now: book.client_connect("c", now))
    a.one(lambda book, now: book.node_connect("n1", now))
    a.one(lambda book, now: book.node_connect("n2", now))


def test_what_one_commits_the_other_decides_with(pair: tuple[Side, Side]) -> None:
    """G3: a client that connected through one submits through the other."""
    a, b = pair
    a.one(lambda book, now: book.client_connect("c", now))
    assert b.one(lambda book, now: book.create_zerotask("c", "m", [1], "t1", now)) == "t1"
    status = a.one(lambda book, now: book.owned_task("c", "t1"))
    assert status.state is TaskState.PENDING
    b.one(lambda book, now: book.client_disconnect("c"))
    refused = a.one(lambda book, now: book.create_zerotask("c", "m", [1], "t2", now))
    assert isinstance(refused, Refused) and refused.code == ErrorCode.UNKNOWN_CLIENT
    assert a.one(lambda book, now: book.client_connect("c", now)) == "c"  # free again


def test_a_stale_claim_is_refused_and_decided_again(pair: tuple[Side, Side]) -> None:
    """G2 + M2: both books think t is pending; the second claim to commit conflicts, is put
    back, and decided again on the fresh row answers {} (assigned), as one coordinator would."""
    a, b = pair
    _setup(a)
    a.one(lambda book, now: book.create_zerotask("c", "m", [1], "t", now))
    b.one(lambda book, now: None)  # b sees t pending now
    stale = b.book.checkpoint()
    assert b.book.node_task_request("t", "n2", time.time())["attempt"] == 1  # in b's memory
    assert a.one(lambda book, now: book.node_task_request("t", "n1", now))["attempt"] == 1
    changes = b.book.take_changes()
    with pytest.raises(Conflict):
        b.store.commit(changes)
    rows = b.store.reread(changes.tasks, changes.nodes, changes.clients)
    b.book.rollback(stale, rows.tasks, rows.nodes, rows.clients, time.time())
    assert (b.book.tasks["t"].node, b.book._on_node.get("n2")) == ("n1", set())
    assert b.one(lambda book, now: book.node_task_request("t", "n2", now)) == {}
    stored = stored_tasks(a.store.conninfo)
    assert (stored["t"].state, stored["t"].node, stored["t"].attempt) == (
        TaskState.RUNNING,
        "n1",
        1,
    )


def test_no_task_completes_twice_through_two_coordinators(pair: tuple[Side, Side]) -> None:
    """G2 fences the finish: the same result through the other coordinator, decided on a
    stale view, conflicts and is then an F2 duplicate; another attempt's result is refused."""
    a, b = pair
    _setup(a)
    a.one(lambda book, now: book.create_zerotask("c", "m", [1], "t", now))
    a.one(lambda book, now: book.node_task_request("t", "n1", now))
    b.one(lambda book, now: None)
    assert b.book.tasks["t"].state is TaskState.RUNNING

    def finish(book: SharedBook, now: float) -> bool:
        return book.finish("t", "n1", 1, Severity.OK, now, result=1)

    # b commits the finish while a still sees the task running: a's decision is refused by
    # the store (its row is at a newer version) and decided again: a duplicate (F2).
    assert b.one(finish) is True
    stale = a.book.checkpoint()
    assert a.book.tasks["t"].state is TaskState.RUNNING
    a.book.finish("t", "n1", 1, Severity.OK, time.time(), result=1)
    with pytest.raises(Conflict):
        a.store.commit(a.book.take_changes())
    rows = a.store.reread(["t"], [], [])
    a.book.rollback(stale, rows.tasks, rows.nodes, rows.clients, time.time())
    assert a.book.tasks["t"].state is TaskState.COMPLETE
    assert a.one(finish) is False  # F2: acknowledged, nothing changed
    refused = a.one(lambda book, now: book.finish("t", "n2", 2, Severity.OK, now, result=2))
    assert isinstance(refused, Refused) and refused.code == ErrorCode.STALE_ATTEMPT
    stored = stored_tasks(a.store.conninfo)
    assert (stored["t"].result, stored["t"].finished_attempt, stored["t"].refused) == (1, 1, 1)


def test_the_same_task_id_created_on_both_is_taken_once(pair: tuple[Side, Side]) -> None:
    a, b = pair
    _setup(a)
    b.one(lambda book, now: None)
    stale = b.book.checkpoint()
    b.book.create_zerotask("c", "m", [2], "t", time.time())
    a.one(lambda book, now: book.create_zerotask("c", "m", [1], "t", now))
    with pytest.raises(Conflict):  # the row exists: b's insert is refused
        b.store.commit(b.book.take_changes())
    rows = b.store.reread(["t"], [], [])
    b.book.rollback(stale, rows.tasks, rows.nodes, rows.clients, time.time())
    refused = b.one(lambda book, now: book.create_zerotask("c", "m", [2], "t", now))
    assert isinstance(refused, Refused) and refused.code == ErrorCode.ID_TAKEN
    assert b.book.tasks["t"].params == [1]


def test_a_row_locked_by_the_other_is_skipped_not_waited_for(pair: tuple[Side, Side]) -> None:
    """G2/G5: FOR UPDATE SKIP LOCKED: a row another transaction holds is a Conflict at once."""
    a, _ = pair
    _setup(a)
    a.one(lambda book, now: book.create_zerotask("c", "m", [1], "t", now))
    with psycopg.connect(a.store.conninfo) as other:
        other.execute("SELECT 1 FROM scale0_tasks WHERE name = 't' FOR UPDATE")
        a.book.node_task_request("t", "n1", time.time())
        started = time.monotonic()
        with pytest.raises(Conflict):
            a.store.commit(a.book.take_changes())
        waited = time.monotonic() - started
        other.rollback()
    assert waited < float(pgstore.LOCK_TIMEOUT.rstrip("s"))  # skipped, not a lock timeout


def test_placements_on_the_same_node_cannot_overfill_it(pair: tuple[Side, Side]) -> None:
    """M3: each of a and b places a task that fits n alone but not both together; the
    second placement conflicts on the node's version and is decided again: it waits."""
    a, b = pair
    spec = {"name": "n", "capabilities": {"memory": 1000, "cores": 4}}
    a.one(lambda book, now: book.node_set(spec, now))
    b.one(lambda book, now: None)
    stale = b.book.checkpoint()
    b.book.create_vespid(vespid("vb", memory=600), None, time.time())  # placed on n in memory
    assert b.book.tasks["vb"].state is TaskState.RUNNING
    a.one(lambda book, now: book.create_vespid(vespid("va", memory=600), None, now))
    changes = b.book.take_changes()
    touched = b.book.take_touched()
    with pytest.raises(Conflict):
        b.store.commit(changes, *touched)
    rows = b.store.reread(set(changes.tasks) | touched[0], set(changes.nodes) | touched[1], [])
    b.book.rollback(stale, rows.tasks, rows.nodes, rows.clients, time.time())
    b.one(lambda book, now: book.create_vespid(vespid("vb", memory=600), None, now))
    assert b.book.tasks["va"].state is TaskState.RUNNING
    assert b.book.tasks["vb"].state is TaskState.PENDING
    assert "needs 600 MB memory" in (b.book.tasks["vb"].explain or "")


def test_a_task_placed_by_one_is_delivered_by_the_other(pair: tuple[Side, Side]) -> None:
    """M1: the node's poll reaches b; b sends the task-run a decided, once."""
    a, b = pair
    spec = {"name": "n", "capabilities": {"memory": 1000, "cores": 4}}
    a.one(lambda book, now: book.node_set(spec, now))
    a.one(lambda book, now: book.create_vespid(vespid("v"), None, now))
    polled = b.one(lambda book, now: book.poll("n", [], now))
    assert [(m["command"], m["name"], m["attempt"]) for m in polled] == [("task-run", "v", 1)]
    # a still holds its own copy; once v completed through b it is dropped, never sent.
    b.one(lambda book, now: book.finish("v", "n", 1, Severity.OK, now))
    assert a.one(lambda book, now: book.poll("n", [], now)) == []


def test_node_heartbeats_are_shared(postgres: Server) -> None:
    """G5 + B3: a node heard only by b is not lost by a's tick (the groups' clock is given,
    so the test does not depend on how fast the machine runs it)."""
    dsn = postgres.database()
    a, b = Side(dsn, "a"), Side(dsn, "b")
    start = time.time()
    a.book.settings = b.book.settings = Settings(node_timeout_s=8.0)
    a.clock = b.clock = lambda: start
    a.one(lambda book, now: book.node_connect("n", now))
    for second in (5, 10, 15, 20):
        b.clock = lambda second=second: start + second
        b.one(lambda book, now: book.node("n", now))  # n polls b only
        a.clock = lambda second=second: start + second + 1
        a.one(lambda book, now: book.tick(now))
        assert a.book.nodes["n"].connected, second  # a's own last word from n: at start
    a.clock = lambda: start + 29
    a.one(lambda book, now: book.tick(now))
    assert not a.book.nodes["n"].connected  # 9 s after b last heard it
    a.close()
    b.close()


def test_two_stores_claiming_at_once_never_get_the_same_task(postgres: Server) -> None:
    """Two threads, each its own store and Book, claim 300 pending tasks as fast as they can,
    oldest first (so they collide). Every task is claimed exactly once, by one of them."""
    dsn = postgres.database()
    setup = Side(dsn, "s")
    _setup(setup)
    names = [f"t{i:03d}" for i in range(300)]
    setup(*[lambda book, now, n=n: book.create_zerotask("c", "m", [n], n, now) for n in names])
    setup.close()
    sides = {"n1": Side(dsn, "a"), "n2": Side(dsn, "b")}
    claimed: dict[str, list[str]] = {node: [] for node in sides}
    barrier = threading.Barrier(len(sides))
    errors: list[BaseException] = []

    def claim(node: str, side: Side) -> None:
        try:
            barrier.wait(WAIT_S)
            limit = time.monotonic() + WAIT_S
            while time.monotonic() < limit:
                side.one(lambda book, now: None)
                pending = [n for n in names if side.book.tasks[n].state is TaskState.PENDING]
                if not pending:
                    return
                for name in pending[:3]:
                    got = side.one(lambda book, now, n=name: book.node_task_request(n, node, now))
                    if got:
                        claimed[node].append(name)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=item) for item in sides.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 2)
    conflicts = {node: side.conflicts for node, side in sides.items()}
    for side in sides.values():
        side.close()
    assert not errors, errors
    both = claimed["n1"] + claimed["n2"]
    counts = Counter(both)
    print(
        f"claims: n1 {len(claimed['n1'])}, n2 {len(claimed['n2'])}; "
        f"groups refused and decided again: {conflicts}"
    )
    assert [name for name, count in counts.items() if count > 1] == []
    assert sorted(both) == names
    stored = stored_tasks(dsn)
    for node, mine in claimed.items():
        for name in mine:
            assert (stored[name].state, stored[name].node, stored[name].attempt) == (
                TaskState.RUNNING,
                node,
                1,
            )
    assert claimed["n1"] and claimed["n2"]
    assert sum(conflicts.values()) > 0  # they did collide: the fencing was exercised


def test_a_child_created_while_its_parent_completes_is_not_left_waiting(
    pair: tuple[Side, Side],
) -> None:
    """M3: a creates child c of running p in memory; b completes p first. a's create touched
    p, so it conflicts, and decided again c is pending at once (its parent is complete)."""
    a, b = pair
    spec = {"name": "n", "capabilities": {"memory": 1000, "cores": 4}}
    a.one(lambda book, now: book.node_set(spec, now))
    a.one(lambda book, now: book.create_vespid(vespid("p", memory=900), None, now))
    stale = a.book.checkpoint()
    a.book.create_vespid(vespid("c", parent="p"), None, time.time())
    assert a.book.tasks["c"].state is TaskState.WAITING
    b.one(lambda book, now: book.finish("p", "n", 1, Severity.OK, now))
    changes = a.book.take_changes()
    touched = a.book.take_touched()
    assert touched == ({"p"}, set())
    with pytest.raises(Conflict):
        a.store.commit(changes, *touched)
    rows = a.store.reread(set(changes.tasks) | touched[0], set(changes.nodes), [])
    a.book.rollback(stale, rows.tasks, rows.nodes, rows.clients, time.time())
    a.one(lambda book, now: book.create_vespid(vespid("c", parent="p"), None, now))
    assert stored_tasks(a.store.conninfo)["c"].state is TaskState.RUNNING  # placed on n


def test_a_task_left_on_a_lost_node_is_requeued_by_the_tick(pair: tuple[Side, Side]) -> None:
    """M4: a loses n while b assigns it a task (the loss and the claim raced): b's tick
    re-queues the task as a new attempt instead of leaving it running on a lost node."""
    a, b = pair
    _setup(a)
    a.one(lambda book, now: book.create_zerotask("c", "m", [1], "t", now))
    b.one(lambda book, now: book.node_task_request("t", "n1", now))
    a.book.node_disconnect("n1", time.time())  # a's view (no group, no refresh): t pending
    a.store.commit(a.book.take_changes())  # no conflict: the task row was not part of it
    b.one(lambda book, now: book.tick(now))
    task = stored_tasks(b.store.conninfo)["t"]
    assert (task.state, task.attempt, task.reruns) == (TaskState.PENDING, 1, 1)
