"""scale0.trend.summary: the checks the broker runs on summary.json before the page shows it."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.trend.schema import SCHEMA_VERSION
from scale0.trend.summary import (
    MAX_SUMMARY_BYTES,
    SummaryError,
    SummaryMissing,
    read_summary,
    validate_summary,
)
from tests.conftest import SPARK_TIMEOUT_S, SUMMARY_PLAN

TOP_KEYS = (
    "schema_version", "generated_at", "source", "window", "percentile_accuracy", "input",
    "totals", "services", "workers", "brokers", "config_changes", "management", "tasks", "tables",
)  # fmt: skip


def small() -> dict[str, Any]:
    """A minimal summary of the job's shape (one of each row), written by hand."""
    return {
        "schema_version": 1,
        "generated_at": "2026-11-24T12:00:00+00:00",
        "source": "/var/events",
        "window": {"start_ms": 1_795_000_000_000, "end_ms": 1_795_003_600_000},
        "percentile_accuracy": 10000,
        "input": {
            "files": 2,
            "new_files": 2,
            "good": 10,
            "corrupt": 1,
            "newer": 0,
            "invalid": 0,
            "newer_versions": [],
            "newer_files": [],
            "corrupt_files": ["/var/events/x.jsonl"],
        },
        "totals": {"requests": 4, "errors": 1, "error_rate": 0.25, "bytes_in": 8, "bytes_out": 9},
        "services": [
            {
                "service": "echo",
                "requests": 4,
                "errors": 1,
                "error_rate": 0.25,
                "p50_ms": 1.5,
                "p95_ms": 3.0,
                "p99_ms": 3.0,
                "bytes_in": 8,
                "bytes_out": 9,
            }
        ],
        "workers": [
            {
                "broker": "a",
                "worker": "w1",
                "first_seen": "2026-11-18T00:00:00Z",
                "observed_ms": 3600000,
                "up_ms": 3500000,
                "availability": 0.97,
                "transitions": 3,
                "requests": 4,
                "load_share": 1.0,
            }
        ],
        "brokers": [
            {
                "broker": "a",
                "first_seen": None,
                "observed_ms": None,
                "up_ms": None,
                "availability": None,
                "transitions": None,
                "requests": 4,
                "load_share": 1.0,
            }
        ],
        "config_changes": [
            {
                "at": "2026-11-18T00:00:00Z",
                "broker": "a",
                "outcome": "refused",
                "config_version": 3,
                "sha256": "ab" * 32,
                "reason": "signature does not verify",
            }
        ],
        "management": [
            {
                "at": "2026-11-18T00:10:00Z",
                "broker": "a",
                "kind": "mgmt_command",
                "user": "admin",
                "command": "disable",
                "result": "ok",
                "state": None,
                "prev_state": None,
                "reason": None,
            }
        ],
        "tasks": [
            {
                "hour": "2026-11-18T00:00:00Z",
                "finished": 3,
                "failed": 1,
                "throughput_per_s": 3 / 3600,
                "wait_p50_ms": 10.0,
                "wait_p95_ms": 20.0,
                "run_p50_ms": None,
                "run_p95_ms": None,
            }
        ],
        "tables": {"service_hour": "/var/trend/tables/service_hour"},
    }


def problems_of(document: Any) -> list[str]:
    with pytest.raises(SummaryError) as info:
        validate_summary(document, "/x/summary.json")
    assert str(info.value).startswith("/x/summary.json: ")
    return info.value.problems


# ---- the real job's summary ------------------------------------------------------------------


@pytest.mark.timeout(SPARK_TIMEOUT_S)
def test_a_summary_the_real_job_made_is_valid(trend_summary: Path) -> None:
    document, info = read_summary(trend_summary)
    assert info.st_size == trend_summary.stat().st_size
    assert document["schema_version"] == SCHEMA_VERSION
    assert set(TOP_KEYS) <= set(document)
    assert {b["broker"] for b in document["brokers"]} == set(SUMMARY_PLAN.brokers)
    assert document["totals"]["requests"] == sum(s["requests"] for s in document["services"]) > 0
    assert {c["outcome"] for c in document["config_changes"]} == {"applied", "refused"}
    assert document["workers"] and document["tasks"]


@pytest.mark.timeout(SPARK_TIMEOUT_S)
@pytest.mark.parametrize("key", TOP_KEYS)
def test_each_part_of_the_real_summary_is_required(trend_summary: Path, key: str) -> None:
    document = json.loads(trend_summary.read_text())
    del document[key]
    found = problems_of(document)
    assert any(p.startswith(key) for p in found), found


