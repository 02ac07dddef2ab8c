"""tools/bench_pool.py (docs/performance.md, "The worker pool in C"): both sides run the same
requests, and the --only runs its cachegrind command uses exit cleanly."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench_pool.py"
LINE = re.compile(
    r"^(capacity 1|capacity 25, 20 held): WorkerPool \d+ ns/request, "
    r"C Pool \d+ ns/request, C / Python \d+\.\d\d$"
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


@pytest.fixture
def c_built() -> None:
    if importlib.util.find_spec("scale0.core._pool") is None:
        pytest.skip("scale0.core._pool was not built here (no C compiler at install)")


@pytest.mark.usefixtures("c_built")
def test_prints_both_cases_with_a_ratio() -> None:
    done = run("--requests", "500", "--rounds", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert all(LINE.match(line) for line in lines), lines


@pytest.mark.usefixtures("c_built")
@pytest.mark.parametrize(
    "only",
    [["none"], ["python", "--capacity", "25"], ["c", "--capacity", "1"], ["c", "--capacity", "25"]],
)
def test_only_runs_one_side_silently(only: list[str]) -> None:
    done = run("--only", *only, "--requests", "300")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
