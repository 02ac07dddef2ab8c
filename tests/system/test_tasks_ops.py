"""The operator side of the task coordinator with real processes: `scale0ctl tasks list|info|
cancel|explain` as the installed command against two brokers, a coordinator that checks
credentials (admins_from the family's network config) and a node; the coordinator's /metrics
and status page over real HTTP, and the page in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from scale0.mgmt.taskpage import METRIC_NAMES
from scale0.tasks.client import TaskClient
from scale0.testing import FAMILY_ADMINS, BrokerProcess, running_brokers, wait_until
from tests.system.test_management_browser import (
    browser,  # noqa: F401 (the fixture)
    screenshot,
    wait,
)
from tests.tasks.processes import Proc, coordinator, node, running

pytestmark = pytest.mark.system

RUN_TIMEOUT_S = 60
WAIT_S = 30.0
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}
ADMIN = ("admin", FAMILY_ADMINS["admin"][0])
VIEWER = ("viewer", FAMILY_ADMINS["viewer"][0])
SLEEPER = "import time\ntime.sleep(300)\n"


@dataclass
class Setup:
    brokers: list[BrokerProcess]
    coordinator: Proc
    node: Proc
    home: Path
    url: str  # the coordinator's HTTP endpoint

    def frontend(self, index: int = 0) -> str:
        return self.brokers[index].endpoints["frontend"]


def http_url(proc: Proc) -> str | None:
    for line in proc.stderr.read_text(errors="replace").splitlines():
        if '"coordinator_http"' in line:
            url: str = json.loads(line)["url"]
            return url
    return None


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("tasks-ops")
    with running_brokers(tmp / "family", 2, **FAST) as brokers:
        coord = coordinator(
            tmp,
            brokers[0].endpoints["backend"],
            admins_from=str(tmp / "family" / "network.yaml"),
            http_port=0,
            node_timeout_s=3.0,
            tick_s=0.2,
        )
        agent = node(
            tmp, "n1", brokers[0].endpoints["frontend"], capabilities={"memory": 2000, "cores": 2}
        )
        with running(coord, agent):
            wait_until(lambda: http_url(coord) is not None, "the coordinator's URL", WAIT_S)
            url = http_url(coord)
            assert url is not None and url.startswith("http://127.0.0.1:")
            home = tmp / "home"  # no ~/.config/scale0/credentials of the user running the tests
            home.mkdir()
            auth = dict(zip(("auth_id", "auth_password"), ADMIN, strict=True))
            with TaskClient(brokers[0].endpoints["frontend"], **auth) as client:
                client.create("done", "print('done')", requirements={"memory": 100})
                client.create("failing", "raise SystemExit(3)", requirements={"memory": 100})
                client.create("huge", "print(1)", requirements={"memory": 64000, "cores": 1})
                client.connect("ops")
                assert client.result(client.submit("square", [7], "sq7")) == 49
                assert client.wait_complete("done")["success"] == "ok"
                assert client.wait_complete("failing")["success"] == "error"
            yield Setup(brokers, coord, agent, home, url)


def ctl(
    setup: Setup, *args: str, auth: tuple[str, str] | None = ADMIN, broker: int = 0
) -> tuple[int, str, str]:
    """The installed ``scale0ctl ARGS``; (exit code, stdout, stderr)."""
    path = shutil.which("scale0ctl")
    assert path is not None, "scale0ctl is not installed"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALE0_")}
    env.update(HOME=str(setup.home), SCALE0_BROKER=setup.frontend(broker))
    if auth is not None:
        env.update(SCALE0_AUTH_ID=auth[0], SCALE0_AUTH_PASSWORD=auth[1])
    result = subprocess.run(
        [path, *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=env,
        check=False,
    )
    return result.returncode, result.stdout, result.stderr


def ctl_json(setup: Setup, *args: str, **options: Any) -> tuple[int, dict[str, Any]]:
    code, out, err = ctl(setup, *args, "--json", **options)
    assert err == "", err  # --json: one object on stdout, nothing on stderr
    document = json.loads(out)
    assert isinstance(document, dict)
    return code, document


def test_list_shows_both_protocols_and_filters_by_state(setup: Setup) -> None:
    code, out, err = ctl(setup, "tasks", "list")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == [
        "NAME",
        "PROTOCOL",
        "STATE",
        "SUCCESS",
        "NODE",
        "ATTEMPT",
        "CREATED",
        "STARTED",
        "FINISHED",
    ]
    by_name = {row.split()[0]: row.split() for row in rows if row and not row.startswith("all ")}
    assert by_name["done"][1:6] == ["vespid", "complete", "ok", "n1", "1"]
    assert by_name["failing"][1:4] == ["vespid", "complete", "error"]
    assert by_name["sq7"][1:4] == ["zerotask", "complete", "ok"]
    assert by_name["huge"][1:6] == ["vespid", "pending", "-", "-", "0"]
    assert rows[-1].startswith("all tasks: waiting 0, pending 1,")
    assert "nodes connected 1" in rows[-1]

    code, document = ctl_json(setup, "tasks", "list", "--state", "pending", auth=VIEWER)
    assert code == 0 and document["ok"] is True
    assert [t["name"] for t in document["tasks"]] == ["huge"]
    assert document["tasks"][0]["time-start"] is None
    assert document["counts"]["pending"] == 1
    # Any broker of the family reaches the coordinator.
    code, out, _ = ctl(setup, "tasks", "list", "--state", "complete", broker=1)
    assert code == 0 and "huge" not in out and "sq7" in out
    code, out, err = ctl(setup, "tasks", "list", "--state", "sleeping")
    assert code == 2 and "sleeping" in err  # click's usage error


def test_without_credentials_the_coordinator_refuses_and_says_how(setup: Setup) -> None:
    code, out, err = ctl(setup, "tasks", "list", auth=None)
    assert (code, out) == (1, "")
    assert "task-list needs auth_id and auth_password of an admin" in err
    assert "SCALE0_AUTH_ID" in err
    code, document = ctl_json(setup, "tasks", "explain", "huge", auth=("admin", "wrong"))
    assert (code, document["ok"], document["error"]) == (1, False, "forbidden")
    assert document["code"] == -32008


def test_info_shows_the_whole_task_of_either_protocol(setup: Setup) -> None:
    code, out, err = ctl(setup, "tasks", "info", "done")
    assert (code, err) == (0, "")
    fields = dict(line.split(":", 1) for line in out.splitlines() if not line.startswith(" "))
    assert fields["protocol"].strip() == "vespid"
    assert fields["state"].strip() == "complete" and fields["success"].strip() == "ok"
    assert json.loads(fields["requirements"]) == {"memory": 100}
    assert fields["time-finish"].strip().endswith("Z")
    assert out.splitlines()[-1] == "    print('done')"  # the script, indented
    code, document = ctl_json(setup, "tasks", "info", "sq7", auth=VIEWER)
    assert code == 0
    task = document["task"]
    assert (task["protocol"], task["method"], task["params"], task["owner"]) == (
        "zerotask",
        "square",
        [7],
        "ops",
    )
    assert (task["state"], task["success"], task["node"], task["attempt"]) == (
        "complete",
        "ok",
        "n1",
        1,
    )


@pytest.mark.parametrize("command", ["info", "cancel", "explain"])
def test_an_unknown_task_is_exit_1_naming_it(setup: Setup, command: str) -> None:
    code, out, err = ctl(setup, "tasks", command, "ghost")
    assert (code, out) == (1, "")
    assert "no task 'ghost'" in err
    code, document = ctl_json(setup, "tasks", command, "ghost")
    assert (code, document["ok"], document["error"], document["code"]) == (
        1,
        False,
        "unknown-task",
        -32004,
    )
    assert "no task 'ghost'" in document["errors"][0]["message"]


def test_explain_names_the_failing_requirement(setup: Setup) -> None:
    code, out, err = ctl(setup, "tasks", "explain", "huge", auth=VIEWER)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "huge: pending (vespid)"
    assert lines[1].startswith("why: no node could ever run it: node n1: needs 64000 MB memory")
    assert lines[3].split() == ["NODE", "FITS_NOW", "FITS_IDLE", "REASON"]
    assert lines[4].split()[:3] == ["n1", "no", "no"]
    assert "needs 64000 MB memory" in lines[4]
    code, document = ctl_json(setup, "tasks", "explain", "huge")
    assert code == 0
    assert document["explain"]["nodes"] == [
        {
            "node": "n1",
            "fits": False,
            "fits_idle": False,
            "reason": document["explain"]["nodes"][0]["reason"],
        }
    ]
    assert document["explain"]["nodes"][0]["reason"].startswith("needs 64000 MB memory")
    code, out, _ = ctl(setup, "tasks", "explain", "done")
    assert code == 0 and out.splitlines()[0] == "done: complete (vespid), success ok"


def test_cancel_terminates_a_running_task_and_refuses_a_finished_one(setup: Setup) -> None:
    code, out, err = ctl(setup, "tasks", "cancel", "done")
    assert (code, out) == (1, "")
    assert "task-cancel refused: task 'done' is already complete" in err

    auth = dict(zip(("auth_id", "auth_password"), ADMIN, strict=True))
    with TaskClient(setup.frontend(), **auth) as client:
        client.create("sleeper", SLEEPER, requirements={"memory": 200})
        wait_until(lambda: client.info("sleeper")["state"] == "running", "sleeper running", WAIT_S)
    log = setup.node.config.parent / "n1" / "sleeper" / "1" / "task.log"
    wait_until(log.exists, "the script started", WAIT_S)
    code, out, err = ctl(setup, "tasks", "cancel", "sleeper", auth=VIEWER)
    assert code == 1 and "role admin" in err  # cancelling needs the role that may create
    code, document = ctl_json(setup, "tasks", "cancel", "sleeper")
    assert code == 0
    assert document["cancelled"] == {
        "name": "sleeper",
        "status": "complete",
        "state": "complete",
        "success": "terminated",
        "was": "running",
        "attempt": 1,
        "node": "n1",
    }
    # The node kills the subprocess: its log says so.
    wait_until(lambda: "killed: cancelled" in log.read_text(errors="replace"), "killed", WAIT_S)
    code, out, _ = ctl(setup, "tasks", "list", "--state", "running")
    assert (code, out.splitlines()[0]) == (0, "no running tasks")

    with TaskClient(setup.frontend(), **auth) as client:
        client.create("queued", "print(1)", requirements={"memory": 99999})
    code, out, err = ctl(setup, "tasks", "cancel", "queued")
    assert (code, err) == (0, "")
    assert out == "queued: cancelled (it was pending); success terminated\n"


def test_no_answer_is_exit_4(setup: Setup) -> None:
    code, out, err = ctl(setup, "tasks", "list", "--broker", "tcp://127.0.0.1:1", "--timeout", "1")
    assert (code, out) == (4, "")
    assert "no answer from tcp://127.0.0.1:1 within 1 s" in err
    code, document = ctl_json(
        setup, "tasks", "info", "done", "--service", "nobody", "--timeout", "2"
    )
    assert code == 4
    assert "no task coordinator serv" in document["errors"][0]["message"]
    assert "'nobody'" in document["errors"][0]["message"]


def get(url: str, method: str = "GET", host: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, method=method)
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def samples(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_over_http_match_the_task_list(setup: Setup) -> None:
    status, ctype, text = get(setup.url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name
    values = samples(text)
    _, document = ctl_json(setup, "tasks", "list")
    tasks = document["tasks"]
    for state in ("waiting", "pending", "running", "complete"):
        expected = sum(1 for t in tasks if t["state"] == state)
        assert values[f'scale0_tasks{{state="{state}"}}'] == expected, state
    assert values["scale0_tasks_created_total"] == len(tasks)
    failed = sum(1 for t in tasks if t["success"] in ("error", "fatal", "terminated"))
    assert values["scale0_tasks_failed_total"] == failed >= 1
    assert values['scale0_tasks_completed_total{success="error"}'] >= 1
    pending = [t for t in tasks if t["state"] == "pending"]
    assert values['scale0_tasks_queue_depth{protocol="vespid"}'] == len(pending)
    assert values["scale0_task_nodes_connected"] == 1
    assert values['scale0_task_node_memory_mb{node="n1"}'] == 2000
    assert values['scale0_task_node_cores{node="n1"}'] == 2
    running = sum(1 for t in tasks if t["state"] == "running" and t["node"] == "n1")
    assert values['scale0_task_node_running_tasks{node="n1"}'] == running
    assert values["scale0_tasks_stale_reports_refused_total"] == 0


def test_the_page_over_http_is_read_only(setup: Setup) -> None:
    status, ctype, page = get(setup.url + "/")
    assert status == 200 and ctype.startswith("text/html")
    for element in ('id="queue-depth"', 'id="running"', 'id="failed"', 'id="nodes"'):
        assert element in page
    assert "<td>n1</td><td>yes</td>" in page
    assert get(setup.url + "/static/app.css")[0] == 200
    assert get(setup.url + "/metrics", method="POST")[0] == 405
    port = setup.url.rsplit(":", 1)[1]
    assert get(setup.url + "/", host=f"attacker.example:{port}")[0] == 403
    assert get(setup.url + "/api/status")[0] == 404


def test_the_page_in_chromium(setup: Setup, browser: WebDriver) -> None:  # noqa: F811
    browser.get(setup.url + "/")
    cell = wait(browser, lambda d: d.find_element(By.ID, "queue-depth"), "the summary")
    _, document = ctl_json(setup, "tasks", "list")
    assert int(cell.text) == document["counts"]["pending"]
    assert int(browser.find_element(By.ID, "nodes-connected").text) == 1
    rows = browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")
    assert [row.find_elements(By.TAG_NAME, "td")[0].text for row in rows] == ["n1"]
    assert browser.title == "Scale0 task coordinator"
    screenshot(browser, "coordinator-page.png")
