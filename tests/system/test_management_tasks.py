"""The broker page's Tasks panel with real processes: two brokers with their management servers,
a task coordinator (credentials from the family's network config) attached to b1 and a node;
``GET /api/tasks`` on either broker answers the coordinator's numbers through the family, the
panel fills in headless Chromium, and without a coordinator both say so plainly."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from scale0.mgmt.tasks import MAX_CALLS, TaskPanel
from scale0.net.errors import RequestTimeout, ServiceNotFound, ServiceUnavailable
from scale0.net.worker import Worker
from scale0.tasks.client import TaskClient
from scale0.tasks.vespid import DEFAULT_RECENT, MAX_RECENT
from scale0.testing import FAMILY_ADMINS, Family, running_family, wait_until
from tests.system.test_management_browser import (
    browser,  # noqa: F401 (the fixture)
    log_in,
    screenshot,
    wait,
)
from tests.system.test_management_http import Http
from tests.tasks.processes import Proc, coordinator, node, running

pytestmark = pytest.mark.system

WAIT_S = 30.0
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}
#: A third admin the family's brokers know but the coordinator does not (its admins_from
#: file leaves it out): the coordinator's own check refuses it.
ADMINS = {**FAMILY_ADMINS, "outsider": ("outsider-secret", "read")}


def admin_client(endpoint: str) -> TaskClient:
    """A TaskClient with the family admin's credentials (task-create needs role admin)."""
    return TaskClient(endpoint, auth_id="admin", auth_password=FAMILY_ADMINS["admin"][0])


SLEEPER = "import time\ntime.sleep(300)\n"


@dataclass
class Setup:
    family: Family
    coordinator: Proc
    node: Proc

    def http(self, broker: str, user: str = "viewer") -> Http:
        client = Http(self.family[broker].management)
        status, _ = client.login(user, self.family.admins[user][0])
        assert status == 200
        return client


def coordinator_admins(family_dir: Path) -> Path:
    """A copy of the family's network config without ``outsider``, for admins_from."""
    network = yaml.safe_load((family_dir / "network.yaml").read_text())
    network["admins"] = [a for a in network["admins"] if a["auth_id"] != "outsider"]
    path = family_dir / "coordinator-admins.yaml"
    path.write_text(yaml.safe_dump(network))
    return path


def served(frontend: str) -> bool:
    """Whether a coordinator answers through ``frontend`` yet (task-info needs no login)."""
    try:
        with TaskClient(frontend, timeout=2.0, retry_s=0.0) as client:
            return bool(client.command("task-info", name="-")["status"] == "invalid")
    except (ServiceNotFound, ServiceUnavailable, RequestTimeout):
        return False  # not registered yet: 404 past the broker's start-up grace (R7), else waits


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("task-panel")
    with running_family(tmp / "family", size=2, admins=ADMINS, **FAST) as family:
        coord = coordinator(
            tmp,
            family["b1"].endpoints["backend"],
            admins_from=str(coordinator_admins(tmp / "family")),
            node_timeout_s=3.0,
            tick_s=0.2,
        )
        agent = node(tmp, "n1", family["b1"].frontend, capabilities={"memory": 2000, "cores": 2})
        with running(coord, agent):
            wait_until(lambda: served(family["b1"].frontend), "the coordinator serves", WAIT_S)
            with admin_client(family["b1"].frontend) as client:
                client.create("done", "print('done')", requirements={"memory": 100})
                client.create("failing", "raise SystemExit(3)", requirements={"memory": 100})
                client.create("huge", "print(1)", requirements={"memory": 64000, "cores": 1})
                client.create("sleeper", SLEEPER, requirements={"memory": 300, "cores": 1})
                client.connect("ops")
                assert client.result(client.submit("square", [7], "sq7")) == 49
                assert client.wait_complete("done")["success"] == "ok"
                assert client.wait_complete("failing")["success"] == "error"
                wait_until(
                    lambda: client.info("sleeper")["state"] == "running", "sleeper runs", WAIT_S
                )
            yield Setup(family, coord, agent)


def listed(setup: Setup) -> dict[str, Any]:
    with admin_client(setup.family["b1"].frontend) as client:
        return client.command("task-list", auth_id="admin", auth_password=FAMILY_ADMINS["admin"][0])


