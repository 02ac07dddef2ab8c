"""The node's event log (scale0/net/eventlog.py): what the core reports, as records on disk.

A real EventLogWriter writes real files under tmp_path; the records are read back and checked
against the schema (scale0/trend/schema.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.core.effects import Channel, Log, RequestDone
from scale0.mgmt.metrics import render_metrics
from scale0.net.eventlog import MAX_ASKED, BrokerEventLog, mgmt_result
from scale0.trend.eventlog import EventLogWriter, encode
from scale0.trend.schema import validate_record
from scale0.wire.admin import ManagementReply, ManagementRequest

T0_MS = 1_795_000_000_000  # wall ms at monotonic 100.0
MONO0 = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = MONO0

    def __call__(self) -> float:
        return self.now


def open_log(tmp_path: Path) -> tuple[BrokerEventLog, Clock]:
    clock = Clock()
    writer = EventLogWriter(tmp_path, "a", flush_interval_s=0.01, fsync=False).start()
    return BrokerEventLog(writer, wall_ms=T0_MS, monotonic=MONO0, clock=clock), clock


def records(directory: Path) -> list[dict[str, Any]]:
    found = [
        json.loads(line)
        for path in sorted(directory.rglob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    for record in found:
        assert validate_record(record) == [], record
    assert not list(directory.rglob(".*.jsonl")), "a file was left unrenamed"
    return found


def without_envelope(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("v", "broker")}


def test_a_finished_request_becomes_one_request_record(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    log.request(RequestDone("echo", b"\x00w1", b"\x00c1", None, 100.5, 100.75, 5, 7, 200, 1))
    log.request(RequestDone("echo", None, None, "b", 101.0, 101.002, 3, 0, 503, 0))
    assert log.writer.close()
    first, second = records(tmp_path)
    assert without_envelope(first) == {
        "ts_ms": T0_MS + 750,
        "kind": "request",
        "service": "echo",
        "worker": "007731",
        "client": "006331",
        "received_ms": T0_MS + 500,
        "latency_ms": 250.0,
        "bytes_in": 5,
        "bytes_out": 7,
        "status": 200,
        "attempts": 1,
    }
    assert "worker" not in second and "client" not in second
    assert second["forwarded_from"] == "b" and second["status"] == 503
    assert second["latency_ms"] == pytest.approx(2.0)


# What the core logs (scale0/core/broker.py) -> the record it becomes, fields beyond ts_ms/kind.
TRANSLATIONS: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    (
        "worker_ready",
        {"worker": "0077", "services": ["echo", "upper"], "capacity": 1},
        {"kind": "worker_join", "worker": "0077", "services": ["echo", "upper"]},
    ),
    (
        "worker_lost",
        {"worker": "0077", "reason": "expired", "silent_ms": 3100},
        {"kind": "worker_leave", "worker": "0077", "reason": "expired", "gap_ms": 3100},
    ),
    (
        "worker_lost",
        {"worker": "0077", "reason": "disconnect", "silent_ms": 12},
        {"kind": "worker_leave", "worker": "0077", "reason": "disconnect"},
    ),
    (
        "heartbeat_gap",
        {"worker": "0077", "gap_ms": 2500},
        {"kind": "heartbeat_gap", "worker": "0077", "gap_ms": 2500},
    ),
    ("peer_up", {"peer": "b"}, {"kind": "peer_up", "peer": "b"}),
    (
        "peer_lost",
        {"peer": "b", "reason": "silent", "silent_ms": 3300},
        {"kind": "peer_down", "peer": "b", "reason": "silent", "gap_ms": 3300},
    ),
    (
        "peer_lost",
        {"peer": "b", "reason": "disconnect", "silent_ms": 0},
        {"kind": "peer_down", "peer": "b", "reason": "disconnect"},
    ),
    (
        "broker_state",
        {"from": "active", "to": "disabled", "by": "admin"},
        {"kind": "state_change", "state": "disabled", "prev_state": "active", "reason": "admin"},
    ),
    (
        "config_applied",
        {"source": "pub", "origin": "a", "version": 4, "previous": 3, "sha256": "ab" * 32},
        {"kind": "config_applied", "config_version": 4, "sha256": "ab" * 32},
    ),
    (
        "config_refused",
        {"source": "pub", "origin": "a", "reason": "stale", "version": 2, "sha256": "cd" * 32},
        {"kind": "config_refused", "config_version": 2, "sha256": "cd" * 32, "reason": "stale"},
    ),
    (
        "config_refused",
        {"source": "file", "origin": "a", "reason": "not a config", "version": None, "sha256": ""},
        {"kind": "config_refused", "config_version": 0, "reason": "not a config"},
    ),
    (
        "config_conflict",
        {"source": "pub", "origin": "b", "version": 5, "kept": "01" * 32, "dropped": "ff" * 32},
        {
            "kind": "config_refused",
            "config_version": 5,
            "sha256": "ff" * 32,
            "reason": "conflict: kept " + "01" * 32,
        },
    ),
    ("broker_ready", {"endpoints": {}}, None),
    ("worker_spoof", {"worker": "0077"}, None),
]


@pytest.mark.parametrize(("event", "fields", "expected"), TRANSLATIONS)
def test_what_the_core_logs_becomes_its_record(
    tmp_path: Path, event: str, fields: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    log, clock = open_log(tmp_path)
    clock.now = MONO0 + 2.0
    log.log(Log("info", event, fields))
    assert log.writer.close()
    got = [without_envelope(r) for r in records(tmp_path)]
    assert got == ([] if expected is None else [{"ts_ms": T0_MS + 2000, **expected}])


def test_a_clean_stop_says_which_workers_were_still_there_then_broker_stop(
    tmp_path: Path,
) -> None:
    log, clock = open_log(tmp_path)
    log.started()
    for worker in ("01", "02", "03"):
        log.log(Log("info", "worker_ready", {"worker": worker, "services": ["echo"]}))
    log.log(Log("warning", "worker_lost", {"worker": "02", "reason": "disconnect"}))
    clock.now += 1.0
    assert log.stopped()
    kinds = [(r["kind"], r.get("worker"), r.get("reason")) for r in records(tmp_path)]
    assert kinds == [
        ("broker_start", None, None),
        ("worker_join", "01", None),
        ("worker_join", "02", None),
        ("worker_join", "03", None),
        ("worker_leave", "02", "disconnect"),
        ("worker_leave", "01", "shutdown"),
        ("worker_leave", "03", "shutdown"),
        ("broker_stop", None, None),
    ]


def request(command: str, request_id: str, user: str = "admin") -> ManagementRequest:
    return ManagementRequest(
        auth_id=user, auth_password="x", command=command, request_id=request_id, args={}
    )


def test_management_commands_are_recorded_with_who_what_and_the_result(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    front, http = Channel.FRONTEND, Channel.HTTP
    log.management_asked(front, b"c1", request("disable", "1"))
    log.management_asked(http, b"h1", request("enable", "2", user="guest"))
    log.management_asked(front, b"c1", request("status", "3"))
    log.management_asked(front, b"c1", request("status", "4", user="nobody"))
    log.management_asked(front, b"c1", request("set_config", "5"))
    log.management_answered(front, b"c1", ManagementReply("1", 200))
    log.management_answered(http, b"h1", ManagementReply("2", 403, None, "needs admin"))
    log.management_answered(front, b"c1", ManagementReply("3", 200))  # a read that worked
    log.management_answered(front, b"c1", ManagementReply("4", 401, None, "bad credentials"))
    log.management_answered(front, b"c1", ManagementReply("5", 400, None, "bad document"))
    log.management_answered(front, b"c2", ManagementReply("9", 200))  # nobody asked
    assert log.asked == {}
    assert log.writer.close()
    got = [(r["user"], r["command"], r["result"]) for r in records(tmp_path)]
    assert got == [
        ("admin", "disable", "ok"),
        ("guest", "enable", "denied"),
        ("nobody", "status", "denied"),
        ("admin", "set_config", "error 400"),
    ]


def test_unanswered_management_requests_are_forgotten_beyond_a_bound(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    for i in range(MAX_ASKED + 10):
        log.management_asked(Channel.FRONTEND, b"c", request("disable", str(i)))
    assert len(log.asked) == MAX_ASKED
    assert (Channel.FRONTEND, b"c", "0") not in log.asked
    assert log.writer.close()


def test_mgmt_result_names_the_outcome() -> None:
    assert [mgmt_result(c) for c in (200, 401, 403, 404, 503)] == [
        "ok",
        "denied",
        "denied",
        "error 404",
        "error 503",
    ]


def test_the_writer_counters_go_to_status_and_metrics(tmp_path: Path) -> None:
    writer = EventLogWriter(tmp_path, "a", capacity=2, flush_interval_s=60, fsync=False)
    log = BrokerEventLog(writer, wall_ms=T0_MS, monotonic=MONO0)  # not started: nothing drains
    for _ in range(3):
        log.request(RequestDone("echo", None, None, None, 100.0, 100.1, 1, 1, 200, 1))
    stats = {**log.stats}
    assert stats["accepted"] == 2 and stats["dropped"] == 1 and stats["queued"] == 2
    text = render_metrics({"broker": "a", "event_log": stats})
    assert 'scale0_event_log_records_total{broker="a",outcome="dropped"} 1' in text
    assert 'scale0_event_log_records_total{broker="a",outcome="written"} 0' in text
    assert "scale0_event_log" not in render_metrics({"broker": "a", "event_log": None})


@given(
    service=st.text(min_size=1, max_size=20),
    worker=st.none() | st.binary(min_size=1, max_size=8),
    client=st.none() | st.binary(min_size=1, max_size=8),
    forwarded=st.none() | st.text(min_size=1, max_size=10),
    started=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    took=st.floats(min_value=0, max_value=1e3, allow_nan=False),
    ints=st.lists(st.integers(min_value=0, max_value=2**40), min_size=4, max_size=4),
)
def test_the_converted_line_is_exactly_the_writer_s_request_line(
    tmp_path_factory: pytest.TempPathFactory,
    service: str,
    worker: bytes | None,
    client: bytes | None,
    forwarded: str | None,
    started: float,
    took: float,
    ints: list[int],
) -> None:
    writer = EventLogWriter(tmp_path_factory.mktemp("log"), "b-1")
    log = BrokerEventLog(writer, wall_ms=T0_MS, monotonic=MONO0)
    bytes_in, bytes_out, status, attempts = ints
    done = RequestDone(
        service, worker, client, forwarded, started, started + took, bytes_in, bytes_out,
        status, attempts,
    )  # fmt: skip
    ts_ms, line = log.convert(done)
    base = T0_MS - MONO0 * 1000.0
    values = (
        service,
        None if worker is None else worker.hex(),
        None if client is None else client.hex(),
        forwarded,
        int(base + started * 1000.0),
        (started + took - started) * 1000.0,
        bytes_in,
        bytes_out,
        status,
        attempts,
    )
    assert ts_ms == int(base + (started + took) * 1000.0)
    assert line == encode("b-1", ("request", ts_ms, values))  # type: ignore[arg-type]
    assert json.loads(line)["kind"] == "request"
