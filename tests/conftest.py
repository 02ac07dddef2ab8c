"""Fixtures shared across test directories: one real local SparkSession for the whole test
session (starting one costs seconds; tests/trend, the event log system test and the Trends
panel's tests use it), and one trend summary made by the real job with it; and ``broker_io``,
which runs a test once per broker I/O (the loop, and the C lane where it is built).

Also Hypothesis's profile for this suite: no per-example deadline. A deadline is a timed
assertion, and speed is measured by the benchmarks, never by a test (on a loaded 2-core
machine an example of a few milliseconds can take half a second).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from scale0.net.lane import LANE_BUILT
from scale0.trend.synth import Plan, generate

settings.register_profile("scale0", deadline=None)
settings.load_profile("scale0")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Timeout of a test that uses ``trend_summary``: the first one starts Spark and runs the job
#: (about 75 s on a loaded 2-core machine); the rest take it as made.
SPARK_TIMEOUT_S = 600

#: The logs behind ``trend_summary``: under three hours of a three-broker family (about 4 300
#: requests), with its outage, worker churn, config versions (one refused) and tasks.
SUMMARY_PLAN = Plan(
    seed=11, days=0.1, rate=0.5, services=4, workers_per_broker=2, outage_min=15,
    tasks_per_min=0.5,
)  # fmt: skip


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from scale0.trend.job import spark_session

    session = spark_session("local[2]", shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def trend_summary(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``summary.json`` written by ``scale0.trend.job.run`` (what ``scale0-trend`` runs) over
    logs from ``tools/gen-events``' generator: made once per test session. Read-only: a test
    that changes it copies it first."""
    from scale0.trend.job import run

    events = tmp_path_factory.mktemp("summary-events")
    generate(events, SUMMARY_PLAN)
    out = tmp_path_factory.mktemp("summary-out")
    run(spark, str(events), out, accuracy=100, report=False)
    path = out / "summary.json"
    assert path.is_file(), f"the job wrote no {path}"
    return path


#: The broker I/Os a test with ``broker_io`` runs over: the loop, and the lane where built.
IO_HERE = ["loop", "lane"] if LANE_BUILT else ["loop"]


@pytest.fixture(params=IO_HERE)
def broker_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once with the frontend and backend sockets on the Tornado loop and once in
    the C lane (``lane: true``, scale0/net/lane.py): ``SCALE0_LANE`` is set (ids ``[loop]``
    and ``[lane]``), and every broker the test starts reads it, in this process or a child.
    A module opts in with ``pytestmark = pytest.mark.usefixtures("broker_io")``. Without the
    extension (tools/test-fallback) only ``[loop]`` runs: the lane is not built there."""
    io: str = request.param
    monkeypatch.setenv("SCALE0_LANE", "1" if io == "lane" else "0")
    return io