def test_api_tasks_answers_the_coordinators_numbers_through_the_family(setup: Setup) -> None:
    # The coordinator is attached to b1; b2 asks it through the family.
    status, document = setup.http("b2").json("GET", "/api/tasks")
    assert status == 200, document
    result = document["result"]
    assert (result["coordinator"], result["service"], result["asked_by"]) == (True, "vespid", "b2")
    tasks = listed(setup)["tasks"]
    for state in ("waiting", "pending", "running", "complete"):
        assert result["states"][state] == sum(1 for t in tasks if t["state"] == state), state
    assert result["states"] == {"waiting": 0, "pending": 1, "running": 1, "complete": 3}
    assert result["queue_depth"] == 1 and result["queue"] == {"zerotask": 0, "vespid": 1}
    assert result["failed"] == 1 and result["completed"]["error"] == 1
    assert result["completed"]["ok"] == 2  # done and sq7
    assert result["created"] == len(tasks) == 5
    assert (result["reruns"], result["refused"], result["nodes_connected"]) == (0, 0, 1)
    # Per-node load: the sleeper holds 300 MB and one core of n1.
    assert result["nodes"] == [
        {
            "node": "n1",
            "connected": True,
            "running": 1,
            "memory": 2000,
            "memory_reserved": 300,
            "cores": 2,
            "cores_reserved": 1,
        }
    ]
    rows = {row["name"]: row for row in result["recent"]}
    assert set(rows) == {t["name"] for t in tasks}
    assert rows == {t["name"]: t for t in tasks}  # the same rows as task-list
    assert len(result["recent"]) <= DEFAULT_RECENT
    changed = [
        max(filter(None, (r["time-finish"], r["time-start"], r["time-create"])))
        for r in result["recent"]
    ]
    assert changed == sorted(changed, reverse=True)  # newest change first
    assert isinstance(result["time"], float)


def test_the_same_numbers_from_the_broker_the_coordinator_is_attached_to(setup: Setup) -> None:
    status, document = setup.http("b1", "admin").json("GET", "/api/tasks?recent=2")
    assert status == 200
    result = document["result"]
    assert result["asked_by"] == "b1"
    assert len(result["recent"]) == 2
    assert result["states"]["complete"] == 3


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        (f"recent={MAX_RECENT + 1}", f"from 0 to {MAX_RECENT}"),
        ("recent=-1", f"from 0 to {MAX_RECENT}"),
        ("recent=two", "got 'two'"),
        ("state=running", "unknown argument 'state'"),
    ],
)
def test_a_bad_query_is_400_naming_it(setup: Setup, query: str, needle: str) -> None:
    status, document = setup.http("b2").json("GET", f"/api/tasks?{query}")
    assert status == 400 and document["code"] == 400
    assert needle in document["message"]


def test_without_a_session_it_is_401(setup: Setup) -> None:
    status, document = Http(setup.family["b2"].management).json("GET", "/api/tasks")
    assert status == 401 and document["code"] == 401


def test_the_coordinator_checks_the_credentials_itself(setup: Setup) -> None:
    """An admin of the family that the coordinator's admins_from does not list: the broker
    lets them see its page, the coordinator refuses them task-stats, and the API says so."""
    status, document = setup.http("b2", "outsider").json("GET", "/api/tasks")
    assert status == 403, document
    assert document["result"]["reason"] == "refused"
    assert document["message"].startswith("the task coordinator refused: task-stats needs")
    # The broker's own commands still work for them.
    assert setup.http("b2", "outsider").json("GET", "/api/status")[0] == 200


def test_the_panel_is_a_client_of_its_broker_operators_can_see(setup: Setup) -> None:
    client = setup.http("b2")
    assert client.json("GET", "/api/tasks")[0] == 200
    status, document = client.json("GET", "/api/list_clients")
    assert status == 200
    ids = [c["client_id"] for c in document["result"]["clients"]]
    assert any(i.startswith("b2.management-") for i in ids), ids


def test_a_disabled_broker_still_shows_the_tasks_through_the_family(setup: Setup) -> None:
    """b2 disabled sends its clients to an active member (301), the panel's client too: the
    page of b2 still shows the coordinator's numbers, asked through b1."""
    admin = setup.http("b2", "admin")
    assert admin.json("GET", "/api/tasks")[0] == 200  # the panel's client is on b2 now
    status, document = admin.json("POST", "/api/disable", {})
    assert status == 200 and document["result"]["state"] == "disabled", document
    try:
        status, document = admin.json("GET", "/api/tasks")
        assert status == 200, document
        assert (document["result"]["asked_by"], document["result"]["created"]) == ("b2", 5)
        status, document = setup.http("b1", "admin").json("GET", "/api/list_clients")
        ids = [c["client_id"] for c in document["result"]["clients"]]
        assert any(i.startswith("b2.management-") for i in ids), ids  # now a client of b1
    finally:
        assert admin.json("POST", "/api/enable", {})[0] == 200


# ---- in Chromium ----------------------------------------------------------------------------


def cells(row: Any) -> list[str]:
    return [c.text for c in row.find_elements(By.TAG_NAME, "td")]


