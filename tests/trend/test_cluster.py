"""The trend job on a real Spark standalone cluster on loopback (tools/spark-cluster)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scale0.trend.synth import Plan, generate
from tests.trend import reference

TOOL = Path(__file__).resolve().parents[2] / "tools" / "spark_cluster.py"


def run_tool(args: list[str], timeout_s: float) -> tuple[int, str]:
    """tools/spark-cluster in a process group of its own, stopped whole however this ends: its
    Spark master and worker are its children, and killing only the tool would orphan them."""
    process = subprocess.Popen(
        [sys.executable, str(TOOL), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output
    finally:
        if process.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(wait_s)
                    break


@pytest.mark.system
@pytest.mark.timeout(960)  # the job on a fresh cluster takes minutes on a loaded machine
def test_the_job_runs_on_a_standalone_master_and_worker(tmp_path: Path) -> None:
    generate(tmp_path / "events", Plan(seed=9, days=0.02, rate=0.5, corrupt=1))
    events, out = str(tmp_path / "events"), str(tmp_path / "out")
    code, output = run_tool([events, "--out", out, "--cores", "1", "--timeout", "600"], 900)
    assert code == 0, output
    assert "(registered with the master: yes)" in output
    ref = reference.read(tmp_path / "events")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["totals"]["requests"] == len(ref.requests)
    assert summary["input"]["corrupt"] == ref.corrupt == 1
