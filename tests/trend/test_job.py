"""The Spark job on a real local session over generated logs, against tests/trend/reference.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from scale0.trend.synth import DEFAULT_START_MS, Plan, generate
from tests.trend import reference

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from scale0.trend.job import RunResult

ACCURACY = 100  # coarse on purpose: the documented bound is then what is tested
PLAN = Plan(
    seed=3, days=0.25, rate=0.6, services=4, workers_per_broker=3, outage_min=20,
    tasks_per_min=1.0, corrupt=3, newer=2,
)  # fmt: skip
DAY2 = Plan(
    seed=4, start_ms=DEFAULT_START_MS + 86_400_000, days=0.1, rate=0.5, services=4,
    workers_per_broker=2, outage=False, tasks_per_min=0.5,
)  # fmt: skip


def rows(spark: SparkSession, path: Path, time_column: str | None = None) -> list[dict[str, Any]]:
    """A table's rows; its time column as ms since the epoch (no local-zone datetimes)."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(path))
    if time_column:
        frame = frame.withColumn(time_column, F.unix_millis(F.col(time_column)))
    return [r.asDict() for r in frame.collect()]


@pytest.fixture(scope="module")
def first_run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    from scale0.trend.job import run

    src = tmp_path_factory.mktemp("events")
    generate(src, PLAN)
    return run(spark, str(src), tmp_path_factory.mktemp("out"), accuracy=ACCURACY)


@pytest.fixture(scope="module")
def ref(first_run: RunResult) -> reference.Reference:
    return reference.read(Path(first_run.source))


def test_bad_lines_are_skipped_and_counted_and_newer_versions_reported(
    first_run: RunResult, ref: reference.Reference
) -> None:
    inp = first_run.summary["input"]
    assert (inp["corrupt"], inp["newer"], inp["invalid"]) == (3, 2, 0)
    assert (ref.corrupt, ref.newer) == (3, 2)
    assert inp["newer_versions"] == [2]
    assert inp["good"] == len(ref.good)
    assert first_run.files_new == first_run.files_total == ref.files


@pytest.mark.parametrize(("grain", "ms"), [("minute", 60_000), ("hour", 3_600_000)])
def test_service_tables_count_exactly_and_percentiles_stay_in_bounds(
    spark: SparkSession, first_run: RunResult, ref: reference.Reference, grain: str, ms: int
) -> None:
    expected = reference.grouped(ref, ms)
    got = {
        (r["service"], r[grain]): r
        for r in rows(spark, first_run.out / "tables" / f"service_{grain}", grain)
    }
    assert set(got) == set(expected)
    for key, want in expected.items():
        row = got[key]
        assert row["requests"] == want["requests"], key
        assert row["errors"] == want["errors"], key
        assert row["error_rate"] == want["errors"] / want["requests"]
        assert row["throughput_rps"] == want["requests"] / (ms / 1000)
        assert (row["bytes_in"], row["bytes_out"]) == (want["bytes_in"], want["bytes_out"])
        for p, column in ((0.5, "p50_ms"), (0.95, "p95_ms"), (0.99, "p99_ms")):
            low, high = reference.percentile_bounds(want["lat"], p, ACCURACY)
            assert low <= row[column] <= high, (key, column, row[column], low, high)


def test_error_rates_by_status_are_exact(
    spark: SparkSession, first_run: RunResult, ref: reference.Reference
) -> None:
    expected = reference.grouped(ref, 3_600_000)
    got = rows(spark, first_run.out / "tables" / "status_hour", "hour")
    assert len(got) == sum(len(g["status"]) for g in expected.values())
    for row in got:
        want = expected[(row["service"], row["hour"])]
        assert row["requests"] == want["status"][row["status"]]
        assert row["share"] == want["status"][row["status"]] / want["requests"]
    assert {r["status"] for r in got} >= {200, 500}


def test_availability_and_load_share_are_exact(
    first_run: RunResult, ref: reference.Reference
) -> None:
    workers, brokers = reference.availability(ref)
    got_workers = {(w["broker"], w["worker"]): w for w in first_run.summary["workers"]}
    got_brokers = {b["broker"]: b for b in first_run.summary["brokers"]}
    assert set(got_workers) == set(workers)
    assert set(got_brokers) == set(brokers)
    for key, want in [*workers.items(), *brokers.items()]:
        got = got_workers[key] if isinstance(key, tuple) else got_brokers[key]
        assert got["availability"] == want["availability"], key
        if want["availability"] is not None:
            assert (got["up_ms"], got["observed_ms"]) == (want["up_ms"], want["observed_ms"])
        assert got.get("load_share") == want.get("load_share"), key
    # The outage shows: the last broker was down for about outage_min minutes.
    victim = brokers[PLAN.brokers[-1]]
    down_min = (victim["observed_ms"] - victim["up_ms"]) / 60_000
    assert PLAN.outage_min <= down_min <= PLAN.outage_min + 1
    assert all(brokers[b]["availability"] == 1.0 for b in PLAN.brokers[:-1])
    assert min(w["availability"] for w in workers.values() if w["availability"]) < 1.0


