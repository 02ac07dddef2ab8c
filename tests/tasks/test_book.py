"""The coordinator core: both protocols' operations, fencing, node loss, parents, restore."""

from __future__ import annotations

import re

import pytest

from scale0.tasks import book as book_module
from scale0.tasks.book import ANNOUNCE_SPREAD_S, Book, Snapshot
from scale0.tasks.errors import ErrorCode, Refused
from scale0.tasks.model import Severity, TaskState
from tests.tasks.helpers import add_node, new_book, vespid


def refused(code: ErrorCode, call: object, *args: object) -> Refused:
    with pytest.raises(Refused) as caught:
        call(*args)  # type: ignore[operator]
    assert caught.value.code is code, caught.value
    return caught.value


def test_rules_header_lists_b1_to_b6() -> None:
    assert re.findall(r"^(B\d+)\s", book_module.__doc__ or "", re.MULTILINE) == [
        f"B{i}" for i in range(1, 7)
    ]


def zerotask_book() -> Book:
    book = new_book()
    assert book.client_connect("c1", 0.0) == "c1"
    assert book.node_connect("n1", 0.0) == "n1"
    assert book.node_connect("n2", 0.0) == "n2"
    return book


def announced(messages: list[dict[str, object]]) -> list[object]:
    return [m["params"] for m in messages if m.get("method") == "zerotask.node.broker_new_task"]


def test_client_ids_generated_taken_invalid() -> None:
    book = new_book()
    assert book.client_connect(None, 0.0) == "id1"
    assert book.client_connect("me", 0.0) == "me"
    refused(ErrorCode.ID_TAKEN, book.client_connect, "me", 0.0)
    refused(ErrorCode.INVALID_ID, book.client_connect, "", 0.0)
    refused(ErrorCode.INVALID_ID, book.client_connect, "a b", 0.0)
    refused(ErrorCode.INVALID_ID, book.client_connect, 7, 0.0)
    book.client_disconnect("me")
    refused(ErrorCode.UNKNOWN_CLIENT, book.client_disconnect, "me")
    assert book.client_connect("me", 1.0) == "me"


def test_zerotask_life_exactly_one_node_gets_the_task() -> None:
    book = zerotask_book()
    name = book.create_zerotask("c1", "add", [1, 2], None, 1.0)
    polls = {"n1": book.poll("n1", [], 1.0)}
    assert announced(book.poll("n2", [], 1.05)) == []  # B6: n1 has it; n2 after the spread
    polls["n2"] = book.poll("n2", [], 1.0 + ANNOUNCE_SPREAD_S)
    for messages in polls.values():
        assert {
            "jsonrpc": "2.0",
            "method": "zerotask.node.broker_new_task",
            "params": ["add", name],
        } in messages
    got = book.node_task_request(name, "n2", 1.1)
    assert got == {"method": "add", "params": [1, 2], "id": name, "attempt": 1}
    assert book.node_task_request(name, "n1", 1.2) == {}
    assert book.node_task_request(name, "n2", 1.2) == got  # the holder asking again
    book.report_status(name, "n2", 1, "half", {"percent": 50}, 1.3)
    status = book.owned_task("c1", name)
    assert (status.status, status.status_kwargs, status.state) == (
        "half",
        {"percent": 50},
        TaskState.RUNNING,
    )
    assert book.finish(name, "n2", 1, Severity.OK, 1.4, result=3)
    assert book.tasks[name].result == 3
    assert book.tasks[name].success is Severity.OK
    # F2: the same report again is acknowledged, nothing changes
    assert not book.finish(name, "n2", 1, Severity.OK, 1.5, result=3)
    refused(ErrorCode.UNKNOWN_TASK, book.node_task_request, "nope", "n1", 1.0)


def test_announcements_fresh_first_at_most_room_then_spread() -> None:
    """B6: fresh tasks first, at most ``room``; another node's unclaimed ones after the spread."""
    book = zerotask_book()
    book.poll("n1", [], 0.0)
    book.poll("n2", [], 0.0)  # the broker_node_status of node_connect
    names = [book.create_zerotask("c1", "add", [i], f"t{i}", 1.0) for i in range(5)]
    assert announced(book.poll("n1", [], 1.0, room=2)) == [["add", "t0"], ["add", "t1"]]
    assert announced(book.poll("n2", [], 1.0, room=2)) == [["add", "t2"], ["add", "t3"]]
    assert announced(book.poll("n1", [], 1.0, room=0)) == []
    assert "node:n1" not in book.woken(1.0)  # room 0: no news for a parked poll
    assert "node:n2" in book.woken(1.0)  # t4 is fresh, n2 said room 2
    assert announced(book.poll("n1", [], 1.01, room=5)) == [["add", "t4"]]  # t2, t3: too soon
    book.node_task_request("t0", "n1", 1.02)
    later = 1.0 + ANNOUNCE_SPREAD_S
    # n2 gets n1's unclaimed ones once they waited the spread; t0 is taken: never again
    assert announced(book.poll("n2", [], later, room=5)) == [["add", "t1"]]
    assert announced(book.poll("n2", [], 1.01 + ANNOUNCE_SPREAD_S, room=5)) == [["add", "t4"]]
    assert announced(book.poll("n1", [], later)) == [["add", "t2"], ["add", "t3"]]  # no room given
    assert names == [f"t{i}" for i in range(5)]
    refused(ErrorCode.INVALID_PARAMS, book.poll, "n1", [], later, -1)
    refused(ErrorCode.INVALID_PARAMS, book.poll, "n1", [], later, "2")


