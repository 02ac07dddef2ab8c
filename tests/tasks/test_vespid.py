"""The vespid front end: every command, its errors, task-info fields and severities."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.tasks import vespid
from scale0.tasks.book import Book
from scale0.tasks.model import TaskState
from scale0.tasks.vespid import handle, vespid_status
from tests.tasks.helpers import new_book
from tests.tasks.helpers import vespid as spec


def send(book: Book, message: Any, now: float = 1.0) -> dict[str, Any]:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    reply = handle(book, body, now).reply
    assert reply is not None
    result: dict[str, Any] = json.loads(reply)
    return result


def test_rules_header_lists_v1_to_v6() -> None:
    assert re.findall(r"^(V\d+)\s", vespid.__doc__ or "", re.MULTILINE) == [
        f"V{i}" for i in range(1, 7)
    ]


@pytest.mark.parametrize("state", list(TaskState))
def test_status_names(state: TaskState) -> None:
    expected = {"waiting": None, "pending": None, "running": "working", "complete": "complete"}
    assert vespid_status(state) == expected[state.value]


def node_set(book: Book, name: str, memory: int, cores: int, now: float = 0.5) -> dict[str, Any]:
    return send(
        book,
        {
            "command": "node-set",
            "name": name,
            "capabilities": {"memory": memory, "cores": cores, "usage_prefer_astro": True},
            "repositories": {"/srv/conda": {"type": "conda", "persist": True}},
            "activetasks": [],
        },
        now,
    )


def test_create_info_run_complete() -> None:
    book = new_book()
    assert node_set(book, "n1", 2000, 2) == {"command": "node-set-response", "name": "n1"}
    created = send(
        book,
        {
            "command": "task-create",
            "name": "job",
            "name_pretty": "A job",
            "parent": None,
            "executable_pyscript": "print(1)",
            "requirements": {
                "memory": 500,
                "cores": 1,
                "cores_max": 2,
                "usage_require_astro": True,
            },
            "repositories": {"env": {"request": "conda", "local": True}},
            "environment": {"MODE": "x"},
        },
    )
    assert created == {"command": "task-create-response", "name": "job", "status": "working"}
    info = send(book, {"command": "task-info", "name": "job"}, 2.0)
    assert info["command"] == "task-info-response"
    for key in (
        "name",
        "name_pretty",
        "parent",
        "executable_pyscript",
        "requirements",
        "repositories",
        "environment",
        "time-create",
        "time-start",
        "time-finish",
        "status",
        "success",
    ):
        assert key in info
    assert (info["status"], info["success"], info["node"], info["attempt"]) == (
        "working",
        None,
        "n1",
        1,
    )
    assert info["time-create"] == 1.0 and info["time-start"] == 1.0 and info["time-finish"] is None
    run = book.poll("n1", [], 2.0)[0]
    assert run["command"] == "task-run" and run["executable_pyscript"] == "print(1)"
    done = send(
        book, {"command": "task-complete", "name": "job", "node": "n1", "success": "warning"}, 3.0
    )
    assert done == {"command": "task-complete-response", "name": "job", "duplicate": False}
    again = send(
        book, {"command": "task-complete", "name": "job", "node": "n1", "success": "warning"}, 3.5
    )
    assert again["duplicate"] is True
    info = send(book, {"command": "task-info", "name": "job"}, 4.0)
    assert (info["status"], info["success"], info["time-finish"]) == ("complete", "warning", 3.0)


def test_unknown_task_info_is_invalid() -> None:
    reply = send(new_book(), {"command": "task-info", "name": "ghost"})
    assert reply["command"] == "task-info-response"
    assert reply["status"] == "invalid"


def test_unplaceable_says_why() -> None:
    book = new_book()
    node_set(book, "n1", 1000, 2)
    send(book, {"command": "task-create", **spec("big", memory=64000)})
    info = send(book, {"command": "task-info", "name": "big"})
    assert info["status"] is None
    assert info["explain"].startswith("no node could ever run it")
    assert "needs 64000 MB memory" in info["explain"]


def test_severity_never_goes_down_and_stale_is_refused() -> None:
    book = new_book(node_timeout_s=1.0)
    node_set(book, "n1", 1000, 2, now=0.0)
    send(book, {"command": "task-create", **spec("t")}, 0.0)
    node_set(book, "n2", 1000, 2, now=1.8)
    book.tick(2.0)  # n1 lost: t goes to n2 as attempt 2
    assert book.tasks["t"].node == "n2" and book.tasks["t"].attempt == 2
    node_set(book, "n1", 1000, 2, now=2.1)
    stale = send(
        book,
        {"command": "task-complete", "name": "t", "node": "n1", "success": "ok", "attempt": 1},
        2.2,
    )
    assert (stale["command"], stale["code"], stale["error"]) == ("error", -32006, "stale-attempt")
    assert stale["request"] == "task-complete"
    send(book, {"command": "task-complete", "name": "t", "node": "n2", "success": "fatal"}, 2.3)
    late = send(
        book,
        {"command": "task-complete", "name": "t", "node": "n2", "success": "ok", "attempt": 3},
        2.4,
    )
    assert late["code"] == -32006
    assert send(book, {"command": "task-info", "name": "t"})["success"] == "fatal"


def test_a_lost_nodes_late_report_is_refused_and_recorded() -> None:
    book = new_book(node_timeout_s=1.0)
    node_set(book, "n1", 1000, 2, now=0.0)
    send(book, {"command": "task-create", **spec("t")}, 0.0)
    book.tick(5.0)  # n1 lost, t pending again
    book.take_changes()
    late = send(book, {"command": "task-complete", "name": "t", "node": "n1", "success": "ok"}, 5.1)
    assert late["code"] == -32006
    assert book.take_changes().refusals[0]["node"] == "n1"
    assert book.tasks["t"].state is TaskState.PENDING


def test_cancel_and_list() -> None:
    book = new_book()
    send(book, {"command": "task-create", **spec("t")})
    assert send(book, {"command": "task-cancel", "name": "t"}) == {
        "command": "task-cancel-response",
        "name": "t",
        "status": "complete",
        "state": "complete",
        "success": "terminated",
        "was": "pending",
        "attempt": 0,
        "node": None,
    }
    assert send(book, {"command": "task-info", "name": "t"})["success"] == "terminated"
    listed = send(book, {"command": "task-list", "state": "complete"})
    assert [t["name"] for t in listed["tasks"]] == ["t"]
    assert listed["counts"]["complete"] == 1
    again = send(book, {"command": "task-cancel", "name": "t"})
    assert (again["code"], again["error"]) == (-32006, "stale-attempt")
    assert "already complete" in again["message"]


def test_list_rows_carry_protocol_node_attempt_and_times() -> None:
    book = new_book()
    node_set(book, "n1", 2000, 2, now=0.5)
    send(book, {"command": "task-create", **spec("run")}, 1.0)
    send(book, {"command": "task-create", **spec("big", memory=9000)}, 2.0)
    book.client_connect("c", 2.5)
    book.create_zerotask("c", "square", [3], "z1", 3.0)
    rows = {row["name"]: row for row in send(book, {"command": "task-list"})["tasks"]}
    assert rows["run"] == {
        "name": "run",
        "protocol": "vespid",
        "state": "running",
        "success": None,
        "attempt": 1,
        "node": "n1",
        "time-create": 1.0,
        "time-start": 1.0,
        "time-finish": None,
    }
    assert (rows["big"]["state"], rows["big"]["node"]) == ("pending", None)
    assert (rows["z1"]["protocol"], rows["z1"]["time-create"]) == ("zerotask", 3.0)
    pending = send(book, {"command": "task-list", "state": "pending"})["tasks"]
    assert sorted(row["name"] for row in pending) == ["big", "z1"]


def test_stats_counts_states_queue_nodes_and_recent_tasks() -> None:
    """V6: the report's numbers, the queue depth and the latest changes, newest first."""
    book = new_book()
    node_set(book, "n1", 2000, 2, now=0.5)
    send(book, {"command": "task-create", **spec("run", memory=500)}, 1.0)
    send(book, {"command": "task-create", **spec("big", memory=9000)}, 2.0)
    send(book, {"command": "task-create", **spec("gone")}, 3.0)
    send(book, {"command": "task-cancel", "name": "gone"}, 4.0)
    book.client_connect("c", 4.5)
    book.create_zerotask("c", "square", [3], "z1", 5.0)
    stats = send(book, {"command": "task-stats"}, 6.0)
    assert stats["command"] == "task-stats-response"
    assert stats["states"] == {"waiting": 0, "pending": 2, "running": 1, "complete": 1}
    assert stats["queue"] == {"zerotask": 1, "vespid": 1}
    assert stats["queue_depth"] == 2
    assert (stats["created"], stats["failed"], stats["reruns"], stats["refused"]) == (4, 1, 0, 0)
    assert stats["completed"]["terminated"] == 1
    assert stats["nodes_connected"] == 1
    assert stats["nodes"] == [
        {
            "node": "n1",
            "connected": True,
            "running": 1,
            "memory": 2000,
            "memory_reserved": 500,
            "cores": 2,
            "cores_reserved": 1,
        }
    ]
    # Newest change first: z1 created at 5, gone cancelled at 4, big created at 2, run at 1.
    assert [row["name"] for row in stats["recent"]] == ["z1", "gone", "big", "run"]
    assert stats["recent"][1] == {**vespid.list_row(book.tasks["gone"])}
    assert stats["time"] == 6.0
    two = send(book, {"command": "task-stats", "recent": 2}, 6.0)
    assert [row["name"] for row in two["recent"]] == ["z1", "gone"]
    assert send(book, {"command": "task-stats", "recent": 0}, 6.0)["recent"] == []


