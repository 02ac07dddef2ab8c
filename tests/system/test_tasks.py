"""The task coordinator with real processes: 2 brokers, a coordinator, 3 nodes, 500 tasks,
a node and the coordinator SIGKILLed mid-run; every task completes exactly once. The same on
PostgreSQL with two coordinators serving at once, one of them SIGKILLed (not restarted)."""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scale0.net.errors import RequestTimeout, ServiceNotFound, ServiceUnavailable
from scale0.tasks.client import TaskClient
from scale0.tasks.model import Severity, TaskState
from scale0.testing import running_brokers, wait_until
from tests.tasks.postgres import Server, running_postgres
from tests.tasks.processes import Proc, coordinator, node, running
from tests.tasks.stores import open_store

pytestmark = pytest.mark.system

FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}
ZEROTASK_COUNT = 380
VESPID_COUNT = 120
WAIT_S = 120.0

# name -> (capabilities, repositories); the requirement mix below needs each of them.
NODES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "small": ({"memory": 1000, "cores": 1}, {}),
    "astro": ({"memory": 4000, "cores": 2, "usage_prefer_astro": True}, {}),
    "large": ({"memory": 8000, "cores": 4}, {"/srv/conda": {"type": "conda", "persist": True}}),
}

SCRIPT = (
    "import os, time\n"
    "with open(os.environ['RUNS'], 'a') as runs:\n"
    "    runs.write(os.environ['VESPID_TASK'] + ' ' + os.environ['SCALE0_TASK_ATTEMPT'] + '\\n')\n"
    "time.sleep(0.3)\n"
)

KINDS: dict[str, tuple[dict[str, Any], dict[str, Any], set[str]]] = {
    # kind -> (requirements, repositories, nodes it may run on)
    "any": ({"memory": 300, "cores": 1}, {}, {"small", "astro", "large"}),
    "medium": ({"memory": 2000, "cores": 1}, {}, {"astro", "large"}),
    "big": ({"memory": 5000, "cores": 2, "cores_max": 4}, {}, {"large"}),
    "astro": ({"memory": 300, "usage_require_astro": True}, {}, {"astro"}),
    "conda": ({"memory": 300}, {"env": {"request": "conda", "local": True}}, {"large"}),
}


@pytest.fixture(scope="module")
def postgres() -> Iterator[Server]:
    with running_postgres() as server:
        yield server


def served(frontend: str) -> bool:
    """Whether a coordinator answers through ``frontend`` yet (task-info needs no login)."""
    try:
        with TaskClient(frontend, timeout=2.0, retry_s=0.0) as probe:
            return bool(probe.command("task-info", name="-")["status"] == "invalid")
    except (ServiceNotFound, ServiceUnavailable, RequestTimeout):
        return False  # not registered yet (R7)


