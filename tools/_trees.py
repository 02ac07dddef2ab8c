"""What the in-process benchmarks (tools/bench_mdp_core.py, tools/bench_idle_core.py) share:
the ``--tree`` arguments checked, and one script timed in a process of its own per tree,
interleaved over three rounds, so trees compare within one invocation."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROUNDS = 3


def trees_of(parser: argparse.ArgumentParser, given: list[str]) -> list[Path]:
    """The trees named by ``--tree`` (this checkout when none), each holding scale0/."""
    trees = [Path(t).resolve() for t in given] or [Path(__file__).resolve().parent.parent]
    for tree in trees:
        if not (tree / "scale0").is_dir():
            parser.error(f"--tree {tree}: no scale0/ in it")
    return trees


def time_trees(script: str, arg: str, trees: list[Path], timeout_s: float) -> dict[Path, list[str]]:
    """Run ``python -c script arg`` with each tree on PYTHONPATH, ROUNDS times interleaved;
    each run's stdout, per tree. A failing run ends the program, naming its tree."""
    print(f"load average at the start: {os.getloadavg()[0]:.1f}")
    results: dict[Path, list[str]] = {tree: [] for tree in trees}
    for _ in range(ROUNDS):
        for tree in trees:
            done = subprocess.run(  # noqa: S603 (our own code, our own trees)
                [sys.executable, "-c", script, arg],
                # The loop's Python is what these time: a node they drive by hand never
                # starts the C lane, which would own its sockets and pool (SCALE0_LANE=0)
                env={**os.environ, "PYTHONPATH": str(tree), "SCALE0_LANE": "0"},
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            if done.returncode != 0:
                sys.exit(f"{tree}: {done.stderr.strip() or done.stdout.strip()}")
            results[tree].append(done.stdout.strip())
    return results
