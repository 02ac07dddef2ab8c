"""The vespid front end: JSON command bytes -> Book operations -> response bytes (pure).

Commands (docs/tasks.md §3.2) are rows of :data:`COMMANDS`, an explicit table. Every reply is
one JSON object whose ``command`` is the request's plus ``-response`` (``task-info`` ->
``task-info-response``), or ``"error"`` with ``code`` (the shared numeric code), ``error`` (its
name, e.g. ``id-taken``), ``message`` and ``request`` (the command refused).

Rules:

V1  Bytes that are not JSON: parse-error (-32700). Not an object, or no string ``command``:
    invalid-request (-32600). An unknown command: method-not-found (-32601).
V2  Fields are checked before any change; a wrong one is invalid-params or invalid-task naming
    the field.
V3  ``task-info`` for a name the coordinator does not know answers ``status: "invalid"`` (the
    vespid way of saying "no such task"), not an error.
V4  ``status`` is null while a task waits or is pending, ``working`` while it runs,
    ``complete`` at the end; ``success`` follows S1/S2 of scale0.tasks.model.
V5  The operator commands check credentials first (A1 of scale0.tasks.auth, when the
    coordinator has ``admins_from``): ``task-cancel`` needs a submit role, ``task-list``,
    ``task-explain`` and ``task-stats`` any admin; ``task-info`` stays open (a running task
    calls it without credentials, docs/tasks.md §10).
V6  ``task-stats`` only reads: the numbers of scale0.tasks.report (state counts under
    ``states``) plus ``queue_depth`` and the ``recent`` most recently changed tasks (task-list
    rows, newest first; 0..MAX_RECENT, default DEFAULT_RECENT). The broker's management page
    asks it (docs/management.md "Tasks").
"""

from __future__ import annotations

import heapq
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from scale0.tasks.auth import READ_ROLES
from scale0.tasks.book import Book
from scale0.tasks.errors import ErrorCode, Refused
from scale0.tasks.messages import iter_create_fields
from scale0.tasks.model import Protocol, Severity, TaskRecord, TaskState, severity_from
from scale0.tasks.placement import parse_requirements, verdicts
from scale0.tasks.report import report
from scale0.tasks.zerotask import Outcome

__all__ = [
    "COMMANDS",
    "DEFAULT_RECENT",
    "MAX_RECENT",
    "handle",
    "list_row",
    "node_verdicts",
    "task_info",
    "vespid_status",
]

log = logging.getLogger("scale0.tasks")

#: V6: how many recent tasks ``task-stats`` returns by default, and at most.
DEFAULT_RECENT: Final = 20
MAX_RECENT: Final = 200

_STATUS: Final = {
    TaskState.WAITING: None,
    TaskState.PENDING: None,
    TaskState.RUNNING: "working",
    TaskState.COMPLETE: "complete",
}


def vespid_status(state: TaskState) -> str | None:
    """V4: the vespid ``status`` of a state."""
    return _STATUS[state]


def task_info(book: Book, task: TaskRecord) -> dict[str, Any]:
    """The task-info-response of ``task`` (task-create fields, times, status, success, more)."""
    info: dict[str, Any] = {"command": "task-info-response"}
    info.update(iter_create_fields(task))
    info.update(
        {
            "time-create": task.time_create,
            "time-start": task.time_start,
            "time-finish": task.time_finish,
            "status": vespid_status(task.state),
            "success": None if task.success is None else task.success.label,
            "state": task.state.value,
            "attempt": task.attempt,
            "node": task.node,
            "explain": book.explain(task),
            "protocol": task.protocol.value,
            "reruns": task.reruns,
            "refused": task.refused,
            "error": task.error,
        }
    )
    if task.protocol is Protocol.ZEROTASK:
        info.update({"method": task.method, "params": task.params, "owner": task.owner})
    return info


def _name(message: dict[str, Any], field: str = "name") -> str:
    value = message.get(field)
    if not isinstance(value, str) or not value:
        raise Refused(ErrorCode.INVALID_PARAMS, f"{field} must be a non-empty string")
    return value


