"""Who may create tasks (A1-A4): roles from the network config's admins, refusals logged."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from scale0.config.model import Admin
from scale0.crypto.passwords import hash_password
from scale0.tasks import auth
from scale0.tasks.auth import Authorizer
from scale0.tasks.book import Book
from scale0.tasks.errors import ErrorCode, Refused
from scale0.tasks.vespid import handle as vespid_handle
from scale0.tasks.zerotask import handle as zerotask_handle
from tests.tasks.helpers import new_book, vespid

ADMINS = (
    Admin("boss", hash_password("pw-boss", n=2**4), "admin"),
    Admin("viewer", hash_password("pw-view", n=2**4), "read"),
)


def secured() -> Book:
    book = new_book()
    book.authorizer = Authorizer(ADMINS)
    book.client_connect("c", 0.0)
    return book


def test_rules_header_lists_a1_to_a4() -> None:
    assert re.findall(r"^(A\d+)\s", auth.__doc__ or "", re.MULTILINE) == ["A1", "A2", "A3", "A4"]


def test_roles_and_passwords(caplog: pytest.LogCaptureFixture) -> None:
    authorizer = Authorizer(ADMINS)
    assert authorizer.check("boss", "pw-boss", "x") == "boss"
    assert authorizer.check("boss", "pw-boss", "x") == "boss"  # A3: remembered
    caplog.set_level(logging.WARNING, logger="scale0.tasks")
    for auth_id, password in [
        ("boss", "wrong"),
        ("viewer", "pw-view"),
        ("ghost", "x"),
        (None, None),
        (3, []),
    ]:
        with pytest.raises(Refused) as caught:
            authorizer.check(auth_id, password, "task-create 'job'")
        assert caught.value.code is ErrorCode.FORBIDDEN
    assert "by auth_id 'viewer'" in caplog.text  # A2: who asked
    assert "task-create 'job'" in caplog.text
    assert Authorizer(ADMINS, roles={"admin", "read"}).check("viewer", "pw-view", "x") == "viewer"


def rpc(book: Book, params: Any) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "method": "zerotask.broker.client_new_task",
        "params": params,
        "id": 1,
    }
    reply = zerotask_handle(book, json.dumps(body).encode(), 1.0).reply
    assert reply is not None
    result: dict[str, Any] = json.loads(reply)
    return result


def test_zerotask_needs_an_admin() -> None:
    book = secured()
    assert rpc(book, ["c", "m", 1, "t1"])["error"]["code"] == -32008
    named = {"client_id": "c", "method": "m", "params": 1, "task_id": "t1"}
    assert (
        rpc(book, {**named, "auth_id": "viewer", "auth_password": "pw-view"})["error"]["code"]
        == -32008
    )
    assert not book.tasks
    assert rpc(book, {**named, "auth_id": "boss", "auth_password": "pw-boss"})["result"] == "t1"
    assert rpc(book, ["c", "m", 2, "t2", "boss", "pw-boss"])["result"] == "t2"


def test_vespid_needs_an_admin_and_records_who() -> None:
    book = secured()

    def create(**extra: Any) -> dict[str, Any]:
        body = json.dumps({"command": "task-create", **vespid("v"), **extra}).encode()
        reply = vespid_handle(book, body, 1.0).reply
        assert reply is not None
        result: dict[str, Any] = json.loads(reply)
        return result

    refused = create()
    assert (refused["command"], refused["code"], refused["error"]) == ("error", -32008, "forbidden")
    assert create(auth_id="boss", auth_password="nope")["code"] == -32008
    assert not book.tasks
    assert create(auth_id="boss", auth_password="pw-boss")["command"] == "task-create-response"
    assert book.tasks["v"].owner == "boss"
    assert "auth_password" not in json.dumps(book.tasks["v"].to_json())


def test_open_without_authorizer() -> None:
    assert new_book().authorize(None, None, "x") is None


def command(book: Book, message: dict[str, Any]) -> dict[str, Any]:
    reply = vespid_handle(book, json.dumps(message).encode(), 1.0).reply
    assert reply is not None
    result: dict[str, Any] = json.loads(reply)
    return result


BOSS = {"auth_id": "boss", "auth_password": "pw-boss"}
VIEWER = {"auth_id": "viewer", "auth_password": "pw-view"}


def test_cancel_needs_a_submit_role(caplog: pytest.LogCaptureFixture) -> None:
    book = secured()
    assert command(book, {"command": "task-create", **vespid("v"), **BOSS})["name"] == "v"
    caplog.set_level(logging.WARNING, logger="scale0.tasks")
    for credentials in ({}, VIEWER, {"auth_id": "boss", "auth_password": "nope"}):
        refused = command(book, {"command": "task-cancel", "name": "v", **credentials})
        assert (refused["code"], refused["error"]) == (-32008, "forbidden"), refused
        assert "role admin" in refused["message"]
    assert "task-cancel 'v' by auth_id 'viewer'" in caplog.text
    assert book.tasks["v"].state.value == "pending"
    # The credentials are checked before the name: no probing for task names without them.
    assert command(book, {"command": "task-cancel", "name": "ghost"})["code"] == -32008
    assert command(book, {"command": "task-cancel", "name": "ghost", **BOSS})["code"] == -32004
    cancelled = command(book, {"command": "task-cancel", "name": "v", **BOSS})
    assert cancelled["command"] == "task-cancel-response"
    assert book.tasks["v"].state.value == "complete"


def test_list_explain_and_stats_need_any_admin_info_stays_open() -> None:
    book = secured()
    command(book, {"command": "task-create", **vespid("v"), **BOSS})
    for name in ("task-list", "task-explain", "task-stats"):
        message = {"command": name, "name": "v"}
        assert command(book, message)["code"] == -32008
        wrong = {"auth_id": "viewer", "auth_password": "pw-boss"}
        assert command(book, {**message, **wrong})["code"] == -32008
        assert command(book, {**message, **VIEWER})["command"] == f"{name}-response"
        assert command(book, {**message, **BOSS})["command"] == f"{name}-response"
    # A running task reads its own task-info without credentials (docs/tasks.md §10).
    assert command(book, {"command": "task-info", "name": "v"})["state"] == "pending"


def test_a_remembered_read_grant_does_not_allow_cancel() -> None:
    authorizer = Authorizer(ADMINS)
    assert authorizer.check("viewer", "pw-view", "task-list", auth.READ_ROLES) == "viewer"
    with pytest.raises(Refused):
        authorizer.check("viewer", "pw-view", "task-cancel 'v'")
