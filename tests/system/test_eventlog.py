"""The event log of a real family, end to end (docs/trend.md "In the broker").

Two ``scale0-broker`` processes write their logs into one shared directory; two
``scale0-worker`` processes serve at b1; clients at b1 and at b2 (whose requests b1 runs,
forwarded); one worker is SIGKILLed part-way; an admin disables and enables b2; the brokers stop
cleanly. Then the JSON Lines files are read (every record valid by the schema, one request
record per answer a client got, the killed worker's worker_leave "expired"), and the real
trend job (scale0.trend.job with the CLI's summary screen, on the session's shared local Spark)
turns the directory into a summary that shows the requests, the failures and the downtime.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from scale0.net.client import Client, WorkerFailed
from scale0.testing import FamilyMember, running_family, wait_until
from scale0.trend.schema import validate_record
from tests.system.ctl import ctl_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 20.0
ROUNDS = 40  # each round: one request through b1 and one through b2
KILL_AT = 20
FAIL_EVERY = 8  # every 8th request asks the handler to fail (REPLY 500)


def start_worker(endpoint: str) -> subprocess.Popen[bytes]:
    executable = shutil.which("scale0-worker")
    assert executable is not None, "scale0-worker is not installed: pip install -e ."
    return subprocess.Popen(
        [
            executable,
            endpoint,
            "tests.net.handlers:flaky",
            "--service",
            "echo",
            "--heartbeat-interval",
            "0.2",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_process(process: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
    try:
        process.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(WAIT_S)


def broker_logs(member: FamilyMember) -> list[dict[str, Any]]:
    lines = []
    for line in member.stderr_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                lines.append(value)
    return lines


def ready_workers(member: FamilyMember) -> list[str]:
    return [line["worker"] for line in broker_logs(member) if line.get("event") == "worker_ready"]


def read_records(directory: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(directory.rglob("*.jsonl")):
        assert not path.name.startswith("."), f"{path} was not renamed at a clean stop"
        for number, line in enumerate(path.read_text().splitlines(), 1):
            record = json.loads(line)
            assert validate_record(record) == [], f"{path}:{number}: {record}"
            records.append(record)
    return records


@contextlib.contextmanager
def workers_at(endpoint: str, member: FamilyMember, count: int) -> Iterator[list[Any]]:
    """``count`` worker processes, started one at a time; yields [(process, worker id)...]."""
    started: list[Any] = []
    try:
        for _ in range(count):
            process = start_worker(endpoint)
            known = len(ready_workers(member))
            wait_until(lambda k=known: len(ready_workers(member)) > k, "a worker registered")
            started.append((process, ready_workers(member)[known]))
        yield started
    finally:
        for process, _ in started:
            stop_process(process)


def test_a_family_s_event_log_shows_its_requests_failures_and_a_killed_worker(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> None:
    events = tmp_path / "events"
    answered: Counter[str] = Counter()
    with running_family(
        tmp_path,
        2,
        broker_overrides=[{"event_log_dir": "../events"}, {"event_log_dir": "../events"}],
        default_heartbeat_interval_ms=200,
        liveness=5,
    ) as family:
        b1, b2 = family["b1"], family["b2"]
        with workers_at(b1.endpoints["backend"], b1, 2) as workers:
            (doomed, doomed_id), (_kept, kept_id) = workers
            with (
                Client(b1.frontend, timeout=15.0) as at_b1,
                Client(b2.frontend, timeout=15.0) as at_b2,
            ):
                # b2 has no worker: the request waits there until b1's table shows one (F9).
                assert at_b2.request("echo", b"first") == [b"first"]
                answered["ok"] += 1
                for i in range(ROUNDS):
                    if i == KILL_AT:
                        stop_process(doomed, signal.SIGKILL)
                    for client in (at_b1, at_b2):
                        body = (b"fail" if i % FAIL_EVERY == FAIL_EVERY - 1 else b"ok") + b"%d" % i
                        try:
                            assert client.request("echo", body) == [body]
                            answered["ok"] += 1
                        except WorkerFailed:
                            answered["failed"] += 1
            wait_until(
                lambda: any(
                    line.get("event") == "worker_lost" and line.get("worker") == doomed_id
                    for line in broker_logs(b1)
                ),
                "b1 lost the killed worker",
            )
            # Management: a change is recorded (who, what, result); status shows the counters.
            for command in ("disable", "enable"):
                code, document = ctl_json(family, command, broker="b2")
                assert code == 0, document
            code, document = ctl_json(family, "status")
            assert code == 0, document
            stats = document["result"]["event_log"]
            assert stats["accepted"] >= ROUNDS and stats["dropped"] == 0
        assert b2.stop() == 0 and b1.stop() == 0  # the workers left first; then a clean stop

    records = read_records(events)
    kinds = Counter(r["kind"] for r in records)
    assert {r["broker"] for r in records} == {"b1", "b2"}
    assert kinds["broker_start"] == 2 and kinds["broker_stop"] == 2
    requests = [r for r in records if r["kind"] == "request"]
    assert len(requests) == sum(answered.values())
    assert sum(1 for r in requests if r["status"] == 500) == answered["failed"] > 0
    assert {r["broker"] for r in requests} == {"b1"}  # b1's workers ran them all
    forwarded = [r for r in requests if r.get("forwarded_from") == "b2"]
    assert len(forwarded) == ROUNDS + 1  # b2's client's requests, forwarded to b1
    assert all("client" not in r for r in forwarded)
    assert {r["worker"] for r in requests} == {doomed_id, kept_id}
    leaves = [r for r in records if r["kind"] == "worker_leave" and r["worker"] == doomed_id]
    assert [r["reason"] for r in leaves] == ["expired"]
    assert leaves[0]["gap_ms"] >= 1000  # liveness 5 x 200 ms of silence
    joins = {r["worker"] for r in records if r["kind"] == "worker_join"}
    assert {doomed_id, kept_id} <= joins
    commands = [
        (r["broker"], r["user"], r["command"], r["result"])
        for r in records
        if r["kind"] == "mgmt_command"
    ]
    assert commands == [("b2", "admin", "disable", "ok"), ("b2", "admin", "enable", "ok")]
    states = [
        (r["broker"], r["prev_state"], r["state"]) for r in records if r["kind"] == "state_change"
    ]
    assert ("b2", "active", "disabled") in states and ("b2", "disabled", "active") in states

    from scale0.cli.trend import summary_screen
    from scale0.trend.job import run

    result = run(spark, str(events), tmp_path_factory.mktemp("trend"), accuracy=100)
    summary = result.summary
    assert summary["input"]["good"] == len(records)
    assert summary["totals"]["requests"] == len(requests)
    assert summary["totals"]["errors"] == answered["failed"]
    workers = {w["worker"]: w for w in summary["workers"] if w["broker"] == "b1"}
    assert workers[doomed_id]["availability"] < 0.99
    assert workers[kept_id]["availability"] > workers[doomed_id]["availability"]
    screen = summary_screen(result)
    assert f"requests: {len(requests)}, failed {answered['failed']}" in screen
    assert f"b1/{doomed_id}" in screen  # among the least available workers