def test_config_timeline_management_and_tasks(
    first_run: RunResult, ref: reference.Reference
) -> None:
    summary = first_run.summary
    changes = [r for r in ref.good if r["kind"] in ("config_applied", "config_refused")]
    assert len(summary["config_changes"]) == len(changes)
    assert [c["at"] for c in summary["config_changes"]] == sorted(
        c["at"] for c in summary["config_changes"]
    )
    assert sum(c["outcome"] == "refused" for c in summary["config_changes"]) == sum(
        r["kind"] == "config_refused" for r in changes
    )
    assert len(summary["management"]) == sum(
        r["kind"] in ("mgmt_command", "state_change") for r in ref.good
    )
    ends: dict[str, int] = {}
    for r in ref.good:
        if r["kind"] == "task" and r["state"] in ("done", "failed"):
            ends[r["task_id"]] = r["ts_ms"]
    assert sum(t["finished"] for t in summary["tasks"]) == len(ends)
    totals = summary["totals"]
    assert totals["requests"] == len(ref.requests)
    assert totals["errors"] == sum(r["status"] >= 400 for r in ref.requests)


def test_summary_and_report_are_written_and_the_report_is_self_contained(
    first_run: RunResult,
) -> None:
    summary = json.loads((first_run.out / "summary.json").read_text())
    assert summary["totals"] == first_run.summary["totals"]
    html = (first_run.out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') >= 5
    for remote in ("http://", "https://", "<script", "<link"):
        assert remote not in html
    assert "2 records of schema version 2 were not read" in html


def test_a_rerun_reads_only_new_files_and_recomputes_only_their_dates(
    spark: SparkSession, tmp_path: Path
) -> None:
    from scale0.trend.job import run

    src, out = tmp_path / "events", tmp_path / "out"
    generate(src, PLAN)
    one = run(spark, str(src), out, accuracy=ACCURACY, report=False)
    generate(src, DAY2)
    two = run(spark, str(src), out, accuracy=ACCURACY, report=False)
    ref = reference.read(src)
    assert two.files_new == ref.files - one.files_total > 0
    assert two.dates == ["2026-11-19"]
    assert two.summary["totals"]["requests"] == len(ref.requests)
    assert two.summary["input"]["good"] == len(ref.good)
    # Nothing new: nothing read, nothing recomputed, the same answers.
    three = run(spark, str(src), out, accuracy=ACCURACY, report=False)
    assert (three.files_new, three.dates) == (0, [])
    assert three.summary["totals"] == two.summary["totals"]
    hour = rows(spark, out / "tables" / "service_hour", "hour")
    assert sum(r["requests"] for r in hour) == len(ref.requests)
    # A run that died after appending (its partition, not in the manifest) is not counted twice.
    events = out / "tables" / "events"
    shutil.copytree(events / "run=2", events / "run=7")
    four = run(spark, str(src), out, accuracy=ACCURACY, report=False)
    assert not (events / "run=7").exists()
    assert four.summary["totals"]["requests"] == len(ref.requests)


def test_missing_or_empty_directories_get_a_plain_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    from scale0.trend.job import TrendError, run

    with pytest.raises(TrendError, match="does not exist"):
        run(spark, str(tmp_path / "nope"), tmp_path / "out")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(TrendError, match="a-file: exists and is not a directory"):
        run(spark, str(tmp_path / "nope"), tmp_path / "a-file")
    (tmp_path / "empty" / ".hidden").mkdir(parents=True)
    (tmp_path / "empty" / "2026-11-18").mkdir()
    (tmp_path / "empty" / "2026-11-18" / ".events-open.jsonl").write_text('{"v":1}\n')
    with pytest.raises(TrendError, match=r"no closed event log files \(\*\.jsonl\)"):
        run(spark, str(tmp_path / "empty"), tmp_path / "out")
    (tmp_path / "junk" / "d").mkdir(parents=True)
    (tmp_path / "junk" / "d" / "x.jsonl").write_text("not json\n{}\n")
    with pytest.raises(TrendError, match="no valid version 1 records"):
        run(spark, str(tmp_path / "junk"), tmp_path / "out2")
