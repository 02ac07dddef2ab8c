"""The zerotask front end: JSON-RPC 2.0 request bytes -> Book operations -> response bytes (pure).

Every method of docs/tasks.md §3 is one row of :data:`METHODS` (an explicit table: a method
name from the wire is only ever a key). Parameters may come by position or by name; the table
says each one's name, type and whether it is required. Errors are JSON-RPC 2.0's codes plus
the coordinator's (:class:`scale0.tasks.errors.ErrorCode`).

Rules:

Z1  Bytes that are not JSON: -32700 (id null). A value that is not a request object (or a
    non-empty array of them), a ``jsonrpc`` other than "2.0", a non-string ``method``, an id
    that is not a string, number or null, or ``params`` that are neither array nor object:
    -32600.
Z2  An unknown method: -32601. Missing, surplus or mistyped parameters: -32602 naming the
    parameter. Only ``task_status`` (and ``node_status``) accept extra named parameters (**kwargs).
Z3  A request without ``id`` is a notification: it is carried out and gets no response. A
    batch answers with an array of the responses it has; a batch of notifications only, with
    an empty body.
Z4  An exception inside an operation is -32603 with its message; the coordinator keeps serving.
Z5  ``node_poll`` with nothing waiting, or ``client_task_wait`` of a task not complete, with
    ``wait_ms`` > 0 is parked (Outcome.poll): the process waits until the node has something
    or the task completes (Book.woken) or the time is up, then calls :func:`finish_poll`.
    Inside a batch neither is parked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from scale0.tasks.book import Book
from scale0.tasks.errors import ErrorCode, Refused
from scale0.tasks.model import Severity, TaskRecord, TaskState

__all__ = ["MAX_WAIT_MS", "METHODS", "Outcome", "PollWait", "finish_poll", "handle"]

log = logging.getLogger("scale0.tasks")

#: The longest a node_poll may be parked.
MAX_WAIT_MS: Final = 5000
_MISSING: Final = object()


@dataclass(frozen=True, slots=True)
class PollWait:
    """A parked node_poll or client_task_wait (Z5): ``node`` is the node, or the task waited on."""

    node: str
    wait_s: float
    active: Any
    request_id: Any
    kind: str = "node"
    client: Any = None
    room: Any = None

    @property
    def key(self) -> str:
        """What wakes it: ``node:NAME`` or ``task:NAME`` (see Book.woken)."""
        return f"{self.kind}:{self.node}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request body gives: the reply body (None: parked poll) and the parked poll."""

    reply: bytes | None
    poll: PollWait | None = None


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    kind: str  # "id" (string), "str", "int", "list", "object", "any"
    required: bool = True


@dataclass(frozen=True, slots=True)
class Method:
    params: tuple[Param, ...]
    call: Callable[[Book, dict[str, Any], float], Any]
    extra: bool = False


_KINDS: Final[dict[str, Callable[[object], bool]]] = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "any": lambda v: True,
}


def _bind(method_name: str, spec: Method, params: object) -> dict[str, Any]:
    """Z2: the arguments by name, or Refused(INVALID_PARAMS) naming the parameter."""
    names = [p.name for p in spec.params]
    args: dict[str, Any] = {}
    if isinstance(params, list):
        if len(params) > len(spec.params):
            raise Refused(
                ErrorCode.INVALID_PARAMS,
                f"{method_name} takes at most {len(spec.params)} positional parameters "
                f"({', '.join(names)}), got {len(params)}",
            )
        args = dict(zip(names, params, strict=False))
    elif isinstance(params, dict):
        args = dict(params)
        surplus = sorted(set(args) - set(names))
        if surplus and not spec.extra:
            raise Refused(
                ErrorCode.INVALID_PARAMS, f"{method_name} has no parameter {surplus[0]!r}"
            )
    for param in spec.params:
        value = args.get(param.name, _MISSING)
        if value is _MISSING or (value is None and not param.required):
            if param.required:
                raise Refused(
                    ErrorCode.INVALID_PARAMS, f"{method_name}: parameter {param.name!r} is missing"
                )
            args[param.name] = None
            continue
        if not _KINDS[param.kind](value):
            raise Refused(
                ErrorCode.INVALID_PARAMS,
                f"{method_name}: parameter {param.name!r} must be {param.kind}, "
                f"not {type(value).__name__}",
            )
    return args


