"""The trend job on a real Spark standalone cluster on loopback (tools/spark-cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scale0.trend.synth import Plan, generate
from tests.trend import reference

TOOL = Path(__file__).resolve().parents[2] / "tools" / "spark_cluster.py"


@pytest.mark.system
def test_the_job_runs_on_a_standalone_master_and_worker(tmp_path: Path) -> None:
    generate(tmp_path / "events", Plan(seed=9, days=0.02, rate=0.5, corrupt=1))
    done = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path / "events"), "--out", str(tmp_path / "out"),
         "--cores", "1", "--timeout", "600"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(registered with the master: yes)" in done.stdout
    ref = reference.read(tmp_path / "events")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["totals"]["requests"] == len(ref.requests)
    assert summary["input"]["corrupt"] == ref.corrupt == 1
