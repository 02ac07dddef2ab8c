"""The coordinator's group commit (docs/tasks.md §7) with real processes: many requests in
flight, in JSON-RPC batches of tasks with large parameters or one request per task with a
window of them in flight (TaskClient.submit_each, K4), and the coordinator SIGKILLed at
random moments, so often while a batch of decisions waits for its transaction. Whatever a
client was answered is in the store once the process is dead, and every task completes once.
With replies sent before their commit this test fails (tried: every run)."""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from scale0.tasks.client import TaskClient, TaskError
from scale0.tasks.errors import ErrorCode
from scale0.testing import running_broker, wait_until
from tests.tasks.processes import coordinator, node, running

FAST = {"default_heartbeat_interval_ms": 200, "liveness": 5}
CLIENTS = 4
BATCH = 25
KILLS = 5
#: Each task carries this much in params and result, so a batch takes milliseconds to write
#: and a kill often lands while one is being written.
BLOB = "x" * 30_000  # 25 of them fit in one frame (the broker allows 1 MiB)


def stored(db: Path) -> dict[str, dict[str, Any]]:
    """Every task in the (dead) coordinator's store, read as a restart would read it."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return {
            name: json.loads(data) for name, data in conn.execute("SELECT name, data FROM tasks")
        }


class Submitter(threading.Thread):
    """Submits batches of no-op tasks and fetches their results in batches, recording what the
    coordinator acknowledged: ``created`` (client_new_task answered) and ``done`` (result)."""

    def __init__(self, frontend: str, index: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.frontend = frontend
        self.index = index
        self.stop_event = stop
        self.lock = threading.Lock()
        self.created: set[str] = set()
        self.done: set[str] = set()
        self.error: BaseException | None = None

    def acknowledged(self) -> tuple[set[str], set[str]]:
        with self.lock:
            return set(self.created), set(self.done)

    def run(self) -> None:
        try:
            with TaskClient(self.frontend, timeout=2.0, retry_s=60.0) as client:
                client.connect()  # a fresh id: resending it is safe (K3)
                while not self.stop_event.is_set():
                    if self.index % 2:  # one request per task, BATCH of them in flight
                        ids = client.submit_each([("echo", [BLOB])] * BATCH, window=BATCH)
                        with self.lock:
                            self.created.update(ids)
                        assert client.results(ids, window=BATCH, wait_s=60) == [BLOB] * BATCH
                        with self.lock:
                            self.done.update(ids)
                        continue
                    ids = client.submit_many([("echo", [BLOB])] * BATCH)
                    with self.lock:
                        self.created.update(ids)
                    self.fetch(client, ids)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def fetch(self, client: TaskClient, ids: list[str]) -> None:
        left = ids
        limit = time.monotonic() + 60
        while left and time.monotonic() < limit:
            client.call("client_task_wait", [client.client_id, left[0], 1000])
            answers = client.call_batch(
                [("client_task_result", [client.client_id, task]) for task in left]
            )
            still = []
            for task, answer in zip(left, answers, strict=True):
                if isinstance(answer, TaskError):
                    assert answer.code == ErrorCode.NOT_FINISHED, answer
                    still.append(task)
                else:
                    with self.lock:
                        self.done.add(task)
            left = still
        assert not left, f"{len(left)} results missing"


def test_sigkill_mid_batch_loses_nothing_acknowledged(tmp_path: Path) -> None:
    (tmp_path / "broker").mkdir()
    db = tmp_path / "coordinator" / "tasks.db"
    rng = random.Random(12)
    with running_broker(tmp_path / "broker", **FAST) as broker:
        frontend = broker.endpoints["frontend"]
        coord = coordinator(tmp_path, broker.endpoints["backend"], node_timeout_s=3.0)
        methods = {"echo": "tests.tasks.methods:echo"}
        nodes = [
            node(tmp_path, f"n{i}", frontend, slots=16, poll_wait_ms=100, methods=methods)
            for i in range(2)
        ]
        stop = threading.Event()
        submitters = [Submitter(frontend, i, stop) for i in range(CLIENTS)]
        with running(coord, *nodes):
            for submitter in submitters:
                submitter.start()
            checked = 0
            for _ in range(KILLS):
                target = sum(len(s.acknowledged()[1]) for s in submitters)
                target += rng.randrange(20, 150)

                def progressed(target: int = target) -> bool:
                    for submitter in submitters:
                        assert submitter.error is None, repr(submitter.error)
                    return sum(len(s.acknowledged()[1]) for s in submitters) > target

                wait_until(progressed, "tasks completing", 60, pause=0.01)
                coord.kill()  # now nothing more can be acknowledged
                tasks = stored(db)
                for submitter in submitters:
                    created, done = submitter.acknowledged()
                    assert created <= set(tasks), "an acknowledged create was lost"
                    for name in done:
                        assert tasks[name]["state"] == "complete", name
                    checked += len(created)
                coord.start()
            stop.set()
            for submitter in submitters:
                submitter.join(90)
                assert not submitter.is_alive()
                assert submitter.error is None, submitter.error
        assert checked > 0
        tasks = stored(db)
        created = set().union(*(s.acknowledged()[0] for s in submitters))
        assert created <= set(tasks)
        for name in created:
            task = tasks[name]
            assert task["result"] == BLOB, name
            # once: complete, by the attempt it ended with, on the node that held it
            assert task["state"] == "complete" and task["success"] == "ok", task
            assert task["finished_attempt"] == task["attempt"] >= 1, task
        print(
            {
                "tasks": len(created),
                "kills": KILLS,
                "reruns": sum(t.get("reruns", 0) for t in tasks.values()),
            }
        )