def _create(book: Book, message: dict[str, Any], now: float, caller: str | None) -> dict[str, Any]:
    spec = dict(message)
    auth_id = spec.pop("auth_id", None)
    password = spec.pop("auth_password", None)
    who = book.authorize(auth_id, password, f"task-create {spec.get('name')!r}")
    name = book.create_vespid(spec, who or caller, now)
    return {"name": name, "status": vespid_status(book.tasks[name].state)}


def _info(book: Book, message: dict[str, Any], now: float, caller: str | None) -> dict[str, Any]:
    name = _name(message)
    task = book.tasks.get(name)
    if task is None:
        return {"name": name, "status": "invalid", "explain": f"no task {name!r}"}
    return task_info(book, task)


def _node_set(
    book: Book, message: dict[str, Any], now: float, caller: str | None
) -> dict[str, Any]:
    return {"name": book.node_set(message, now)}


def _complete(
    book: Book, message: dict[str, Any], now: float, caller: str | None
) -> dict[str, Any]:
    name = _name(message)
    node = _name(message, "node")
    success = severity_from(message.get("success"))
    if success is None:
        raise Refused(
            ErrorCode.INVALID_PARAMS,
            "success must be one of ok, warning, error, fatal, terminated",
        )
    attempt = message.get("attempt")
    if attempt is not None and (not isinstance(attempt, int) or isinstance(attempt, bool)):
        raise Refused(ErrorCode.INVALID_PARAMS, "attempt must be an integer")
    book.heard(node, now)  # a lost node's late report is still fenced and recorded (F3)
    accepted = book.finish(name, node, attempt, success, now)
    return {"name": name, "duplicate": not accepted}


def _operator(
    book: Book, message: dict[str, Any], what: str, roles: frozenset[str] | None = None
) -> None:
    """V5: the credentials of an operator command (checked before anything else)."""
    book.authorize(message.get("auth_id"), message.get("auth_password"), what, roles)


def _cancel(book: Book, message: dict[str, Any], now: float, caller: str | None) -> dict[str, Any]:
    name = _name(message)
    _operator(book, message, f"task-cancel {name!r}")
    before = book.task(name)
    task = book.cancel(name, now)
    return {
        "name": task.name,
        "status": vespid_status(task.state),
        "state": task.state.value,
        "success": None if task.success is None else task.success.label,
        "was": before.state.value,
        "attempt": before.attempt,
        "node": before.node if before.state is TaskState.RUNNING else None,
    }


def list_row(task: TaskRecord) -> dict[str, Any]:
    """One task as task-list shows it."""
    return {
        "name": task.name,
        "protocol": task.protocol.value,
        "state": task.state.value,
        "success": None if task.success is None else task.success.label,
        "attempt": task.attempt,
        "node": task.node,
        "time-create": task.time_create,
        "time-start": task.time_start,
        "time-finish": task.time_finish,
    }


def _list(book: Book, message: dict[str, Any], now: float, caller: str | None) -> dict[str, Any]:
    state = message.get("state")
    if state is not None and (
        not isinstance(state, str) or state not in {s.value for s in TaskState}
    ):
        raise Refused(
            ErrorCode.INVALID_PARAMS, f"state must be one of {[s.value for s in TaskState]}"
        )
    _operator(book, message, "task-list", READ_ROLES)
    tasks = [
        list_row(task) for task in book.tasks.values() if state is None or task.state.value == state
    ]
    return {"tasks": tasks, "counts": book.counts()}


def node_verdicts(book: Book, task: TaskRecord) -> list[dict[str, Any]]:
    """Per node: could it take ``task`` now, and if not, which requirement fails (P6). Empty
    unless the task waits for a node (pending) or for its parent (waiting)."""
    if task.state not in (TaskState.PENDING, TaskState.WAITING):
        return []
    if task.protocol is Protocol.VESPID:
        req = parse_requirements(task.requirements, task.repositories)
        return [
            {"node": node, "fits": reason is None, "fits_idle": idle, "reason": reason}
            for node, reason, idle in verdicts(req, book.loads())
        ]
    rows = []
    for load in sorted(book.loads(), key=lambda item: item.record.name):
        node = load.record
        reason = None
        if not load.alive or not node.zerotask:
            reason = "not connected" if not load.alive else "not a zerotask node"
        elif node.methods and task.method not in node.methods:
            reason = f"does not serve method {task.method!r}"
        rows.append(
            {"node": node.name, "fits": reason is None, "fits_idle": None, "reason": reason}
        )
    return rows