def test_the_panel_fills_in_chromium(setup: Setup, browser: WebDriver) -> None:  # noqa: F811
    log_in(browser, setup.family, "viewer", broker="b2")
    wait(browser, lambda d: d.find_element(By.ID, "tasks-body").is_displayed(), "the Tasks panel")
    _, document = setup.http("b2").json("GET", "/api/tasks")
    result = document["result"]
    shown = {
        key: browser.find_element(By.ID, f"tasks-{key}").text
        for key in ("queue-depth", "waiting", "running", "complete", "failed", "created")
    }
    assert shown == {
        "queue-depth": str(result["queue_depth"]),
        "waiting": "0",
        "running": "1",
        "complete": "3",
        "failed": "1",
        "created": "5",
    }
    assert browser.find_element(By.ID, "tasks-nodes-connected").text == "1"
    assert browser.find_element(By.ID, "tasks-asked-by").text == "b2"
    assert browser.find_element(By.ID, "tasks-note").text == ""
    (row,) = browser.find_elements(By.CSS_SELECTOR, "#task-nodes tbody tr")
    assert row.get_attribute("data-node") == "n1"
    assert cells(row) == ["n1", "yes", "1", "300 / 2000", "1 / 2"]
    names = [
        r.get_attribute("data-task") or ""
        for r in browser.find_elements(By.CSS_SELECTOR, "#task-recent tbody tr")
    ]
    assert sorted(names) == ["done", "failing", "huge", "sleeper", "sq7"]
    failing = browser.find_element(By.CSS_SELECTOR, "#task-recent tr[data-task='failing']")
    assert cells(failing)[:6] == ["failing", "vespid", "complete", "error", "n1", "1"]
    assert failing.get_attribute("class") == "failed"  # in red
    done = browser.find_element(By.CSS_SELECTOR, "#task-recent tr[data-task='done']")
    assert cells(done)[:6] == ["done", "vespid", "complete", "ok", "n1", "1"]
    assert not done.get_attribute("class")

    # A new task shows at the top of the recent list at the next refresh, and the counts move.
    with admin_client(setup.family["b1"].frontend) as client:
        client.create("fresh", "print('fresh')", requirements={"memory": 100})
        assert client.wait_complete("fresh")["success"] == "ok"

    def fresh_first(d: WebDriver) -> bool | None:
        rows = d.find_elements(By.CSS_SELECTOR, "#task-recent tbody tr")
        return (bool(rows) and rows[0].get_attribute("data-task") == "fresh") or None

    wait(browser, fresh_first, "the new task first in the recent list")
    wait(
        browser,
        lambda d: d.find_element(By.ID, "tasks-created").text == "6" or None,
        "six tasks created",
    )
    browser.execute_script("document.getElementById('tasks').scrollIntoView()")
    screenshot(browser, "management-tasks.png")


# ---- without a coordinator -------------------------------------------------------------------


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    """One broker, no coordinator anywhere in its family; its panel asks for ``vespid``. A
    broker younger than request_timeout_ms lets a request for an unknown service wait (R7),
    so that grace is short here."""
    with running_family(
        tmp_path_factory.mktemp("no-coordinator"), size=1, request_timeout_ms=3000, **FAST
    ) as family:
        yield family


def test_no_coordinator_is_503_saying_so(lone: Family) -> None:
    client = Http(lone["b1"].management)
    assert client.login("viewer", lone.admins["viewer"][0])[0] == 200
    answers: list[tuple[int, Any]] = []

    def not_served() -> bool:
        answers.append(client.json("GET", "/api/tasks"))
        return answers[-1][0] == 503

    # While the broker is young (R7's grace) the request waits and the panel's timeout ends
    # it: 504, also saying that no coordinator answered. After that, 503 at once.
    wait_until(not_served, "503 not-served", WAIT_S)
    for status, document in answers[:-1]:
        assert (status, document["result"]["reason"]) == (504, "no-answer"), document
        assert document["message"].startswith("no task coordinator serving 'vespid' answered")
    status, document = answers[-1]
    assert document["result"] == {
        "coordinator": False,
        "service": "vespid",
        "asked_by": "b1",
        "reason": "not-served",
    }
    assert document["message"].startswith("no task coordinator serves 'vespid' in this family")
    # The rest of the API is untouched.
    assert client.json("GET", "/api/status")[0] == 200