@pytest.mark.parametrize("recent", [-1, vespid.MAX_RECENT + 1, "5", 2.5, True, None])
def test_stats_refuses_a_bad_recent(recent: Any) -> None:
    reply = send(new_book(), {"command": "task-stats", "recent": recent})
    assert (reply["command"], reply["code"]) == ("error", -32602)
    assert f"recent must be an integer from 0 to {vespid.MAX_RECENT}" in reply["message"]


def test_explain_names_the_failing_requirement_per_node() -> None:
    book = new_book()
    node_set(book, "n1", 2000, 2)
    send(
        book,
        {
            "command": "node-set",
            "name": "n2",
            "capabilities": {"memory": 8000, "cores": 1},
            "repositories": {},
        },
    )
    send(book, {"command": "task-create", **spec("job", memory=4000, cores=2)})
    reply = send(book, {"command": "task-explain", "name": "job"})
    assert reply["command"] == "task-explain-response"
    assert (reply["state"], reply["status"], reply["protocol"]) == ("pending", None, "vespid")
    assert reply["explain"].startswith("no node could ever run it")
    assert reply["nodes"] == [
        {
            "node": "n1",
            "fits": False,
            "fits_idle": False,
            "reason": "needs 4000 MB memory, 2000 free of 2000",
        },
        {"node": "n2", "fits": False, "fits_idle": False, "reason": "needs 2 cores, 1 free of 1"},
    ]
    # A node that fits only when idle: "no room now", and the verdict says it would fit idle.
    send(book, {"command": "task-create", **spec("hog", memory=7000)})
    assert book.tasks["hog"].node == "n2"
    send(book, {"command": "task-create", **spec("next", memory=6000)})
    later = send(book, {"command": "task-explain", "name": "next"})
    assert later["explain"].startswith("no node has room now")
    assert later["nodes"][1] == {
        "node": "n2",
        "fits": False,
        "fits_idle": True,
        "reason": "needs 6000 MB memory, 1000 free of 8000",
    }


