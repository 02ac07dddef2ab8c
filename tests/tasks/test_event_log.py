"""The coordinator's event log (docs/trend.md, kind ``task``): one record per committed change
of a task's state, in the trending job's words, written by the real EventLogWriter."""

from __future__ import annotations

import json
from pathlib import Path

from scale0.cli.coordinator import EVENT_LOG_NAME, record_transitions
from scale0.tasks.model import Severity
from scale0.trend.eventlog import EventLogWriter
from scale0.trend.schema import validate_record
from tests.tasks.helpers import new_book

TS_MS = 1_700_000_000_000


def written(directory: Path) -> list[dict[str, object]]:
    lines = [
        json.loads(line)
        for path in sorted(directory.rglob("events-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    for record in lines:
        assert validate_record(record) == [], record
    return lines


def test_every_transition_of_a_task_is_one_record_after_its_commit(tmp_path: Path) -> None:
    book = new_book()
    book.client_connect("c1", 0.0)
    book.node_connect("n1", 0.0)
    writer = EventLogWriter(tmp_path, broker=EVENT_LOG_NAME).start()
    done = book.create_zerotask("c1", "add", [1, 2], "ok-task", 1.0)
    failed = book.create_zerotask("c1", "add", [0], "bad-task", 1.0)
    record_transitions(writer, book.take_changes(), TS_MS)
    book.poll("n1", [], 1.0)
    book.node_task_request(done, "n1", 1.1)
    book.node_task_request(failed, "n1", 1.1)
    record_transitions(writer, book.take_changes(), TS_MS + 100)
    book.finish(done, "n1", 1, Severity.OK, 1.2, result=3)
    book.finish(failed, "n1", 1, Severity.ERROR, 1.2, error={"code": 1, "message": "no"})
    record_transitions(writer, book.take_changes(), TS_MS + 200)
    book.take_changes()  # nothing changed since: nothing is written
    assert writer.close()
    records = written(tmp_path)
    assert {r["broker"] for r in records} == {EVENT_LOG_NAME}
    by_task = {
        name: [
            (r.get("prev_state"), r["state"], r["ts_ms"]) for r in records if r["task_id"] == name
        ]
        for name in (done, failed)
    }
    assert by_task[done] == [
        (None, "queued", TS_MS),
        ("queued", "running", TS_MS + 100),
        ("running", "done", TS_MS + 200),
    ]
    assert by_task[failed][-1] == ("running", "failed", TS_MS + 200)
    assert all(r["kind"] == "task" for r in records)


def test_a_coordinator_config_names_its_event_log_relative_to_its_file(tmp_path: Path) -> None:
    from scale0.tasks.settings import load_coordinator

    path = tmp_path / "coordinator.yml"
    path.write_text("endpoint: tcp://127.0.0.1:5556\ndata_dir: data\nevent_log_dir: var/events\n")
    assert load_coordinator(path).event_log_dir == tmp_path / "var" / "events"
    path.write_text("endpoint: tcp://127.0.0.1:5556\ndata_dir: data\n")
    assert load_coordinator(path).event_log_dir is None