def test_task_ids_taken_resend_invalid() -> None:
    book = zerotask_book()
    book.client_connect("c2", 0.0)
    assert book.create_zerotask("c1", "m", {"a": 1}, "t1", 1.0) == "t1"
    assert book.create_zerotask("c1", "m", {"a": 1}, "t1", 2.0) == "t1"  # B2 resend
    refused(ErrorCode.ID_TAKEN, book.create_zerotask, "c1", "m", {"a": 2}, "t1", 2.0)
    refused(ErrorCode.ID_TAKEN, book.create_zerotask, "c2", "m", {"a": 1}, "t1", 2.0)
    refused(ErrorCode.INVALID_ID, book.create_zerotask, "c1", "m", 1, "bad id", 2.0)
    refused(ErrorCode.UNKNOWN_CLIENT, book.create_zerotask, "zz", "m", 1, None, 2.0)
    refused(ErrorCode.UNKNOWN_TASK, book.owned_task, "c2", "t1")  # not c2's task


def test_stale_attempt_is_refused_and_recorded_after_node_loss() -> None:
    book = new_book(node_timeout_s=3.0)
    book.client_connect("c", 0.0)
    book.node_connect("n1", 0.0)
    name = book.create_zerotask("c", "m", None, "t", 0.0)
    book.node_task_request(name, "n1", 0.5)
    book.node_connect("n2", 2.0)
    book.tick(2.0)
    book.node("n2", 3.5)
    book.tick(4.0)  # n1 silent since 0.5 -> lost, the task is pending again
    task = book.tasks[name]
    assert (task.state, task.reruns, task.node) == (TaskState.PENDING, 1, None)
    assert book.node_task_request(name, "n2", 4.1)["attempt"] == 2
    book.take_changes()
    error = refused(ErrorCode.STALE_ATTEMPT, book.finish, name, "n1", 1, Severity.OK, 4.2)
    assert "attempt 1" in error.message
    changes = book.take_changes()
    assert changes.refusals[0]["task"] == name
    assert book.tasks[name].refused == 1
    refused(ErrorCode.STALE_ATTEMPT, book.report_status, name, "n2", 1, "x", {}, 4.3)
    assert book.finish(name, "n2", 2, Severity.OK, 4.4, result="r")
    refused(ErrorCode.STALE_ATTEMPT, book.finish, name, "n2", 1, Severity.OK, 4.5)
    assert book.counts()["refused"] == 3
    assert book.counts()["reruns"] == 1


def test_severity_never_goes_down_through_reports() -> None:
    book = new_book()
    add_node(book, "n1", 1000, 2)
    book.create_vespid(vespid("v"), None, 0.0)
    book.report_status("v", "n1", 1, "x", {"success": "error"}, 1.0)
    assert book.tasks["v"].success is Severity.ERROR
    refused(ErrorCode.INVALID_PARAMS, book.report_status, "v", "n1", 1, "x", {"success": "ok"}, 1.0)
    book.report_status("v", "n1", 1, "y", {"success": "warning"}, 1.5)
    assert book.tasks["v"].success is Severity.ERROR
    book.finish("v", "n1", 1, Severity.OK, 2.0)
    assert book.tasks["v"].success is Severity.ERROR  # S1: an ok finish does not lower it


def test_vespid_placement_reserves_and_releases() -> None:
    book = new_book()
    add_node(book, "small", 1000, 1)
    add_node(book, "big", 4000, 4)
    book.create_vespid(vespid("a", memory=3000), None, 0.0)
    book.create_vespid(vespid("b", memory=3000), None, 0.0)
    assert book.tasks["a"].node == "big"
    assert book.tasks["b"].state is TaskState.PENDING
    assert "needs 3000 MB memory, 1000 free of 4000" in book.explain(book.tasks["b"])
    run = book.poll("big", [], 0.1)
    assert run[0]["command"] == "task-run" and run[0]["name"] == "a"
    assert run[0]["path"] == "a/1" and run[0]["log"] == "a/1/task.log"
    book.finish("a", "big", 1, Severity.OK, 1.0)
    assert book.tasks["b"].node == "big"
    book.create_vespid(vespid("huge", memory=99999), None, 1.0)
    assert book.explain(book.tasks["huge"]).startswith("no node could ever run it")