def _extra(args: Mapping[str, Any], spec: Method) -> dict[str, Any]:
    known = {p.name for p in spec.params}
    return {key: value for key, value in args.items() if key not in known}


def _status(task: TaskRecord) -> dict[str, Any]:
    return {
        "task_id": task.name,
        "state": task.state.value,
        "status": task.status,
        "kwargs": task.status_kwargs,
        "attempt": task.attempt,
        "node": task.node,
        "success": None if task.success is None else task.success.label,
    }


def _waited(task: TaskRecord) -> dict[str, Any]:
    """client_task_wait's answer: the status object, plus ``result`` once the task completed
    ``ok`` or ``warning`` (what client_task_result would answer, saving that request)."""
    status = _status(task)
    if task.state is TaskState.COMPLETE and (
        task.success is None or task.success <= Severity.WARNING
    ):
        status["result"] = task.result
    return status


def _result(book: Book, args: dict[str, Any], now: float) -> Any:
    task = book.owned_task(args["client_id"], args["task_id"])
    if task.state is not TaskState.COMPLETE:
        raise Refused(ErrorCode.NOT_FINISHED, f"task {task.name!r} is {task.state.value}")
    if task.success is not None and task.success > Severity.WARNING:
        raise Refused(ErrorCode.TASK_FAILED, f"task {task.name!r} failed", task.error)
    return task.result


def _new_task(book: Book, args: dict[str, Any], now: float) -> str:
    book.authorize(args["auth_id"], args["auth_password"], f"client_new_task {args['method']}")
    return book.create_zerotask(
        args["client_id"], args["method"], args["params"], args["task_id"], now
    )


def _finished(book: Book, args: dict[str, Any], now: float) -> bool:
    book.finish(
        args["task_id"],
        args["node_id"],
        args["attempt"],
        Severity.OK,
        now,
        result=args["task_result"],
    )
    return True


def _failed(book: Book, args: dict[str, Any], now: float) -> bool:
    error = args["error"]
    if not isinstance(error.get("code"), int) or not isinstance(error.get("message"), str):
        raise Refused(
            ErrorCode.INVALID_PARAMS,
            "node_task_failed: error must be a JSON-RPC error object with code and message",
        )
    book.finish(args["task_id"], args["node_id"], args["attempt"], Severity.ERROR, now, error=error)
    return True


def _task_status(book: Book, args: dict[str, Any], now: float) -> bool:
    spec = METHODS["zerotask.broker.task_status"]
    kwargs = _extra(args, spec)
    attempt = kwargs.pop("attempt", None)
    if attempt is not None and (not isinstance(attempt, int) or isinstance(attempt, bool)):
        raise Refused(ErrorCode.INVALID_PARAMS, "task_status: attempt must be int")
    book.heard(args["node_id"], now)
    book.report_status(args["task_id"], args["node_id"], attempt, args["status"], kwargs, now)
    return True


def _node_status(book: Book, args: dict[str, Any], now: float) -> bool:
    book.node_status(args["node_id"], args["methods"], now)
    return True


def _disconnect_client(book: Book, args: dict[str, Any], now: float) -> bool:
    book.client_disconnect(args["client_id"])
    return True


def _disconnect_node(book: Book, args: dict[str, Any], now: float) -> bool:
    book.node_disconnect(args["node_id"], now)
    return True


def _heartbeat(book: Book, args: dict[str, Any], now: float) -> bool:
    book.node(args["node_id"], now)
    return True


def _cancel(book: Book, args: dict[str, Any], now: float) -> Any:
    book.owned_task(args["client_id"], args["task_id"])
    return _status(book.cancel(args["task_id"], now))