def _explain(book: Book, message: dict[str, Any], now: float, caller: str | None) -> dict[str, Any]:
    name = _name(message)
    _operator(book, message, f"task-explain {name!r}", READ_ROLES)
    task = book.task(name)
    return {
        "name": task.name,
        "protocol": task.protocol.value,
        "state": task.state.value,
        "status": vespid_status(task.state),
        "success": None if task.success is None else task.success.label,
        "attempt": task.attempt,
        "node": task.node,
        "parent": task.parent,
        "explain": book.explain(task),
        "nodes": node_verdicts(book, task),
    }


def _last_change(task: TaskRecord) -> tuple[float, str]:
    """When ``task`` last changed state (finish, start or create), then its name (a fixed
    order among tasks that changed at the same moment)."""
    times = [t for t in (task.time_finish, task.time_start, task.time_create) if t is not None]
    return (max(times) if times else 0.0, task.name)


def _stats(book: Book, message: dict[str, Any], now: float, caller: str | None) -> dict[str, Any]:
    recent = message.get("recent", DEFAULT_RECENT)
    if not isinstance(recent, int) or isinstance(recent, bool) or not 0 <= recent <= MAX_RECENT:
        raise Refused(ErrorCode.INVALID_PARAMS, f"recent must be an integer from 0 to {MAX_RECENT}")
    _operator(book, message, "task-stats", READ_ROLES)
    numbers = report(book)
    numbers["states"] = numbers.pop("tasks")
    latest = heapq.nlargest(recent, book.tasks.values(), key=_last_change) if recent else []
    return {
        **numbers,
        "queue_depth": sum(numbers["queue"].values()),
        "recent": [list_row(task) for task in latest],
        "time": now,
    }


Command = Callable[[Book, dict[str, Any], float, str | None], dict[str, Any]]

#: Every command (docs/tasks.md §3.2); task-cancel, task-list, task-explain and task-stats
#: are extensions.
COMMANDS: Final[dict[str, Command]] = {
    "task-create": _create,
    "task-info": _info,
    "node-set": _node_set,
    "task-complete": _complete,
    "task-cancel": _cancel,
    "task-list": _list,
    "task-explain": _explain,
    "task-stats": _stats,
}


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _error(code: ErrorCode, message: str, request: object, data: Any = None) -> bytes:
    reply: dict[str, Any] = {
        "command": "error",
        "code": int(code),
        "error": code.slug,
        "message": message,
        "request": request if isinstance(request, str) else None,
    }
    if data is not None:
        reply["data"] = data
    return _dump(reply)


def handle(book: Book, body: bytes, now: float, caller: str | None = None) -> Outcome:
    """V1-V4: one command -> its reply."""
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return Outcome(_error(ErrorCode.PARSE_ERROR, f"parse error: {exc}", None))
    if not isinstance(message, dict) or not isinstance(message.get("command"), str):
        return Outcome(
            _error(
                ErrorCode.INVALID_REQUEST, "a command must be an object with a string command", None
            )
        )
    command = message["command"]
    handler = COMMANDS.get(command)
    if handler is None:
        return Outcome(_error(ErrorCode.METHOD_NOT_FOUND, f"unknown command {command!r}", command))
    try:
        reply = handler(book, message, now, caller)
    except Refused as exc:
        return Outcome(_error(exc.code, exc.message, command, exc.data))
    except Exception as exc:  # a bug must not stop the coordinator
        log.exception("vespid %s failed", command)
        return Outcome(_error(ErrorCode.INTERNAL_ERROR, f"internal error: {exc!r}", command))
    return Outcome(_dump({"command": f"{command}-response", **reply}))


_ = Severity  # re-exported for callers building task-complete
