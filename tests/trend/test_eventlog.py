"""The event log writer on real files: layout, rotation, drops, a full disk, a crash mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.trend.eventlog import _REQUEST_FIELDS, EventLogWriter, SegmentFiles, date_of, encode
from scale0.trend.schema import FIELD_NAMES, SCHEMA_VERSION, validate_record

DAY_MS = 86_400_000
T0 = 1_795_000_000_000  # 2026-11-18, ms


def lines_of(directory: Path) -> list[str]:
    return [
        line
        for path in sorted(directory.rglob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def emit_requests(writer: EventLogWriter, n: int, ts_ms: int = T0) -> int:
    accepted = 0
    for i in range(n):
        accepted += writer.request(
            ts_ms + i, "echo", "w1", "c0ffee", None, ts_ms + i - 3, 3.25, 10, 20, 200, 1
        )
    return accepted


def test_records_land_in_date_and_broker_directories_with_the_schema_version(
    tmp_path: Path,
) -> None:
    writer = EventLogWriter(tmp_path, "a", flush_interval_s=0.01).start()
    writer.event("broker_start", T0)
    writer.request(T0 + 5, "echo", "w1", "c0ffee", "b", T0 + 1, 4.0, 7, 9, 200, 2)
    writer.event("worker_join", T0 + 6, worker="w1", services=["echo", "upper"])
    writer.event("heartbeat_gap", T0 + DAY_MS, worker="w1", gap_ms=4500)
    assert writer.close()
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert [f.parts[:2] for f in files] == [(date_of(T0), "a"), (date_of(T0 + DAY_MS), "a")]
    assert not [f for f in files if f.name.startswith(".")]
    records = [json.loads(line) for line in lines_of(tmp_path)]
    assert [r["kind"] for r in records] == [
        "broker_start",
        "request",
        "worker_join",
        "heartbeat_gap",
    ]
    for record in records:
        assert record["v"] == SCHEMA_VERSION
        assert record["broker"] == "a"
        assert validate_record(record) == []
        # Schema order, absent fields left out.
        assert list(record) == [n for n in FIELD_NAMES if n in record]
    assert records[1] == {
        "v": 1,
        "ts_ms": T0 + 5,
        "kind": "request",
        "broker": "a",
        "service": "echo",
        "worker": "w1",
        "client": "c0ffee",
        "forwarded_from": "b",
        "received_ms": T0 + 1,
        "latency_ms": 4.0,
        "bytes_in": 7,
        "bytes_out": 9,
        "status": 200,
        "attempts": 2,
    }
    assert writer.stats() == {
        "accepted": 4,
        "dropped": 0,
        "written": 4,
        "write_failed": 0,
        "queued": 0,
        "files_closed": 2,
    }


def test_rotation_by_size_keeps_every_record_and_every_file_small(tmp_path: Path) -> None:
    writer = EventLogWriter(tmp_path, "a", max_bytes=2000, flush_interval_s=0.01).start()
    assert emit_requests(writer, 500) == 500
    assert writer.close()
    paths = list(tmp_path.rglob("*.jsonl"))
    assert len(paths) > 10
    longest = max(len(line) + 1 for line in lines_of(tmp_path))
    assert all(p.stat().st_size < 2000 + longest for p in paths)
    assert [json.loads(line)["ts_ms"] for line in lines_of(tmp_path)] == [
        T0 + i for i in range(500)
    ]


def test_rotation_by_age_uses_the_clock_it_is_given(tmp_path: Path) -> None:
    now = [1000.0]
    files = SegmentFiles(tmp_path, "a", max_age_s=60, clock=lambda: now[0], fsync=False)
    files.write(T0, '{"x":1}')
    files.rotate_if_old()
    assert files.closed_files == []
    now[0] += 60
    files.rotate_if_old()
    assert len(files.closed_files) == 1
    files.write(T0 + 1, '{"x":2}')
    files.close()
    assert len(files.closed_files) == 2
    assert [p.read_text() for p in files.closed_files] == ['{"x":1}\n', '{"x":2}\n']


def test_unsafe_broker_names_and_unknown_kinds_are_refused(tmp_path: Path) -> None:
    for name in ["", "../x", ".hidden", "a/b", "_x"]:
        with pytest.raises(ValueError, match="broker"):
            EventLogWriter(tmp_path, name)
    writer = EventLogWriter(tmp_path, "a")
    with pytest.raises(ValueError, match="kind"):
        writer.event("nonsense", T0)
    with pytest.raises(ValueError, match="unknown fields"):
        writer.event("worker_join", T0, worker="w", colour="red")


def test_a_full_buffer_drops_and_counts_and_never_waits(tmp_path: Path) -> None:
    # The thread is not started yet: nothing drains, so the 9th record on is dropped.
    writer = EventLogWriter(tmp_path, "a", capacity=8)
    assert emit_requests(writer, 100) == 8
    assert writer.stats()["dropped"] == 92
    assert writer.stats()["queued"] == 8
    writer.start()
    assert writer.close()
    assert len(lines_of(tmp_path)) == 8
    assert writer.stats()["written"] == 8


def test_a_slow_writer_behind_a_tiny_buffer_loses_records_not_time(tmp_path: Path) -> None:
    writer = EventLogWriter(tmp_path, "a", capacity=16, flush_interval_s=0.001).start()
    total = 100_000
    accepted = emit_requests(writer, total)
    assert writer.close()
    stats = writer.stats()
    assert stats["dropped"] == total - accepted > 0
    assert stats["written"] == accepted == len(lines_of(tmp_path))
    for line in lines_of(tmp_path):
        assert validate_record(json.loads(line)) == []


def run_python(code: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


def test_a_full_disk_fails_writes_counts_them_and_keeps_going(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes the kernel refuse writes past 3000 bytes per file (EFBIG), as a full
    # disk refuses them with ENOSPC; SIGXFSZ is ignored so the write fails instead of killing.
    proc = run_python(
        f"""
        import json, resource, signal, sys
        from scale0.trend.eventlog import EventLogWriter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
        writer = EventLogWriter({str(tmp_path)!r}, "a", max_bytes=10**9, flush_interval_s=0.01)
        writer.start()
        for i in range(2000):
            writer.request({T0} + i, "echo", "w1", "c", None, {T0}, 1.0, 1, 1, 200, 1)
        print(json.dumps({{"closed": writer.close(), **writer.stats()}}))
        """
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    stats = json.loads(out)
    assert stats["closed"] is True
    assert stats["write_failed"] > 0
    assert stats["written"] + stats["write_failed"] + stats["dropped"] == 2000
    assert all(p.stat().st_size <= 3000 for p in tmp_path.rglob("*.jsonl"))
    assert not list(tmp_path.rglob(".events-*"))  # renamed even after failed writes


def test_a_crash_mid_write_leaves_a_dot_file_the_next_writer_renames(tmp_path: Path) -> None:
    proc = run_python(
        f"""
        import time
        from scale0.trend.eventlog import EventLogWriter
        writer = EventLogWriter({str(tmp_path)!r}, "a", flush_interval_s=0.01).start()
        for i in range(300):
            writer.request({T0} + i, "echo", "w1", "c", None, {T0}, 1.0, 1, 1, 200, 1)
        for _ in range(1000):
            if writer.stats()["written"] == 300:
                break
            time.sleep(0.01)
        print("written", flush=True)
        time.sleep(60)
        """
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "written"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    (open_file,) = tmp_path.rglob(".events-*.jsonl")
    # Cut the last line short, as a crash in the middle of a write does.
    size = open_file.stat().st_size
    os.truncate(open_file, size - 9)
    writer = EventLogWriter(tmp_path, "a").start()
    assert writer.close()
    assert not list(tmp_path.rglob(".events-*"))
    lines = lines_of(tmp_path)
    assert len(lines) == 300
    for line in lines[:-1]:
        assert validate_record(json.loads(line)) == []
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[-1])


names = st.text(max_size=12)
optional = st.none() | names


@given(
    service=names,
    worker=optional,
    client=optional,
    forwarded_from=optional,
    ints=st.lists(st.integers(min_value=0, max_value=2**53), min_size=6, max_size=6),
    latency=st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False),
)
def test_the_fast_request_line_is_exactly_what_json_dumps_writes(
    service: str,
    worker: str | None,
    client: str | None,
    forwarded_from: str | None,
    ints: list[int],
    latency: float,
) -> None:
    ts_ms, received, bytes_in, bytes_out, status, attempts = ints
    values = (service, worker, client, forwarded_from, received, latency, bytes_in,
              bytes_out, status, attempts)  # fmt: skip
    record: dict[str, object] = {"v": 1, "ts_ms": ts_ms, "kind": "request", "broker": "b-1"}
    record.update((k, v) for k, v in zip(_REQUEST_FIELDS, values, strict=True) if v is not None)
    assert encode("b-1", ("request", ts_ms, values)) == json.dumps(record, separators=(",", ":"))


def test_a_raw_request_is_converted_on_the_writer_thread_to_the_same_line(tmp_path: Path) -> None:
    def convert(raw: tuple[int, str]) -> tuple[int, Any]:
        if raw[1] == "bad":
            raise KeyError(raw[1])
        return raw[0], (raw[1], "w1", "c0ffee", None, raw[0] - 3, 3.25, 10, 20, 200, 1)

    plain = EventLogWriter(tmp_path / "plain", "a", flush_interval_s=0.01).start()
    assert emit_requests(plain, 1) == 1
    assert plain.close()
    raw = EventLogWriter(tmp_path / "raw", "a", flush_interval_s=0.01, convert=convert).start()
    assert raw.request_raw((T0, "echo")) and raw.request_raw((T0 + 1, "bad"))
    assert raw.request_raw((T0 + 2, "echo"))
    assert raw.close()
    lines = lines_of(tmp_path / "raw")
    assert lines[0] == lines_of(tmp_path / "plain")[0]
    assert len(lines) == 2  # the record the converter failed on is lost and counted
    assert raw.stats()["write_failed"] == 1 and raw.stats()["written"] == 2


def test_a_raw_request_without_a_converter_is_refused_at_once(tmp_path: Path) -> None:
    writer = EventLogWriter(tmp_path, "a")
    with pytest.raises(ValueError, match="convert"):
        writer.request_raw((T0, "echo"))