@pytest.mark.timeout(SPARK_TIMEOUT_S)
def test_a_wrong_value_deep_in_the_real_summary_is_named(trend_summary: Path) -> None:
    document = json.loads(trend_summary.read_text())
    document["services"][1]["p95_ms"] = "fast"
    document["workers"][0]["availability"] = True
    found = problems_of(document)
    assert "services[1].p95_ms: expected a number, got string 'fast'" in found
    assert "workers[0].availability: expected a number, got boolean true" in found


# ---- by hand -----------------------------------------------------------------------------------


def test_the_hand_made_summary_is_valid() -> None:
    assert validate_summary(small()) == small()


def test_keys_a_later_job_adds_are_let_through() -> None:
    document = small()
    document["new_part"] = {"x": 1}
    document["services"][0]["p999_ms"] = 4.0
    assert validate_summary(document)["new_part"] == {"x": 1}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(window={"start_ms": 5, "end_ms": 4}), "window: start_ms is after"),
        (lambda d: d["totals"].update(requests=-1), "totals.requests: expected an integer >= 0"),
        (lambda d: d["totals"].update(errors=1.5), "totals.errors: expected an integer"),
        (lambda d: d["services"][0].update(error_rate=1.5), "services[0].error_rate: expected"),
        (lambda d: d["services"][0].pop("service"), "services[0].service: missing"),
        (lambda d: d["config_changes"][0].update(outcome="maybe"), "expected one of applied"),
        (lambda d: d["workers"][0].update(first_seen="yesterday"), "expected an ISO 8601 time"),
        (lambda d: d.update(generated_at=17), "generated_at: expected an ISO 8601 time"),
        (lambda d: d.update(brokers={}), "brokers: expected a list, got an object"),
        (lambda d: d["input"].update(newer_files=[1]), "input.newer_files[0]: expected a str"),
        (lambda d: d.update(tables=[]), "tables: expected an object of paths"),
        (lambda d: d.update(services=[7]), "services[0]: expected an object, got number 7"),
    ],
)
def test_every_problem_names_its_field(change: Any, expected: str) -> None:
    document = copy.deepcopy(small())
    change(document)
    found = problems_of(document)
    assert any(expected in p for p in found), found


def test_all_problems_are_reported_at_once() -> None:
    document = small()
    for key in ("totals", "services", "brokers"):
        del document[key]
    assert problems_of(document) == ["totals: missing", "services: missing", "brokers: missing"]


def test_a_newer_schema_is_refused_as_newer_before_anything_else() -> None:
    with pytest.raises(SummaryError) as info:
        validate_summary({"schema_version": SCHEMA_VERSION + 1}, "/x/summary.json")
    assert info.value.newer
    assert f"schema_version {SCHEMA_VERSION + 1} is newer than this Scale0 reads" in str(info.value)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ([], "expected a JSON object, got a list"),
        ({}, "schema_version: expected an integer, got null"),
        ({"schema_version": True}, "schema_version: expected an integer, got boolean true"),
        ({"schema_version": 0}, "schema_version: expected 1..1, got 0"),
    ],
)
def test_what_is_not_a_summary_at_all(document: Any, expected: str) -> None:
    assert problems_of(document) == [expected]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(TOP_KEYS), value=JSON, whole=JSON)
def test_arbitrary_json_raises_nothing_but_summary_error(key: str, value: Any, whole: Any) -> None:
    for document in ({**small(), key: value}, whole):
        with contextlib.suppress(SummaryError):
            validate_summary(document)


# ---- reading the file ----------------------------------------------------------------------------


def test_reading_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SummaryMissing):
        read_summary(tmp_path / "summary.json")


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "summary.json"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (json.dumps(small()).encode()[:-40], "not valid JSON"),
        (b"", "not valid JSON"),
        (json.dumps(small()).replace("0.25", "NaN", 1).encode(), "NaN is not JSON"),
        (b'{"schema_version": 1, "x": "\xff"}', "not UTF-8"),
        (b"[" * 200_000 + b"]" * 200_000, "not valid JSON"),
    ],
    ids=["cut-short", "empty", "nan", "latin1", "deep"],
)
def test_a_corrupt_file_is_named_with_its_problem(
    tmp_path: Path, data: bytes, expected: str
) -> None:
    path = write(tmp_path, data)
    with pytest.raises(SummaryError) as info:
        read_summary(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_a_file_over_the_limit_is_not_read(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps(small()).encode())
    with pytest.raises(SummaryError, match=r"bytes; the limit is 100"):
        read_summary(path, limit=100)
    assert read_summary(path)[0] == small()
    assert MAX_SUMMARY_BYTES >= 1024 * 1024


def test_a_directory_or_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    with pytest.raises(SummaryError, match="not a regular file"):
        read_summary(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(SummaryError, match="not a regular file"):
        read_summary(fifo)  # opened non-blocking: no writer needed to get here
