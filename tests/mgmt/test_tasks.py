"""The Tasks panel's reading of the coordinator's answer (Q3, Q4) and its endpoint; the client
itself is tested with real processes in tests/system/test_management_tasks.py."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from scale0.mgmt import tasks
from scale0.mgmt.tasks import STATS_KEYS, TaskPanel, connectable


def panel() -> TaskPanel:
    return TaskPanel(lambda: None, "b1", "vespid", 2.0)


def read(reply: Any) -> tuple[int, dict[str, Any]]:
    frames = [reply if isinstance(reply, bytes) else json.dumps(reply).encode()]
    status, body = panel()._read(frames)
    return status, body


def stats(**changes: Any) -> dict[str, Any]:
    reply: dict[str, Any] = {"command": "task-stats-response", "time": 5.0}
    reply.update({key: 0 for key in STATS_KEYS})
    reply.update(changes)
    return reply


def test_rules_header_lists_q1_to_q4() -> None:
    assert re.findall(r"^(Q\d+)\s", tasks.__doc__ or "", re.MULTILINE) == [
        "Q1",
        "Q2",
        "Q3",
        "Q4",
    ]


@pytest.mark.parametrize(
    ("bound", "connect"),
    [
        ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
        ("tcp://0.0.0.0:5555", "tcp://127.0.0.1:5555"),
        ("tcp://[::]:5555", "tcp://[::1]:5555"),
        ("tcp://10.1.2.3:7", "tcp://10.1.2.3:7"),
        ("ipc:///run/scale0.sock", "ipc:///run/scale0.sock"),
    ],
)
def test_a_wildcard_bind_is_reached_on_loopback(bound: str, connect: str) -> None:
    assert connectable(bound) == connect


def test_a_task_stats_response_is_the_result_with_who_asked() -> None:
    status, body = read(stats(queue_depth=3, nodes=[{"node": "n1"}]))
    assert status == 200 and body["code"] == 200
    result = body["result"]
    assert (result["coordinator"], result["service"], result["asked_by"]) == (True, "vespid", "b1")
    assert (result["queue_depth"], result["nodes"], result["time"]) == (3, [{"node": "n1"}], 5.0)
    assert "command" not in result


@pytest.mark.parametrize(
    ("reply", "status", "reason", "needle"),
    [
        (b"\xff not json", 502, "bad-answer", "the coordinator's answer is not JSON"),
        ([1, 2], 502, "bad-answer", "is not an object"),
        (
            {"command": "error", "code": -32008, "message": "task-stats needs auth_id"},
            403,
            "refused",
            "the task coordinator refused: task-stats needs auth_id",
        ),
        (
            {"command": "error", "code": -32601, "message": "unknown command 'task-stats'"},
            502,
            "bad-answer",
            "does not know task-stats (older than this broker?)",
        ),
        ({"command": "error", "code": -32603, "message": "boom"}, 502, "bad-answer", "boom"),
        ({"command": "task-list-response", "tasks": []}, 502, "bad-answer", "not a task-stats"),
        (
            {k: v for k, v in stats().items() if k != "nodes"},
            502,
            "bad-answer",
            "missing ['nodes']",
        ),
    ],
)
def test_what_is_not_a_task_stats_response_is_said(
    reply: Any, status: int, reason: str, needle: str
) -> None:
    got, body = read(reply)
    assert (got, body["code"], body["result"]["reason"]) == (status, status, reason)
    assert needle in body["message"]
    assert body["result"]["coordinator"] is None  # neither "there is none" nor numbers


def test_before_the_frontend_is_bound_it_says_so() -> None:
    status, answer = asyncio.run(panel().ask("viewer", "pw", 20))
    body: dict[str, Any] = answer
    assert (status, body["result"]["reason"]) == (503, "no-answer")
    assert "not bound yet" in body["message"]