def _node_poll(book: Book, args: dict[str, Any], now: float) -> Any:
    return book.poll(args["node_id"], args["active"], now, args["room"])


_B = "zerotask.broker."

#: Every method (docs/tasks.md §3); the extensions are marked there.
METHODS: Final[dict[str, Method]] = {
    _B + "client_connect": Method(
        (Param("client_id", "any", False),), lambda b, a, n: b.client_connect(a["client_id"], n)
    ),
    _B + "client_disconnect": Method((Param("client_id", "any"),), _disconnect_client),
    _B + "client_new_task": Method(
        (
            Param("client_id", "any"),
            Param("method", "str"),
            Param("params", "any"),
            Param("task_id", "any", False),
            Param("auth_id", "str", False),
            Param("auth_password", "str", False),
        ),
        _new_task,
    ),
    _B + "client_task_status": Method(
        (Param("client_id", "any"), Param("task_id", "any")),
        lambda b, a, n: _status(b.owned_task(a["client_id"], a["task_id"])),
    ),
    _B + "client_task_result": Method(
        (Param("client_id", "any"), Param("task_id", "any")), _result
    ),
    _B + "client_task_wait": Method(
        (Param("client_id", "any"), Param("task_id", "any"), Param("wait_ms", "int", False)),
        lambda b, a, n: _waited(b.owned_task(a["client_id"], a["task_id"])),
    ),
    _B + "client_task_cancel": Method(
        (Param("client_id", "any"), Param("task_id", "any")), _cancel
    ),
    _B + "node_connect": Method(
        (Param("node_id", "any", False),), lambda b, a, n: b.node_connect(a["node_id"], n)
    ),
    _B + "node_heartbeat": Method((Param("node_id", "any"),), _heartbeat),
    _B + "node_disconnect": Method((Param("node_id", "any"),), _disconnect_node),
    _B + "node_task_request": Method(
        (Param("task_id", "any"), Param("node_id", "any", False)),
        lambda b, a, n: b.node_task_request(a["task_id"], a["node_id"], n),
    ),
    _B + "task_status": Method(
        (Param("node_id", "any"), Param("task_id", "any"), Param("status", "any")),
        _task_status,
        extra=True,
    ),
    _B + "node_task_finished": Method(
        (
            Param("task_id", "any"),
            Param("task_result", "any"),
            Param("node_id", "any", False),
            Param("attempt", "int", False),
        ),
        _finished,
    ),
    _B + "node_task_failed": Method(
        (
            Param("task_id", "any"),
            Param("error", "object"),
            Param("node_id", "any", False),
            Param("attempt", "int", False),
        ),
        _failed,
    ),
    _B + "node_status": Method(
        (Param("node_id", "any"), Param("methods", "list", False)), _node_status, extra=True
    ),
    _B + "node_poll": Method(
        (
            Param("node_id", "any"),
            Param("wait_ms", "int", False),
            Param("active", "list", False),
            Param("room", "int", False),
        ),
        _node_poll,
    ),
}