def _stats(proc: Proc) -> dict[str, Any]:
    """The last ``coordinator_stats`` (or ``coordinator_stopped``) a coordinator logged."""
    last: dict[str, Any] = {}
    for line in proc.stderr.read_text(errors="replace").splitlines():
        if '"coordinator_stats"' in line or '"coordinator_stopped"' in line:
            with contextlib.suppress(ValueError):
                last = json.loads(line)
    return last


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_500_tasks_survive_a_node_and_the_coordinator_being_killed(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(int(os.environ.get("SCALE0_SEED", "500")))
    runs_file = tmp_path / "runs.txt"
    options: dict[str, Any] = {"node_timeout_s": 2.0, "resend_s": 2.0, "tick_s": 0.2}
    dsn = None
    if store == "postgresql":
        server: Server = request.getfixturevalue("postgres")
        dsn = options["database"] = server.database()
    with running_brokers(tmp_path / "family", 2, **FAST) as brokers:
        b1, b2 = brokers
        coord = coordinator(tmp_path, b1.endpoints["backend"], **options)
        # PostgreSQL: a second coordinator serves at the same time (docs/tasks.md §7.2). Both
        # are workers at b1, which spreads the requests between them (R5: least recently used).
        second = coordinator(tmp_path, b1.endpoints["backend"], "second", **options)
        extra = [second] if dsn else []
        nodes = {
            name: node(
                tmp_path,
                name,
                # The nodes and the submitting client use the other broker, so all their
                # traffic is forwarded b2 -> b1 (this once made b1 stop reading b2's link:
                # docs/architecture.md). b1 is checked below with a client of its own.
                b2.endpoints["frontend"],
                capabilities=caps,
                repositories=repos,
                slots=4,
            )
            for name, (caps, repos) in NODES.items()
        }
        with (
            running(coord, *extra, *nodes.values()),
            TaskClient(b2.endpoints["frontend"]) as client,
        ):
            # Served first: a loaded machine may take longer to register the coordinators'
            # workers than the brokers' start-up grace, and a request then is answered 404.
            wait_until(lambda: served(b2.endpoints["frontend"]), "coordinator serves", WAIT_S)
            # A fresh client id (K3): a fixed id's resend would find itself taken.
            client.connect()
            with TaskClient(b1.endpoints["frontend"]) as via_b1:  # any broker reaches it
                via_b1.connect()
                assert via_b1.result(via_b1.submit("square", [12], "through-b1")) == 144
            kinds: dict[str, str] = {}
            expected: dict[str, int] = {}
            plan = [("z", i) for i in range(ZEROTASK_COUNT)] + [
                ("v", i) for i in range(VESPID_COUNT)
            ]
            rng.shuffle(plan)
            killed_node = killed_coordinator = False
            served_before_kill: dict[str, Any] = {}
            for step, (protocol, i) in enumerate(plan):
                if protocol == "z":
                    expected[client.submit("square", [i], f"z{i}")] = i * i
                else:
                    kind = rng.choice(sorted(KINDS))
                    requirements, repositories, _ = KINDS[kind]
                    kinds[f"v{i}"] = kind
                    client.create(
                        f"v{i}",
                        SCRIPT,
                        requirements=requirements,
                        repositories=repositories,
                        environment={"RUNS": str(runs_file)},
                    )
                if step == len(plan) // 3 and not killed_node:
                    nodes["astro"].kill()  # mid-run: its scripts die with it (PDEATHSIG)
                    nodes["astro"].start()  # comes back, registers once the old one is lost
                    killed_node = True
                if step == 2 * len(plan) // 3 and not killed_coordinator:
                    if dsn:  # both served requests before one of them dies
                        for proc in (coord, second):
                            wait_until(
                                lambda proc=proc: _stats(proc).get("requests", 0) > 0,
                                f"{proc.config.stem} served requests",
                                30,
                            )
                        served_before_kill = {"killed": _stats(coord), "survivor": _stats(second)}
                    coord.kill()
                    # SQLite: restarts and restores everything from the store. PostgreSQL: not
                    # restarted; the other coordinator takes every request from now on, and
                    # what the killed one had in flight is resent to it by clients and nodes.
                    if not dsn:
                        coord.start()
                    killed_coordinator = True
            client.create("never", SCRIPT, requirements={"memory": 99999})
            info = client.info("never")
            assert info["status"] is None
            assert info["explain"].startswith("no node could ever run it")

            def counts() -> dict[str, int]:
                return dict(client.command("task-list")["counts"])

            wait_until(
                lambda: counts()["complete"] == len(plan) + 1,
                "every task complete",
                WAIT_S,
                pause=0.5,
            )
            client.command("task-cancel", name="never")
            final = counts()
            for name, square in expected.items():
                assert client.result(name) == square
            with TaskClient(b1.endpoints["frontend"]) as via_b1:
                for name in kinds:
                    info = via_b1.info(name)
                    assert (info["status"], info["success"]) == ("complete", "ok"), info
            for proc in (*nodes.values(), *extra):
                assert proc.alive()
            assert coord.alive() is not bool(dsn)
        if dsn:  # stopped (SIGTERM) on the way out: its last counts
            served_before_kill["survivor_at_end"] = _stats(second)
    opened = open_store(store, dsn or tmp_path / "coordinator" / "tasks.db")
    tasks = {t.name: t for t in opened.load().tasks}
    refusals = opened.refusals()
    opened.close()
    assert len(tasks) == len(plan) + 2
    lines = [tuple(line.split()) for line in runs_file.read_text().split("\n") if line]
    runs = Counter(name for name, _ in lines)
    # no attempt of a script ever ran twice (a re-run is a new attempt, after its node died)
    assert [item for item, count in Counter(lines).items() if count > 1] == []
    for name, task in tasks.items():
        assert task.state is TaskState.COMPLETE, name
        if name == "never":
            assert task.success is Severity.TERMINATED
            continue
        assert task.success is Severity.OK, task
        assert task.finished_attempt == task.attempt  # completed by its last attempt, once
        if name in kinds:
            assert task.finished_node in KINDS[kinds[name]][2], (name, kinds[name], task)
            assert runs[name] >= 1
    for refusal in refusals:  # each refused report came from an attempt that did not complete
        task = tasks[refusal["task"]]
        assert (refusal["attempt"], refusal["node"]) != (task.finished_attempt, task.finished_node)
    reruns = sum(t.reruns for t in tasks.values())
    print(
        json.dumps(
            {
                "store": store,
                "completed": sum(1 for t in tasks.values() if t.state is TaskState.COMPLETE),
                "rerun_attempts": reruns,
                "refused_stale_results": len(refusals),
                "script_runs": sum(runs.values()),
                "counts": final,
                **({"coordinators": served_before_kill} if dsn else {}),
            }
        )
    )
    assert reruns >= 1  # the node kill did cost attempts
