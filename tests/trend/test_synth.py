"""The synthetic event logs: valid records, the promised scenarios, the same bytes from a seed."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

from scale0.trend.schema import validate_record
from scale0.trend.synth import Plan, generate

ROOT = Path(__file__).resolve().parents[2]
PLAN = Plan(seed=7, days=0.5, rate=0.5, services=5, workers_per_broker=3, corrupt=2, newer=1)


def read(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*.jsonl"))
    }


def test_same_seed_same_bytes_and_another_seed_differs(tmp_path: Path) -> None:
    generate(tmp_path / "one", PLAN)
    generate(tmp_path / "two", PLAN)
    generate(tmp_path / "three", Plan(**{**_fields(PLAN), "seed": 8}))
    assert read(tmp_path / "one") == read(tmp_path / "two")
    assert read(tmp_path / "one") != read(tmp_path / "three")


def _fields(plan: Plan) -> dict[str, object]:
    return {name: getattr(plan, name) for name in plan.__slots__}


def test_records_are_valid_and_cover_the_scenarios(tmp_path: Path) -> None:
    totals = generate(tmp_path, PLAN)
    kinds: Counter[str] = Counter()
    bad = newer = 0
    statuses: Counter[int] = Counter()
    for text in read(tmp_path).values():
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if record["v"] > 1:
                newer += 1
                continue
            assert validate_record(record) == [], line
            kinds[record["kind"]] += 1
            if record["kind"] == "request":
                statuses[record["status"]] += 1
    assert (bad, newer) == (totals.corrupt, totals.newer) == (2, 1)
    assert kinds == totals.kinds
    for kind in [
        "request",
        "worker_join",
        "worker_leave",
        "heartbeat_gap",
        "peer_down",
        "peer_up",
        "config_applied",
        "config_refused",
        "mgmt_command",
        "state_change",
        "task",
        "broker_start",
    ]:
        assert kinds[kind] > 0, kind
    assert statuses[200] > 0 and statuses[500] > 0
    # The outage: the last broker restarts once, after its peers saw it go down.
    assert kinds["broker_start"] == len(PLAN.brokers) + 1
    # One directory per date and broker; no dot-files left open.
    dirs = {Path(name).parts[:2] for name in read(tmp_path)}
    assert {broker for _, broker in dirs} == {*PLAN.brokers, "coordinator"}
    assert not list(tmp_path.rglob(".*"))


def test_the_tool_refuses_a_directory_that_holds_logs(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    done = subprocess.run(
        [str(ROOT / "tools" / "gen-events"), "--out", str(tmp_path), "--days", "0.01"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert "not empty" in done.stderr
    assert (tmp_path / "x").read_text() == "keep me"
