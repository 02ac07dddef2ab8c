"""The event record schema: the validator names the field, and docs/trend.md lists it all."""

from __future__ import annotations

from pathlib import Path

from scale0.trend.schema import FIELDS, KINDS, validate_record

DOC = Path(__file__).resolve().parents[2] / "docs" / "trend.md"
GOOD = {"v": 1, "ts_ms": 5, "kind": "worker_join", "broker": "a", "worker": "w"}


def test_a_good_record_has_no_problems() -> None:
    assert validate_record(GOOD) == []


def test_problems_name_the_field() -> None:
    assert validate_record({**GOOD, "ts_ms": "5"}) == ["ts_ms: expected long, got str"]
    assert validate_record({**GOOD, "status": True}) == ["status: expected int, got bool"]
    assert validate_record({**GOOD, "colour": "red"}) == ["colour: not a field of schema version 1"]
    assert validate_record({k: v for k, v in GOOD.items() if k != "broker"}) == ["broker: missing"]
    assert validate_record({**GOOD, "kind": "request"})[0] == "service: missing for kind request"
    assert validate_record({**GOOD, "kind": "zap"}) == ["kind: unknown kind 'zap'"]
    assert validate_record({**GOOD, "services": ["a", 1]}) == [
        "services: expected a list of strings"
    ]
    assert validate_record({"ts_ms": 1}) == ["v: missing or not an integer"]


def test_a_newer_version_is_not_judged_by_version_1_rules() -> None:
    assert validate_record({"v": 2, "anything": "else"}) == []


def test_docs_list_every_field_and_kind_with_its_type() -> None:
    text = DOC.read_text()
    for field in FIELDS:
        assert f"| `{field.name}` | {field.type} | {field.doc} |" in text, field.name
    for kind, (doc, _) in KINDS.items():
        assert f"| `{kind}` | {doc} |" in text, kind
