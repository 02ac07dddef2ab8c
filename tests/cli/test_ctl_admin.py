"""scale0ctl's broker commands without a family: credentials, exit codes, tables, completion.

Talking to real brokers is tests/system/test_management_ctl.py; here the failures that happen
before or instead of an answer, and the pure printing helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from scale0.cli.admin import (
    EXIT_FAILED,
    EXIT_NO_ANSWER,
    AdminFailed,
    family_lines,
    human_lines,
    load_credentials,
    table,
)
from scale0.cli.ctl import main
from scale0.testing import pick_free_ports

ADMIN_COMMANDS = ("status", "services", "workers", "clients", "peers", "disable", "enable")


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No credentials in the environment; HOME is an empty temporary directory."""
    for name in ("SCALE0_AUTH_ID", "SCALE0_AUTH_PASSWORD", "SCALE0_CREDENTIALS", "SCALE0_BROKER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def silent_endpoint() -> str:
    (port,) = pick_free_ports(1)
    return f"tcp://127.0.0.1:{port}"


def write_credentials(path: Path, mode: int, document: Any) -> Path:
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    path.chmod(mode)
    return path


# ---- credentials -------------------------------------------------------------------------------


def test_environment_credentials_come_first(no_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_credentials(no_env / "c", 0o600, {"auth_id": "file", "password": "f"})
    monkeypatch.setenv("SCALE0_CREDENTIALS", str(no_env / "c"))
    monkeypatch.setenv("SCALE0_AUTH_ID", "env")
    monkeypatch.setenv("SCALE0_AUTH_PASSWORD", "e")
    creds = load_credentials(None)
    assert (creds.auth_id, creds.password) == ("env", "e")


def test_credentials_file_at_the_default_path(no_env: Path) -> None:
    default = no_env / ".config" / "scale0"
    default.mkdir(parents=True)
    write_credentials(default / "credentials", 0o600, {"auth_id": "a", "password": "p w"})
    creds = load_credentials(None)
    assert (creds.auth_id, creds.password) == ("a", "p w")


@pytest.mark.parametrize(
    ("mode", "content", "words"),
    [
        (0o644, {"auth_id": "a", "password": "p"}, "open to group or others (mode 0644)"),
        (0o640, {"auth_id": "a", "password": "p"}, "chmod 600"),
        (0o600, "{not json", "not valid JSON"),
        (0o600, ["a", "p"], 'expected {"auth_id"'),
        (0o600, {"auth_id": "", "password": "p"}, "auth_id must be a non-empty string"),
        (0o600, {"auth_id": "a", "password": 5}, "password must be a string"),
    ],
)
def test_bad_credentials_files_are_refused_saying_why(
    no_env: Path, mode: int, content: Any, words: str
) -> None:
    path = write_credentials(no_env / "creds", mode, content)
    with pytest.raises(AdminFailed) as failure:
        load_credentials(str(path))
    assert words in failure.value.message and str(path) in failure.value.message


def test_no_credentials_at_all_says_where_to_put_them(no_env: Path) -> None:
    result = run("status", "--broker", silent_endpoint())
    assert result.exit_code == EXIT_FAILED
    assert "SCALE0_AUTH_ID" in result.stderr and "mode 0600" in result.stderr


def test_there_is_no_password_option(no_env: Path) -> None:
    for command in ADMIN_COMMANDS:
        help_text = run(command, "--help").stdout
        assert "--password" not in help_text and "--broker" in help_text, command
        assert "--timeout" in help_text and "--json" in help_text, command


# ---- exit codes without an answer --------------------------------------------------------------


def test_no_answer_within_the_timeout_is_exit_4(no_env: Path) -> None:
    env = {"SCALE0_AUTH_ID": "admin", "SCALE0_AUTH_PASSWORD": "x"}
    result = run("status", "--broker", silent_endpoint(), "--timeout", "0.3", env=env)
    assert result.exit_code == EXIT_NO_ANSWER
    assert "no answer from tcp://127.0.0.1:" in result.stderr and "0.3 s" in result.stderr


def test_no_answer_in_json_is_one_object(no_env: Path) -> None:
    env = {"SCALE0_AUTH_ID": "admin", "SCALE0_AUTH_PASSWORD": "x"}
    endpoint = silent_endpoint()
    result = run("--json", "disable", "--broker", endpoint, "--timeout", "0.2", env=env)
    assert result.exit_code == EXIT_NO_ANSWER and result.stderr == ""
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["broker"] == endpoint
    assert document["command"] == "disable"
    assert "no answer" in document["errors"][0]["message"]


def test_timeout_out_of_range_is_a_usage_error(no_env: Path) -> None:
    assert run("status", "--timeout", "0").exit_code == 2


# ---- printing ----------------------------------------------------------------------------------


def test_table_aligns_columns_and_shows_missing_values_as_dash() -> None:
    lines = table([{"a": "x", "b": 1}, {"a": "longer", "b": None}], [("a", "NAME"), ("b", "COUNT")])
    assert lines == ["NAME    COUNT", "x       1", "longer  -"]


def test_family_lines_name_silent_and_refusing_brokers() -> None:
    result = {
        "brokers": [
            {"broker": "b1", "code": 200, "result": {"clients": [{"client_id": "c1"}]}},
            {"broker": "b2", "code": 503, "message": "broker b2 is disabled", "result": None},
            {"broker": "b3", "code": None, "message": "did not answer in time", "result": None},
        ]
    }
    lines, problems = family_lines("list_clients", result)
    assert lines[0].split()[:2] == ["BROKER", "CLIENT"]
    assert lines[1].split()[:2] == ["b1", "c1"]
    assert problems == ["b2: 503 broker b2 is disabled", "b3: did not answer"]


def test_unknown_results_are_printed_generically() -> None:
    lines = human_lines("list_things", {"things": [{"broker": "b2", "state": "up"}]})
    assert lines == ["BROKER  STATE", "b2      up"]
    assert human_lines("whatever", 5) == ["5"]


def test_status_says_what_the_lane_did_only_while_it_runs() -> None:
    status: dict[str, Any] = {"broker": "b1", "state": "active", "lane": None}
    assert not [line for line in human_lines("status", status) if line.startswith("lane:")]
    status["lane"] = {
        "beats": 1200, "answers": 600, "passed": 7, "stalled": 0,
        "requests": 900, "replies": 880, "waiting": 12, "handed": 8, "forwards": 30,
        "forwarded": 40,
    }  # fmt: skip
    lines = human_lines("status", status)
    (at,) = [n for n, line in enumerate(lines) if line.startswith("lane:")]
    assert lines[at].split() == [
        "lane:", "HEARTBEATs", "taken", "1200", "answered", "600", "passed", "to", "the",
        "loop", "7", "stalled", "0",
    ]  # fmt: skip
    assert lines[at + 1].split() == [
        "requests", "taken", "900", "answered", "880", "waiting", "12", "handed", "to", "the",
        "loop", "8",
    ]  # fmt: skip
    assert lines[at + 2].split() == [
        "peers'", "FORWARDs", "taken", "30", "requests", "forwarded", "to", "peers", "40",
    ]  # fmt: skip


# ---- completion --------------------------------------------------------------------------------


def test_completion_script_for_bash() -> None:
    result = run("completion", "bash")
    assert result.exit_code == 0
    assert "_SCALE0CTL_COMPLETE" in result.stdout and "complete " in result.stdout


def test_completion_completes_commands_and_options() -> None:
    script = shutil.which("scale0ctl")
    assert script is not None

    def complete(words: str) -> list[str]:
        env = {
            **os.environ,
            "_SCALE0CTL_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        }
        out = subprocess.run(
            [script], env=env, capture_output=True, text=True, timeout=30, check=False
        ).stdout
        return [line.split(",", 1)[1] for line in out.splitlines() if "," in line]

    assert "status" in complete("scale0ctl sta")
    assert {"disable", "services"} <= set(complete("scale0ctl "))
    assert "--family" in complete("scale0ctl status --fa")
