"""The zerotask JSON-RPC front end: every method, every error code, batches, notifications."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.tasks import zerotask
from scale0.tasks.book import Book
from scale0.tasks.model import Severity
from scale0.tasks.zerotask import METHODS, finish_poll, handle
from tests.tasks.helpers import new_book

B = "zerotask.broker."


def rpc(method: str, params: Any) -> bytes:
    body = {"jsonrpc": "2.0", "method": B + method, "params": params, "id": 1}
    return json.dumps(body).encode()


def call(book: Book, method: str, params: Any = None, now: float = 1.0, rid: Any = 1) -> Any:
    request: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": rid}
    if params is not None:
        request["params"] = params
    outcome = handle(book, json.dumps(request).encode(), now)
    assert outcome.reply is not None
    return json.loads(outcome.reply)


def ok(book: Book, method: str, params: Any = None, now: float = 1.0) -> Any:
    response = call(book, B + method, params, now)
    assert "error" not in response, response
    assert response["id"] == 1
    return response["result"]


def err(book: Book, method: str, params: Any, code: int, now: float = 1.0) -> str:
    response = call(book, B + method, params, now)
    assert response["error"]["code"] == code, response
    return str(response["error"]["message"])


def test_rules_header_lists_z1_to_z5() -> None:
    assert re.findall(r"^(Z\d+)\s", zerotask.__doc__ or "", re.MULTILINE) == [
        f"Z{i}" for i in range(1, 6)
    ]


def test_the_issue_methods_are_all_in_the_table() -> None:
    names = (
        "client_connect client_disconnect client_new_task client_task_status client_task_result "
        "node_connect node_heartbeat node_disconnect node_task_request task_status "
        "node_task_finished node_task_failed node_status"
    )
    for name in names.split():
        assert B + name in METHODS


def test_full_zerotask_round_by_position_and_by_name() -> None:
    book = new_book()
    assert ok(book, "client_connect") == "id1"
    assert ok(book, "client_connect", ["alice"]) == "alice"
    assert ok(book, "node_connect", {"node_id": "n1"}) == "n1"
    assert ok(book, "node_connect", []) == "id2"
    task = ok(book, "client_new_task", ["alice", "add", [2, 3]])
    named = ok(
        book,
        "client_new_task",
        {"client_id": "alice", "method": "add", "params": {}, "task_id": "t9"},
    )
    assert named == "t9"
    assert ok(book, "node_heartbeat", ["n1"]) is True
    messages = ok(book, "node_poll", ["n1", 0, []])
    assert messages[0] == {
        "jsonrpc": "2.0",
        "method": "zerotask.node.broker_node_status",
        "params": [],
    }
    assert {
        "jsonrpc": "2.0",
        "method": "zerotask.node.broker_new_task",
        "params": ["add", task],
    } in messages
    assert ok(book, "node_status", {"node_id": "n1", "methods": ["add"], "load": 0.5}) is True
    assignment = ok(book, "node_task_request", [task, "n1"])
    assert assignment == {"method": "add", "params": [2, 3], "id": task, "attempt": 1}
    assert ok(book, "node_task_request", [task, "id2"]) == {}
    assert ok(
        book,
        "task_status",
        {"node_id": "n1", "task_id": task, "status": "adding", "step": 1, "attempt": 1},
    )
    status = ok(book, "client_task_status", ["alice", task])
    assert status["state"] == "running" and status["status"] == "adding"
    assert status["kwargs"] == {"step": 1}
    assert err(book, "client_task_result", ["alice", task], -32007)
    assert ok(book, "node_task_finished", [task, 5, "n1", 1]) is True
    assert ok(book, "client_task_result", ["alice", task]) == 5
    assert ok(book, "client_task_status", ["alice", task])["success"] == "ok"
    # the failed path, with a legacy node that sends no node_id / attempt
    assert ok(book, "node_task_request", ["t9"]) == {
        "method": "add",
        "params": {},
        "id": "t9",
        "attempt": 1,
    }
    assert ok(book, "node_task_failed", ["t9", {"code": 12, "message": "overflow"}]) is True
    response = call(book, B + "client_task_result", ["alice", "t9"])
    assert response["error"]["code"] == -32009
    assert response["error"]["data"] == {"code": 12, "message": "overflow"}
    assert ok(book, "node_disconnect", ["n1"]) is True
    assert ok(book, "client_disconnect", ["alice"]) is True


def test_application_errors() -> None:
    book = new_book()
    ok(book, "client_connect", ["c"])
    ok(book, "node_connect", ["n"])
    assert "taken" in err(book, "client_connect", ["c"], -32001)
    assert "taken" in err(book, "node_connect", ["n"], -32001)
    err(book, "client_connect", ["no spaces"], -32005)
    err(book, "client_connect", [12], -32005)
    err(book, "client_disconnect", ["ghost"], -32002)
    err(book, "client_new_task", ["ghost", "m", 1], -32002)
    ok(book, "client_new_task", ["c", "m", 1, "t"])
    err(book, "client_new_task", ["c", "m", 2, "t"], -32001)
    err(book, "client_new_task", ["c", "m", 2, "bad/id"], -32005)
    err(book, "client_task_status", ["c", "nope"], -32004)
    err(book, "node_task_request", ["nope", "n"], -32004)
    err(book, "node_heartbeat", ["ghost"], -32003)
    err(book, "node_disconnect", ["ghost"], -32003)
    err(book, "task_status", ["ghost", "t", "x"], -32006)  # fenced and recorded (F3)
    ok(book, "node_task_request", ["t", "n"])
    err(book, "node_task_finished", ["t", 1, "n", 2], -32006)  # stale attempt
    err(book, "task_status", {"node_id": "n", "task_id": "t", "status": "x", "attempt": 3}, -32006)
    err(book, "node_task_failed", ["t", {"message": "no code"}, "n", 1], -32602)
    ok(book, "node_task_finished", ["t", 1, "n", 1])
    assert ok(book, "node_task_finished", ["t", 1, "n", 1]) is True  # F2 resend
    err(book, "node_task_finished", ["t", 2, "other", 1], -32006)
    err(book, "client_task_cancel", ["c", "t"], -32006)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b"\xff\xfe", -32700),
        (b"42", -32600),
        (b"[]", -32600),
        (b'{"jsonrpc": "1.0", "method": "x", "id": 1}', -32600),
        (b'{"method": "zerotask.broker.client_connect", "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "method": 5, "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "method": "x", "id": {"a": 1}}', -32600),
        (b'{"jsonrpc": "2.0", "method": "x", "params": 3, "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "method": "zerotask.broker.nope", "id": 1}', -32601),
        (b'{"jsonrpc": "2.0", "method": "zerotask.broker.client_new_task", "id": 1}', -32602),
        (
            rpc("client_connect", [1, 2]),
            -32602,
        ),
        (
            rpc("client_connect", {"x": 1}),
            -32602,
        ),
        (
            rpc("client_new_task", ["c", 5, 1]),
            -32602,
        ),
        (
            rpc("node_poll", ["n", -1]),
            -32602,
        ),
    ],
)
def test_protocol_errors(body: bytes, code: int) -> None:
    book = new_book()
    book.client_connect("c", 0.0)
    book.node_connect("n", 0.0)
    outcome = handle(book, body, 1.0)
    assert outcome.reply is not None
    response = json.loads(outcome.reply)
    assert response["jsonrpc"] == "2.0"
    assert response["error"]["code"] == code
    assert set(response) == {"jsonrpc", "error", "id"}


def test_internal_error_keeps_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    book = new_book()

    def broken(*args: object) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(book, "client_connect", broken)
    assert "boom" in err(book, "client_connect", [], -32603)
    assert ok(book, "node_connect", ["n"]) == "n"


def test_notifications_and_batches() -> None:
    book = new_book()
    note = {"jsonrpc": "2.0", "method": B + "client_connect", "params": ["quiet"]}
    assert handle(book, json.dumps(note).encode(), 1.0).reply == b""
    assert "quiet" in book.clients
    batch = [
        {"jsonrpc": "2.0", "method": B + "client_connect", "params": ["a"], "id": "x"},
        note,
        {"jsonrpc": "2.0", "method": B + "client_connect", "params": ["a"], "id": "y"},
        7,
    ]
    reply = handle(book, json.dumps(batch).encode(), 1.0).reply
    assert reply is not None
    responses = json.loads(reply)
    assert [r.get("id") for r in responses] == ["x", "y", None]
    assert responses[0]["result"] == "a"
    assert responses[1]["error"]["code"] == -32001
    assert responses[2]["error"]["code"] == -32600
    assert handle(book, json.dumps([note]).encode(), 1.0).reply == b""


def test_node_poll_parks_until_finish_poll() -> None:
    book = new_book()
    book.client_connect("c", 0.0)
    book.node_connect("n", 0.0)
    book.poll("n", [], 0.0)
    body = {"jsonrpc": "2.0", "method": B + "node_poll", "params": ["n", 500, []], "id": 4}
    outcome = handle(book, json.dumps(body).encode(), 1.0)
    assert outcome.reply is None and outcome.poll is not None
    assert outcome.poll.wait_s == 0.5
    book.create_zerotask("c", "m", None, "t", 1.1)
    assert "node:n" in book.woken(1.1)
    response = json.loads(finish_poll(book, outcome.poll, 1.2))
    assert response["id"] == 4
    assert response["result"] == [
        {"jsonrpc": "2.0", "method": "zerotask.node.broker_new_task", "params": ["m", "t"]}
    ]


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(body: bytes) -> None:
    outcome = handle(new_book(), body, 1.0)
    assert outcome.reply is not None


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    ),
    st.sampled_from(sorted(METHODS)),
)
def test_arbitrary_params_get_a_response(params: Any, method: str) -> None:
    book = new_book()
    body = json.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": 1}).encode()
    outcome = handle(book, body, 1.0)
    if outcome.reply is not None:
        response = json.loads(outcome.reply)
        assert ("result" in response) != ("error" in response)
        if "error" in response:
            assert response["error"]["code"] != -32603, response


def test_client_task_wait_parks_until_the_task_completes() -> None:
    book = new_book()
    book.client_connect("c", 0.0)
    book.node_connect("n", 0.0)
    book.create_zerotask("c", "m", None, "t", 0.0)
    now_status = ok(book, "client_task_wait", ["c", "t", 0])
    assert now_status["state"] == "pending"
    body = {"jsonrpc": "2.0", "method": B + "client_task_wait", "params": ["c", "t", 800], "id": 9}
    outcome = handle(book, json.dumps(body).encode(), 1.0)
    assert outcome.reply is None and outcome.poll is not None
    assert (outcome.poll.key, outcome.poll.wait_s) == ("task:t", 0.8)
    book.node_task_request("t", "n", 1.1)
    assert "task:t" not in book.woken(1.1)
    book.finish("t", "n", 1, Severity.OK, 1.2, result=7)
    assert "task:t" in book.woken(1.2)
    assert "task:t" not in book.woken(1.2)  # drained
    response = json.loads(finish_poll(book, outcome.poll, 1.3))
    assert response["id"] == 9 and response["result"]["state"] == "complete"
    assert response["result"]["result"] == 7  # the result comes with the wait
    assert "result" not in now_status  # only once complete
    assert ok(book, "client_task_wait", ["c", "t", 800])["success"] == "ok"  # not parked
    err(book, "client_task_wait", ["c", "nope", 10], -32004)
    err(book, "client_task_wait", ["c", "t", 99999], -32602)
    book.create_zerotask("c", "m", None, "bad", 2.0)
    book.node_task_request("bad", "n", 2.1)
    book.finish("bad", "n", 1, Severity.ERROR, 2.2, error={"code": 1, "message": "no"})
    failed = ok(book, "client_task_wait", ["c", "bad", 0])
    assert failed["success"] == "error" and "result" not in failed  # client_task_result says
    batch = [
        dict(body, params=["c", "t", 800]),
        dict(body, id=10, params={"client_id": "c", "task_id": "t", "wait_ms": 5}),
    ]
    reply = handle(book, json.dumps(batch).encode(), 2.0).reply
    assert reply is not None
    assert [r["result"]["state"] for r in json.loads(reply)] == ["complete", "complete"]