def _error(
    code: ErrorCode | int, message: str, request_id: Any, data: Any = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": request_id}


def _valid_id(value: object) -> bool:
    return value is None or (isinstance(value, str | int | float) and not isinstance(value, bool))


def _one(book: Book, request: object, now: float, polls: list[PollWait]) -> dict[str, Any] | None:
    """One request object -> its response (None for a notification)."""
    if not isinstance(request, dict):
        return _error(ErrorCode.INVALID_REQUEST, "a request must be a JSON object", None)
    request_id = request.get("id")
    notification = "id" not in request
    if not _valid_id(request_id):
        return _error(ErrorCode.INVALID_REQUEST, "id must be a string, a number or null", None)
    if request.get("jsonrpc") != "2.0":
        return _error(ErrorCode.INVALID_REQUEST, 'jsonrpc must be "2.0"', request_id)
    name = request.get("method")
    if not isinstance(name, str):
        return _error(ErrorCode.INVALID_REQUEST, "method must be a string", request_id)
    params = request.get("params", [])
    if not isinstance(params, list | dict):
        return _error(ErrorCode.INVALID_REQUEST, "params must be an array or object", request_id)
    spec = METHODS.get(name)
    if spec is None:
        response = _error(ErrorCode.METHOD_NOT_FOUND, f"unknown method {name!r}", request_id)
        return None if notification else response
    try:
        args = _bind(name, spec, params)
        if name == _B + "node_poll" and not notification:
            wait = args["wait_ms"] or 0
            if not 0 <= wait <= MAX_WAIT_MS:
                raise Refused(ErrorCode.INVALID_PARAMS, f"wait_ms must be 0..{MAX_WAIT_MS}")
            messages = book.poll(args["node_id"], args["active"], now, args["room"])
            if messages or wait == 0:
                result: Any = messages
            else:
                polls.append(
                    PollWait(
                        args["node_id"],
                        wait / 1000,
                        args["active"],
                        request_id,
                        room=args["room"],
                    )
                )
                return None
        elif name == _B + "client_task_wait" and not notification:
            wait = args["wait_ms"] or 0
            if not 0 <= wait <= MAX_WAIT_MS:
                raise Refused(ErrorCode.INVALID_PARAMS, f"wait_ms must be 0..{MAX_WAIT_MS}")
            task = book.owned_task(args["client_id"], args["task_id"])
            if task.state is TaskState.COMPLETE or wait == 0:
                result = _waited(task)
            else:
                polls.append(
                    PollWait(task.name, wait / 1000, None, request_id, "task", args["client_id"])
                )
                return None
        else:
            result = spec.call(book, args, now)
    except Refused as exc:
        response = _error(exc.code, exc.message, request_id, exc.data)
    except Exception as exc:  # Z4: a bug must not stop the coordinator
        log.exception("zerotask %s failed", name)
        response = _error(ErrorCode.INTERNAL_ERROR, f"internal error: {exc!r}", request_id)
    else:
        response = {"jsonrpc": "2.0", "result": result, "id": request_id}
    return None if notification else response


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def handle(book: Book, body: bytes, now: float) -> Outcome:
    """Z1-Z5: one request body (a request or a batch) -> the response body."""
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return Outcome(_dump(_error(ErrorCode.PARSE_ERROR, f"parse error: {exc}", None)))
    polls: list[PollWait] = []
    if isinstance(message, list):
        if not message:
            return Outcome(_dump(_error(ErrorCode.INVALID_REQUEST, "empty batch", None)))
        responses = []
        for item in message:
            request = item
            if isinstance(item, dict) and item.get("method") in _WAIT_AT:
                where = _WAIT_AT[str(item.get("method"))]
                request = {**item, "params": _no_wait(item.get("params"), where)}
            response = _one(book, request, now, polls)
            if response is not None:
                responses.append(response)
        return Outcome(_dump(responses) if responses else b"")
    response = _one(book, message, now, polls)
    if polls:
        return Outcome(None, polls[0])
    return Outcome(b"" if response is None else _dump(response))


#: Methods that may be parked, and the position of their ``wait_ms``.
_WAIT_AT: Final = {_B + "node_poll": 1, _B + "client_task_wait": 2}


def _no_wait(params: object, index: int) -> object:
    """A waiting method inside a batch is never parked."""
    if isinstance(params, dict):
        return {**params, "wait_ms": 0}
    if isinstance(params, list) and len(params) > index:
        return [*params[:index], 0, *params[index + 1 :]]
    return params


def finish_poll(book: Book, wait: PollWait, now: float) -> bytes:
    """Z5: the response to a parked wait: what waits for the node now (maybe nothing), or the
    task's status (complete, or not yet when the time is up)."""
    try:
        if wait.kind == "task":
            messages: Any = _waited(book.owned_task(wait.client, wait.node))
        else:
            messages = book.poll(wait.node, wait.active, now, wait.room)
    except Refused as exc:
        return _dump(_error(exc.code, exc.message, wait.request_id, exc.data))
    return _dump({"jsonrpc": "2.0", "result": messages, "id": wait.request_id})
