"""The task state machine: the table, the rules header, and every (state, event) pair via Book."""

from __future__ import annotations

import contextlib
import re

from hypothesis import given
from hypothesis import strategies as st

from scale0.tasks import model
from scale0.tasks.book import Book
from scale0.tasks.errors import Refused
from scale0.tasks.model import (
    TRANSITIONS,
    Event,
    NodeRecord,
    Protocol,
    Severity,
    TaskRecord,
    TaskState,
    raise_severity,
    severity_from,
    step,
)
from tests.tasks.helpers import add_node, new_book, vespid


def test_rules_header_lists_t1_to_t10_f1_to_f3_s1_s2() -> None:
    doc = model.__doc__ or ""
    found = re.findall(r"^([TFS]\d+)\s", doc, re.MULTILINE)
    assert found == [f"T{i}" for i in range(1, 11)] + ["F1", "F2", "F3", "S1", "S2"]


def test_complete_is_final() -> None:
    for event in Event:
        assert step(TaskState.COMPLETE, event) is None


def test_every_state_but_complete_can_be_cancelled() -> None:
    for state in TaskState:
        expected = None if state is TaskState.COMPLETE else TaskState.COMPLETE
        assert step(state, Event.CANCEL) is expected


def _book_in(state: TaskState) -> Book:
    """A book whose task "t" is in ``state``; parent "p" runs on n1 (1000 MB, 4 cores)."""
    book = new_book()
    add_node(book, "n1", 1000, 4)
    book.create_vespid(vespid("p", memory=100), None, 1.0)
    assert book.tasks["p"].state is TaskState.RUNNING
    if state is TaskState.WAITING:
        book.create_vespid(vespid("t", memory=5000, parent="p"), None, 2.0)
    elif state is TaskState.PENDING:
        book.create_vespid(vespid("t", memory=5000), None, 2.0)
    else:
        book.create_vespid(vespid("t", memory=100), None, 2.0)
        if state is TaskState.COMPLETE:
            book.finish("t", "n1", 1, Severity.OK, 3.0)
    assert book.tasks["t"].state is state
    book.take_changes()
    return book


def _apply(book: Book, event: Event) -> None:
    task = book.tasks["t"]
    if event is Event.PARENT_OK:
        book.finish("p", "n1", 1, Severity.OK, 5.0)
    elif event is Event.PARENT_FAILED:
        book.finish("p", "n1", 1, Severity.ERROR, 5.0)
    elif event is Event.ASSIGN:
        add_node(book, "n2", 8000, 4, now=5.0)
    elif event is Event.STATUS:
        book.report_status("t", task.node, task.attempt, "busy", {}, 5.0)
    elif event is Event.FINISH:
        book.finish("t", task.node, task.attempt, Severity.OK, 5.0)
    elif event is Event.NODE_LOST:
        if task.node is not None:
            book.node_set({"name": "n3", "capabilities": {}}, 5.0)
            book._lose(task.node, 5.0, "test")
    elif event is Event.CANCEL:
        book.cancel("t", 5.0)


@given(st.sampled_from(list(TaskState)), st.sampled_from(list(Event)))
def test_every_state_event_pair_follows_the_table(state: TaskState, event: Event) -> None:
    book = _book_in(state)
    before = book.tasks["t"]
    with contextlib.suppress(Refused):
        _apply(book, event)
    after = book.tasks["t"]
    expected = step(state, event)
    if expected is None:
        assert after.state is state
        assert after.attempt == before.attempt
        assert after.success == before.success
    else:
        assert after.state is expected, (state, event, after)


def test_table_covers_only_listed_pairs() -> None:
    assert len(TRANSITIONS) == 9
    assert (TaskState.PENDING, Event.FINISH) not in TRANSITIONS


@given(st.lists(st.sampled_from(list(Severity)), min_size=1))
def test_severity_never_goes_down(levels: list[Severity]) -> None:
    current: Severity | None = None
    for level in levels:
        new = raise_severity(current, level)
        assert current is None or new >= current
        current = new
    assert current == max(levels)


def test_severity_labels() -> None:
    assert severity_from("warning") is Severity.WARNING
    assert severity_from("bad") is None
    assert severity_from(3) is None
    assert Severity.TERMINATED.label == "terminated"


def test_records_round_trip_through_json() -> None:
    task = TaskRecord(
        "t",
        Protocol.VESPID,
        TaskState.RUNNING,
        1.5,
        success=Severity.WARNING,
        requirements={"memory": 3},
        node="n1",
        attempt=2,
    )
    assert TaskRecord.from_json(task.to_json()) == task
    node = NodeRecord("n1", 10, 2, {"x": 1.0}, True, {"/r": {"type": "git", "persist": True}})
    assert NodeRecord.from_json(node.to_json()) == node
