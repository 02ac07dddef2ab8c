"""``scale0-trend`` as a user runs it: the installed command, its summary, its plain errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scale0.trend.synth import Plan, generate

COMMAND = str(Path(sys.executable).parent / "scale0-trend")


def trend(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})},
    )


def test_a_run_prints_progress_and_a_one_screen_summary(tmp_path: Path) -> None:
    generate(tmp_path / "events", Plan(seed=5, days=0.05, rate=0.3, corrupt=1))
    done = trend(str(tmp_path / "events"), "--out", str(tmp_path / "out"), "--master", "local[1]")
    assert done.returncode == 0, done.stderr
    assert "parsing" in done.stderr and "listing" in done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 24
    assert lines[0].startswith("scale0-trend: ")
    assert "1 corrupt lines skipped" in done.stdout
    assert "broker availability: a " in done.stdout
    assert (tmp_path / "out" / "report.html").is_file()
    assert (tmp_path / "out" / "summary.json").is_file()


def test_a_missing_directory_is_said_plainly(tmp_path: Path) -> None:
    done = trend(str(tmp_path / "nope"), "--out", str(tmp_path / "out"), "-q")
    assert done.returncode == 2
    assert f"scale0-trend: event log directory {tmp_path / 'nope'}: does not exist" in done.stderr
    assert "Traceback" not in done.stderr and "at org.apache" not in done.stderr


def test_missing_java_is_said_plainly(tmp_path: Path) -> None:
    # No java on PATH (an empty directory) and no JAVA_HOME: we must say so, not Spark.
    env = {"PATH": str(tmp_path), "JAVA_HOME": ""}
    done = trend(str(tmp_path), "--out", str(tmp_path / "out"), env=env)
    assert done.returncode == 2
    assert "Java not found: Spark needs Java 17 or 21" in done.stderr
    assert "Traceback" not in done.stderr