def test_explain_of_running_complete_and_zerotask_tasks() -> None:
    book = new_book()
    node_set(book, "n1", 2000, 2)
    send(book, {"command": "task-create", **spec("run")})
    running = send(book, {"command": "task-explain", "name": "run"})
    assert (running["state"], running["node"], running["nodes"]) == ("running", "n1", [])
    assert running["explain"] == "attempt 1 runs on node n1"
    send(book, {"command": "task-complete", "name": "run", "node": "n1", "success": "ok"})
    done = send(book, {"command": "task-explain", "name": "run"})
    assert (done["state"], done["success"], done["explain"]) == ("complete", "ok", "complete")
    book.client_connect("c", 1.0)
    book.create_zerotask("c", "square", [2], "z", 1.0)
    book.node_connect("zn", 1.0)
    book.node_status("zn", ["add"], 1.0)
    zerotask = send(book, {"command": "task-explain", "name": "z"})
    assert zerotask["explain"] == "announced to zn; no node has asked for it yet"
    verdicts = {row["node"]: row for row in zerotask["nodes"]}
    assert verdicts["zn"]["reason"] == "does not serve method 'square'"
    assert verdicts["n1"]["reason"] == "not a zerotask node"


@pytest.mark.parametrize(
    ("message", "code", "needle"),
    [
        (b"{oops", -32700, "parse error"),
        (b"[1]", -32600, "command"),
        ({"name": "x"}, -32600, "command"),
        ({"command": "task-explode"}, -32601, "task-explode"),
        ({"command": "task-info"}, -32602, "name"),
        ({"command": "task-create", "name": "x"}, -32010, "executable_pyscript"),
        ({"command": "task-create", **spec("x", memory="lots")}, -32010, "requirements.memory"),
        ({"command": "task-create", **spec("x", parent="nobody")}, -32010, "parent"),
        ({"command": "task-create", **spec("bad name")}, -32005, "name"),
        (
            {"command": "node-set", "name": "n", "capabilities": {"gpu": 1}},
            -32602,
            "capabilities.gpu",
        ),
        ({"command": "node-set", "name": "n", "activetasks": 3}, -32602, "activetasks"),
        (
            {"command": "task-complete", "name": "t", "node": "n", "success": "great"},
            -32602,
            "success",
        ),
        (
            {"command": "task-complete", "name": "t", "node": "ghost", "success": "ok"},
            -32004,
            "no task 't'",
        ),
        ({"command": "task-cancel", "name": "ghost"}, -32004, "ghost"),
        ({"command": "task-list", "state": "sleeping"}, -32602, "state"),
        ({"command": "task-explain", "name": "ghost"}, -32004, "no task 'ghost'"),
        ({"command": "task-explain"}, -32602, "name"),
        ({"command": "task-cancel", "name": 7}, -32602, "name"),
    ],
)
def test_errors(message: Any, code: int, needle: str) -> None:
    book = new_book()
    reply = send(book, message)
    assert reply["command"] == "error"
    assert reply["code"] == code, reply
    assert needle in reply["message"]
    assert not book.tasks


def test_taken_name() -> None:
    book = new_book()
    send(book, {"command": "task-create", **spec("x")})
    assert send(book, {"command": "task-create", **spec("x")})["command"] == "task-create-response"
    reply = send(book, {"command": "task-create", **spec("x", memory=7)})
    assert (reply["code"], reply["error"]) == (-32001, "id-taken")


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(body: bytes) -> None:
    assert handle(new_book(), body, 1.0).reply is not None


@given(
    st.sampled_from(sorted(vespid.COMMANDS)),
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "node",
                "success",
                "requirements",
                "capabilities",
                "repositories",
                "executable_pyscript",
                "parent",
                "environment",
                "attempt",
                "activetasks",
                "state",
                "recent",
                "auth_id",
                "auth_password",
            ]
        ),
        st.none()
        | st.booleans()
        | st.integers()
        | st.text(max_size=6)
        | st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=3), max_size=3),
        max_size=6,
    ),
)
def test_arbitrary_fields_never_internal_error(command: str, fields: dict[str, Any]) -> None:
    reply = send(new_book(), {"command": command, **fields})
    assert reply.get("code") != -32603, reply