def test_the_panels_client_leaves_when_nobody_looks(lone: Family) -> None:
    """Q1 with a real broker: the panel's client is a session of the broker while the panel is
    used and gone (DISCONNECT) once it has been idle; the next request opens a new one."""
    viewer = Http(lone["b1"].management)
    assert viewer.login("viewer", lone.admins["viewer"][0])[0] == 200

    def clients() -> list[str]:
        status, document = viewer.json("GET", "/api/list_clients")
        assert status == 200
        return [c["client_id"] for c in document["result"]["clients"]]

    async def main() -> None:
        panel = TaskPanel(lambda: lone["b1"].frontend, "probe", "vespid", 1.0, idle_close_s=0.5)

        def connected() -> bool:  # a call, so the checker does not take it for a constant
            return panel.connected

        try:
            status, _ = await panel.ask("viewer", lone.admins["viewer"][0], 1)
            assert status in (503, 504)  # no coordinator in this family
            assert connected()
            assert "probe.management-1" in await asyncio.to_thread(clients)
            for _ in range(100):  # bounded: 10 s
                if not connected():
                    break
                await asyncio.sleep(0.1)
            assert not connected(), "the idle client was not closed"
            for _ in range(100):
                if "probe.management-1" not in await asyncio.to_thread(clients):
                    break
                await asyncio.sleep(0.1)
            assert "probe.management-1" not in await asyncio.to_thread(clients)
            await panel.ask("viewer", lone.admins["viewer"][0], 1)
            assert "probe.management-2" in await asyncio.to_thread(clients)
        finally:
            await panel.close()
        assert not connected()

    asyncio.run(asyncio.wait_for(main(), 60.0))


def test_no_coordinator_in_chromium(lone: Family, browser: WebDriver) -> None:  # noqa: F811
    log_in(browser, lone, "viewer")
    note = wait(
        browser,
        lambda d: (
            text
            if (text := d.find_element(By.ID, "tasks-note").text).startswith(
                "No task coordinator serves 'vespid' in this family"
            )
            else None
        ),
        "the note that no coordinator serves",
    )
    assert "start scale0-coordinator" in note
    note_class = browser.find_element(By.ID, "tasks-note").get_attribute("class") or ""
    assert "error" not in note_class  # said plainly, not as an error
    assert not browser.find_element(By.ID, "tasks-body").is_displayed()
    # The rest of the page works as ever.
    wait(
        browser,
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")) == 1 or None,
        "the broker table",
    )
    browser.execute_script("document.getElementById('tasks').scrollIntoView()")
    screenshot(browser, "management-tasks-none.png")


# ---- a service that does not answer, or answers nonsense ----------------------------------


def test_calls_are_bounded_in_number_and_time_and_nonsense_is_502(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """What a coordinator cannot be made to do on cue, a real worker in this process does: it
    serves the panel's service and holds every request until told. MAX_CALLS requests wait
    there; one more is 503 ``busy`` at once (Q2); the waiting ones end after
    ``tasks_timeout_ms`` with 504 ``no-answer`` (Q3); then an answer that is not JSON is 502
    ``bad-answer`` (Q4), and so is a handler that fails."""
    tmp = tmp_path_factory.mktemp("bounded")
    entered = threading.Semaphore(0)
    release = threading.Event()
    raising = threading.Event()

    def held(body: list[bytes]) -> bytes:
        if raising.is_set():
            raise RuntimeError("stats are broken")
        entered.release()
        release.wait(WAIT_S)
        return b"this is not JSON"

    overrides = [{"tasks_service": "held-stats", "tasks_timeout_ms": 3000}]
    with running_family(tmp / "family", size=1, management_overrides=overrides, **FAST) as family:
        worker = Worker(
            family["b1"].endpoints["backend"], {"held-stats": held}, capacity=MAX_CALLS + 1
        ).start_in_thread()
        try:
            assert worker.wait_registered(WAIT_S)
            client = Http(family["b1"].management)
            assert client.login("viewer", family.admins["viewer"][0])[0] == 200
            with concurrent.futures.ThreadPoolExecutor(MAX_CALLS) as pool:
                waiting = [pool.submit(client.json, "GET", "/api/tasks") for _ in range(MAX_CALLS)]
                for _ in range(MAX_CALLS):  # every one of them is at the worker now
                    assert entered.acquire(timeout=WAIT_S)
                status, document = client.json("GET", "/api/tasks")
                assert (status, document["result"]["reason"]) == (503, "busy"), document
                assert f"{MAX_CALLS} task panel requests are waiting" in document["message"]
                answers = [future.result(timeout=WAIT_S) for future in waiting]
            for status, document in answers:
                assert (status, document["result"]["reason"]) == (504, "no-answer"), document
                assert document["message"] == (
                    "no task coordinator serving 'held-stats' answered within 3 s "
                    "(is scale0-coordinator running?)"
                )
            release.set()
            status, document = client.json("GET", "/api/tasks")
            assert (status, document["result"]["reason"]) == (502, "bad-answer"), document
            assert document["message"] == "the coordinator's answer is not JSON"
            raising.set()  # the handler fails: the worker answers 500
            status, document = client.json("GET", "/api/tasks")
            assert (status, document["result"]["reason"]) == (502, "bad-answer"), document
            assert document["message"].startswith("the coordinator failed: ")
            assert "stats are broken" in document["message"]
        finally:
            release.set()
            worker.stop()
