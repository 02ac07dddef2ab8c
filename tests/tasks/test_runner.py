"""The node's runs (R1-R5) with real subprocesses: exit codes, limits, cancel, escapes."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from scale0.tasks import runner
from scale0.tasks.runner import Limits, ScriptRun, call_method, load_callable, start_script

WAIT_S = 30.0


def test_rules_header_lists_r1_to_r5() -> None:
    assert re.findall(r"^(R\d+)\s", runner.__doc__ or "", re.MULTILINE) == [
        f"R{i}" for i in range(1, 6)
    ]


def message(source: str, name: str = "t", **extra: Any) -> dict[str, Any]:
    return {
        "command": "task-run",
        "name": name,
        "attempt": 2,
        "executable_pyscript": source,
        "path": f"{name}/2",
        "log": f"{name}/2/task.log",
        **extra,
    }


def finish(run: ScriptRun) -> str:
    limit = time.monotonic() + WAIT_S
    while time.monotonic() < limit:
        success = run.check(time.monotonic())
        if success is not None:
            return success
        time.sleep(0.02)
    run.cancel()
    raise AssertionError("the run did not end")


def test_ok_with_environment_cwd_and_log(tmp_path: Path) -> None:
    source = (
        "import os\n"
        "print(os.environ['VESPID_TASK'], os.environ['SCALE0_TASK_ATTEMPT'], os.environ['MODE'])\n"
        "print(os.getcwd())\n"
    )
    run = start_script(tmp_path, message(source, environment={"MODE": "fast"}), Limits())
    assert finish(run) == "ok"
    log = (tmp_path / "t/2/task.log").read_text()
    assert log.splitlines() == ["t 2 fast", str(tmp_path / "t/2")]


def test_nonzero_exit_is_error(tmp_path: Path) -> None:
    assert finish(start_script(tmp_path, message("raise SystemExit(3)"), Limits())) == "error"
    assert finish(start_script(tmp_path, message("1/0", name="u"), Limits())) == "error"
    assert "ZeroDivisionError" in (tmp_path / "u/2/task.log").read_text()


def test_wall_time_limit_kills_and_is_fatal(tmp_path: Path) -> None:
    run = start_script(tmp_path, message("import time; time.sleep(60)"), Limits(max_wall_s=0.3))
    assert finish(run) == "fatal"
    assert "max_wall_s" in (tmp_path / "t/2/task.log").read_text()


def test_memory_limit(tmp_path: Path) -> None:
    source = (
        "import time\n"
        "block = bytearray(200 * 1024 * 1024)\n"
        "block[::4096] = b'x' * len(block[::4096])\n"
        "time.sleep(30)\n"
    )
    run = start_script(tmp_path, message(source), Limits(max_memory_mb=100))
    assert finish(run) == "fatal"
    assert "max_memory_mb" in (tmp_path / "t/2/task.log").read_text()


def test_megabytes_of_output_are_cut(tmp_path: Path) -> None:
    source = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    run = start_script(tmp_path, message(source), Limits(max_log_mb=1))
    assert finish(run) == "fatal"
    assert "max_log_mb" in (tmp_path / "t/2/task.log").read_text()[-200:]


def test_cancel_kills_the_process_group(tmp_path: Path) -> None:
    source = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    run = start_script(tmp_path, message(source), Limits())
    pid_file = tmp_path / "t/2/child.pid"
    limit = time.monotonic() + WAIT_S
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < limit, "the script did not start its child"
        time.sleep(0.02)
    child = int(pid_file.read_text())
    run.cancel()
    assert run.cancelled
    assert run.process is not None and run.process.poll() is not None
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        assert time.monotonic() < limit, "the script's child survived the cancel"
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@pytest.mark.parametrize(
    "bad",
    [
        {"path": "/etc"},
        {"path": "../outside"},
        {"log": "../../x.log"},
        {"path": ""},
        {"executable_pyscript": 5},
        {"environment": [1]},
    ],
)
def test_refused_runs_are_fatal_at_once(tmp_path: Path, bad: dict[str, Any]) -> None:
    run = start_script(tmp_path / "root", {**message("print(1)"), **bad}, Limits())
    assert run.process is None
    assert run.check(time.monotonic()) == "fatal"
    assert not (tmp_path / "outside").exists()


def test_call_method_binds_params_and_wraps_errors() -> None:
    add = load_callable("tests.tasks.methods:add")
    assert call_method(add, [2, 3]) == (5, None)
    assert call_method(add, {"a": 1, "b": 2}) == (3, None)
    assert call_method(load_callable("tests.tasks.methods:noop"), None) == (None, None)
    result, error = call_method(load_callable("tests.tasks.methods:fail"), ["nope"])
    assert result is None
    assert error == {"code": -32000, "message": "nope", "data": {"type": "ValueError"}}
    _, error = call_method(add, [1])
    assert error is not None and error["data"]["type"] == "TypeError"
    _, error = call_method(object, None)
    assert error is not None and error["data"]["type"] == "TypeError"