def test_vespid_create_validation_and_resend() -> None:
    book = new_book()
    error = refused(ErrorCode.INVALID_TASK, book.create_vespid, vespid("x", memory=-1), None, 0.0)
    assert error.data == {"field": "requirements.memory"}
    refused(ErrorCode.INVALID_TASK, book.create_vespid, {"name": "x"}, None, 0.0)
    refused(ErrorCode.INVALID_TASK, book.create_vespid, vespid("x", parent="ghost"), None, 0.0)
    refused(
        ErrorCode.INVALID_TASK, book.create_vespid, vespid("x", environment={"A": 1}), None, 0.0
    )
    refused(ErrorCode.INVALID_ID, book.create_vespid, vespid("../x"), None, 0.0)
    assert not book.tasks
    book.create_vespid(vespid("x"), None, 0.0)
    assert book.create_vespid(vespid("x"), None, 1.0) == "x"
    refused(ErrorCode.ID_TAKEN, book.create_vespid, vespid("x", memory=5), None, 1.0)


def test_parent_ok_releases_children_and_failure_terminates_them() -> None:
    book = new_book()
    add_node(book, "n", 1000, 4)
    book.create_vespid(vespid("p"), None, 0.0)
    book.create_vespid(vespid("c1", parent="p"), None, 0.0)
    book.create_vespid(vespid("g1", parent="c1"), None, 0.0)
    assert book.tasks["c1"].state is TaskState.WAITING
    assert book.explain(book.tasks["c1"]) == "waits for parent p"
    book.finish("p", "n", 1, Severity.WARNING, 1.0)
    assert book.tasks["c1"].state is TaskState.RUNNING
    book.finish("c1", "n", 1, Severity.FATAL, 2.0)
    grandchild = book.tasks["g1"]
    assert (grandchild.state, grandchild.success) == (TaskState.COMPLETE, Severity.TERMINATED)
    # a child created after its parent failed is terminated at once
    book.create_vespid(vespid("late", parent="c1"), None, 3.0)
    assert book.tasks["late"].success is Severity.TERMINATED


def test_cancel_running_tells_the_node() -> None:
    book = new_book()
    add_node(book, "n", 1000, 4)
    book.create_vespid(vespid("t"), None, 0.0)
    book.poll("n", [], 0.0)
    task = book.cancel("t", 1.0)
    assert (task.state, task.success) == (TaskState.COMPLETE, Severity.TERMINATED)
    assert book.poll("n", [], 1.0) == [{"command": "task-cancel", "name": "t", "attempt": 1}]
    refused(ErrorCode.STALE_ATTEMPT, book.cancel, "t", 2.0)
    refused(ErrorCode.STALE_ATTEMPT, book.finish, "t", "n", 1, Severity.OK, 2.0)


def test_b4_poll_resends_what_the_node_does_not_hold() -> None:
    book = new_book(resend_s=2.0)
    add_node(book, "n", 1000, 4)
    book.create_vespid(vespid("t"), None, 0.0)
    assert [m["name"] for m in book.poll("n", [], 0.0)] == ["t"]
    assert book.poll("n", [], 1.0) == []
    assert book.poll("n", [["t", 1]], 3.0) == []
    assert [m["name"] for m in book.poll("n", [], 3.5)] == ["t"]
    refused(ErrorCode.INVALID_PARAMS, book.poll, "n", [["t"]], 4.0)
    refused(ErrorCode.UNKNOWN_NODE, book.poll, "ghost", [], 4.0)


def test_node_connect_taken_until_lost_and_disconnect_requeues() -> None:
    book = new_book(node_timeout_s=2.0)
    book.client_connect("c", 0.0)
    book.node_connect("n", 0.0)
    refused(ErrorCode.ID_TAKEN, book.node_connect, "n", 1.0)
    book.create_zerotask("c", "m", None, "t", 0.0)
    book.node_task_request("t", "n", 0.1)
    book.node_disconnect("n", 0.2)
    assert book.tasks["t"].state is TaskState.PENDING
    assert book.node_connect("n", 0.3) == "n"
    refused(ErrorCode.UNKNOWN_NODE, book.node_disconnect, "other", 0.3)


def test_restore_keeps_everything_and_loses_nodes_that_stay_away() -> None:
    book = new_book(node_timeout_s=2.0)
    add_node(book, "n1", 1000, 4)
    add_node(book, "n2", 1000, 4)
    book.create_vespid(vespid("a", memory=900), None, 0.0)
    book.create_vespid(vespid("b", memory=900), None, 0.0)
    book.finish("a", "n1", 1, Severity.OK, 1.0)
    snapshot = Snapshot(tuple(book.tasks.values()), tuple(book.nodes.values()), {}, 0)
    again = Book(lambda: "x", book.settings, snapshot, now=10.0)
    assert again.tasks == book.tasks
    holder = again.tasks["b"].node
    other = "n2" if holder == "n1" else "n1"
    again.node(other, 11.5)
    again.tick(12.5)  # the holder was not heard from within 2 s of the restart
    assert again.tasks["b"].state is TaskState.RUNNING
    assert again.tasks["b"].node == other
    assert again.tasks["b"].attempt == 2
