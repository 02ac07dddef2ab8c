"""scale0ctl tasks without a family: credentials, no answer, and the printing of each command.

The four commands against real brokers, a coordinator and a node are
tests/system/test_tasks_ops.py; here what happens before or instead of an answer, and the
pure printing helpers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from scale0.cli import tasks
from scale0.cli.admin import EXIT_FAILED, EXIT_NO_ANSWER, AdminFailed
from scale0.cli.ctl import main
from scale0.cli.tasks import optional_credentials
from scale0.testing import pick_free_ports


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No credentials in the environment; HOME is an empty temporary directory."""
    for name in ("SCALE0_AUTH_ID", "SCALE0_AUTH_PASSWORD", "SCALE0_CREDENTIALS", "SCALE0_BROKER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def silent_endpoint() -> str:
    (port,) = pick_free_ports(1)
    return f"tcp://127.0.0.1:{port}"


def test_credentials_are_optional_unless_named(
    no_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert optional_credentials(None) is None  # an open coordinator needs none
    with pytest.raises(AdminFailed, match="credentials file not found"):
        optional_credentials(str(no_env / "missing.json"))
    default = no_env / ".config" / "scale0" / "credentials"
    default.parent.mkdir(parents=True)
    default.write_text(json.dumps({"auth_id": "ops", "password": "pw"}))
    default.chmod(0o644)
    with pytest.raises(AdminFailed, match="chmod 600"):  # present, so used, so checked
        optional_credentials(None)
    default.chmod(0o600)
    found = optional_credentials(None)
    assert found is not None and (found.auth_id, found.password) == ("ops", "pw")
    monkeypatch.setenv("SCALE0_AUTH_ID", "env")
    monkeypatch.setenv("SCALE0_AUTH_PASSWORD", "envpw")
    found = optional_credentials(None)
    assert found is not None and found.auth_id == "env"


def test_a_named_missing_credentials_file_is_exit_1(no_env: Path) -> None:
    missing = str(no_env / "nope.json")
    result = run("tasks", "list", "--credentials", missing, "--broker", silent_endpoint())
    assert result.exit_code == EXIT_FAILED
    assert "credentials file not found" in result.stderr


@pytest.mark.parametrize("command", [["list"], ["info", "x"], ["cancel", "x"], ["explain", "x"]])
def test_no_answer_is_exit_4_and_one_json_object(no_env: Path, command: list[str]) -> None:
    endpoint = silent_endpoint()
    result = run("--json", "tasks", *command, "--broker", endpoint, "--timeout", "0.3")
    assert result.exit_code == EXIT_NO_ANSWER and result.stderr == ""
    document = json.loads(result.stdout)
    assert (document["ok"], document["broker"]) == (False, endpoint)
    assert document["command"] == f"tasks {command[0]}"
    assert f"no answer from {endpoint} within 0.3 s" in document["errors"][0]["message"]


def test_usage_errors_are_exit_2(no_env: Path) -> None:
    assert run("tasks", "list", "--state", "sleeping").exit_code == 2
    assert run("tasks", "info").exit_code == 2  # NAME is required
    assert run("tasks", "frobnicate").exit_code == 2


def test_list_lines() -> None:
    reply = {
        "tasks": [
            {"name": "b", "protocol": "zerotask", "state": "pending", "time-create": 2.0},
            {
                "name": "a",
                "protocol": "vespid",
                "state": "complete",
                "success": "ok",
                "node": "n1",
                "attempt": 1,
                "time-create": 0.0,
                "time-start": 60.0,
                "time-finish": 3600.0,
            },
        ],
        "counts": {"pending": 1, "complete": 1, "reruns": 2, "refused": 3, "nodes": 1},
    }
    lines = tasks._list_lines(reply, None)
    assert lines[0].split()[:3] == ["NAME", "PROTOCOL", "STATE"]
    assert lines[1].split() == [
        "a",
        "vespid",
        "complete",
        "ok",
        "n1",
        "1",
        "01-01",
        "00:00:00",
        "01-01",
        "00:01:00",
        "01-01",
        "01:00:00",
    ]
    assert lines[2].split()[:6] == ["b", "zerotask", "pending", "-", "-", "-"]
    assert lines[3] == (
        "all tasks: waiting 0, pending 1, running 0, complete 1; re-runs 2, refused reports 3; "
        "nodes connected 1"
    )
    assert tasks._list_lines({"tasks": [], "counts": {}}, "running")[0] == "no running tasks"


def test_info_lines_put_the_script_last() -> None:
    lines = tasks._info_lines(
        {
            "command": "task-info-response",
            "name": "job",
            "state": "pending",
            "requirements": {"memory": 5},
            "time-create": 0.0,
            "executable_pyscript": "import os\nprint(os.getcwd())",
            "newfield": 1,
        }
    )
    assert lines[0] == "name:         job"
    assert 'requirements: {"memory": 5}' in lines
    assert "time-create:  1970-01-01T00:00:00Z" in lines
    assert "newfield:     1" in lines  # fields added later are shown too
    assert lines[-3:] == ["executable_pyscript:", "    import os", "    print(os.getcwd())"]


def test_cancel_and_explain_lines() -> None:
    running = {"name": "t", "was": "running", "attempt": 2, "node": "n1", "success": "terminated"}
    assert tasks._cancel_lines(running) == [
        "t: cancelled (it was running: attempt 2 on node n1, which is told to kill it); "
        "success terminated"
    ]
    explained = tasks._explain_lines(
        {
            "name": "t",
            "state": "pending",
            "protocol": "vespid",
            "explain": "no node has room now: ...",
            "nodes": [
                {"node": "n1", "fits": False, "fits_idle": True, "reason": "needs 2 cores"},
                {"node": "n2", "fits": False, "fits_idle": False, "reason": "not connected"},
            ],
        }
    )
    assert explained[:2] == ["t: pending (vespid)", "why: no node has room now: ..."]
    assert explained[3].split() == ["NODE", "FITS_NOW", "FITS_IDLE", "REASON"]
    assert explained[4].split() == ["n1", "no", "yes", "needs", "2", "cores"]
    lonely = tasks._explain_lines(
        {"name": "t", "state": "pending", "protocol": "vespid", "explain": "x", "nodes": []}
    )
    assert lonely[-1] == "no node is known to the coordinator"
