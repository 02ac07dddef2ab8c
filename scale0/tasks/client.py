"""TaskClient: the Python API for both task protocols, over a Scale0 client (any broker).

The one module of scale0.tasks that does I/O (setup.cfg lets it import scale0.net.client);
everything it decides is in the request it sends.

Rules:

K1  ``call`` sends one JSON-RPC request to the zerotask service and returns its ``result``;
    an error response raises :class:`TaskError` (code, message, data).
K2  ``command`` sends one vespid command and returns the reply object; ``"error"`` replies
    raise TaskError with the same numeric code.
K3  A request the family could not deliver (no coordinator: 503, lost: 504, timeout) is sent
    again until ``retry_s`` is spent. Creates with an id are safe to resend (B2); a resent
    ``client_connect`` that finds its own id taken counts as connected.
K4  ``submit_each`` and ``results`` send one JSON-RPC request per task (``client_new_task``,
    ``client_task_wait``) with up to ``window`` of them in flight at once: the rate of one
    request per task without a round trip per task. A transport failure sends the whole list
    again (K3: creates carry their ids, waits only read).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from typing import Any, Final, Self

from scale0.net.client import Client
from scale0.net.errors import RequestTimeout, Scale0Error, ServiceUnavailable, WorkerLost
from scale0.tasks.errors import ErrorCode

__all__ = ["TaskClient", "TaskError"]

_TRANSIENT: Final = (RequestTimeout, ServiceUnavailable, WorkerLost)
_BROKER: Final = "zerotask.broker."


class TaskError(Exception):
    """The coordinator refused a call; ``code`` is an ErrorCode value (docs/tasks.md §5)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"{code}: {message}")


class TaskClient:
    """Submit and follow tasks through the broker frontend at ``endpoint`` (any of the family)."""

    def __init__(
        self,
        endpoint: str,
        *,
        zerotask_service: str = "zerotask",
        vespid_service: str = "vespid",
        timeout: float = 5.0,
        retry_s: float = 30.0,
        heartbeat_interval: float = 0.1,
        auth_id: str | None = None,
        auth_password: str | None = None,
        client: Client | None = None,
    ) -> None:
        self.auth_id = auth_id
        self.auth_password = auth_password
        self.zerotask_service = zerotask_service
        self.vespid_service = vespid_service
        self.retry_s = retry_s
        self.client_id: str | None = None
        # A short interval is raised to the family's default (C5): so we heartbeat as often as
        # the broker expects, and a long-polling node is never taken for a silent one.
        self._client = (
            client
            if client is not None
            else Client(endpoint, timeout=timeout, heartbeat_interval=heartbeat_interval)
        )
        self._ids = itertools.count(1)

    # ---- transport ----

    def _request(self, service: str, payload: dict[str, Any] | list[Any]) -> Any:
        body = json.dumps(payload, separators=(",", ":")).encode()
        limit = time.monotonic() + self.retry_s
        while True:
            try:
                frames = self._client.request(service, body)
                break
            except _TRANSIENT:
                if time.monotonic() >= limit:
                    raise
                time.sleep(0.2)
        if not frames or not frames[0]:
            return None
        return json.loads(frames[0])

    def _request_many(self, service: str, payloads: list[dict[str, Any]], window: int) -> list[Any]:
        """K4: one request per payload, ``window`` in flight; the decoded replies in order."""
        bodies = [json.dumps(p, separators=(",", ":")).encode() for p in payloads]
        limit = time.monotonic() + self.retry_s
        while True:
            try:
                replies = self._client.request_many(service, bodies, window=window)
                break
            except _TRANSIENT:
                if time.monotonic() >= limit:
                    raise
                time.sleep(0.2)
        return [json.loads(frames[0]) if frames and frames[0] else None for frames in replies]

    def _calls_each(
        self, calls: list[tuple[str, list[Any] | dict[str, Any]]], window: int
    ) -> list[Any | TaskError]:
        """K4: each call in its own request; each item is its result or its TaskError."""
        first = next(self._ids)
        payloads = [
            {"jsonrpc": "2.0", "method": _BROKER + method, "params": params, "id": first + index}
            for index, (method, params) in enumerate(calls)
        ]
        for _ in calls[1:]:
            next(self._ids)
        results: list[Any | TaskError] = []
        for response in self._request_many(self.zerotask_service, payloads, window):
            if not isinstance(response, dict):
                results.append(
                    TaskError(int(ErrorCode.INTERNAL_ERROR), f"unexpected response {response!r}")
                )
            elif "error" in response:
                error = response["error"]
                results.append(
                    TaskError(error.get("code", 0), error.get("message", ""), error.get("data"))
                )
            else:
                results.append(response.get("result"))
        return results

    def call(self, method: str, params: list[Any] | dict[str, Any] | None = None) -> Any:
        """K1: one zerotask method (``method`` without the ``zerotask.broker.`` prefix is fine)."""
        name = method if "." in method else _BROKER + method
        request = {"jsonrpc": "2.0", "method": name, "params": params or [], "id": next(self._ids)}
        response = self._request(self.zerotask_service, request)
        if not isinstance(response, dict):
            raise TaskError(int(ErrorCode.INTERNAL_ERROR), f"unexpected response {response!r}")
        if "error" in response:
            error = response["error"]
            raise TaskError(error.get("code", 0), error.get("message", ""), error.get("data"))
        return response.get("result")

    def call_batch(
        self, calls: list[tuple[str, list[Any] | dict[str, Any]]]
    ) -> list[Any | TaskError]:
        """K1 for several calls in one JSON-RPC batch (one round trip, one commit); each item
        of the answer is the call's result or its TaskError, in the order of ``calls``."""
        if not calls:
            return []
        first = next(self._ids)
        batch = [
            {
                "jsonrpc": "2.0",
                "method": method if "." in method else _BROKER + method,
                "params": params,
                "id": first + index,
            }
            for index, (method, params) in enumerate(calls)
        ]
        for _ in calls[1:]:
            next(self._ids)
        responses = self._request(self.zerotask_service, batch)
        by_id: dict[Any, Any] = {}
        if isinstance(responses, list):
            by_id = {r.get("id"): r for r in responses if isinstance(r, dict)}
        results: list[Any | TaskError] = []
        for index in range(len(calls)):
            response = by_id.get(first + index)
            if response is None:
                results.append(TaskError(int(ErrorCode.INTERNAL_ERROR), "no response in batch"))
            elif "error" in response:
                error = response["error"]
                results.append(
                    TaskError(error.get("code", 0), error.get("message", ""), error.get("data"))
                )
            else:
                results.append(response.get("result"))
        return results

    def command(self, command: str, **fields: Any) -> dict[str, Any]:
        """K2: one vespid command; the reply object."""
        reply = self._request(self.vespid_service, {"command": command, **fields})
        if not isinstance(reply, dict):
            raise TaskError(int(ErrorCode.INTERNAL_ERROR), f"unexpected reply {reply!r}")
        if reply.get("command") == "error":
            raise TaskError(reply.get("code", 0), reply.get("message", ""), reply.get("data"))
        return reply

    # ---- zerotask, as a client ----

    def connect(self, client_id: str | None = None) -> str:
        """client_connect with ``client_id`` (a fresh uuid when None, so a resend is safe)."""
        wanted = client_id or uuid.uuid4().hex
        try:
            self.client_id = str(self.call("client_connect", [wanted]))
        except TaskError as exc:
            if exc.code != ErrorCode.ID_TAKEN or client_id is not None:
                raise
            self.client_id = wanted  # K3: our own resend
        return self.client_id

    def _me(self) -> str:
        if self.client_id is None:
            return self.connect()
        return self.client_id

    def submit(self, method: str, params: Any = None, task_id: str | None = None) -> str:
        """client_new_task; the task id (a fresh uuid when None, so a resend is safe)."""
        task = task_id or uuid.uuid4().hex
        return str(
            self.call("client_new_task", self._new_task_args(self._me(), method, params, task))
        )

    def _new_task_args(self, me: str, method: str, params: Any, task: str) -> dict[str, Any]:
        """client_new_task's named parameters, with this client's credentials when it has any."""
        args: dict[str, Any] = {
            "client_id": me,
            "method": method,
            "params": params,
            "task_id": task,
        }
        if self.auth_id is not None:
            args.update(auth_id=self.auth_id, auth_password=self.auth_password)
        return args

    def submit_many(self, calls: list[tuple[str, Any]]) -> list[str]:
        """Several client_new_task in one JSON-RPC batch (one round trip, one commit): the
        task ids, in order (fresh uuids, so a resend is safe). The first refusal raises
        its TaskError; the tasks before it in the batch are created."""
        me = self._me()
        ids = [uuid.uuid4().hex for _ in calls]
        batch: list[tuple[str, list[Any] | dict[str, Any]]] = []
        for task, (method, params) in zip(ids, calls, strict=True):
            batch.append(("client_new_task", self._new_task_args(me, method, params, task)))
        for answer in self.call_batch(batch):
            if isinstance(answer, TaskError):
                raise answer
        return ids

    def submit_each(self, calls: list[tuple[str, Any]], window: int = 64) -> list[str]:
        """K4: one client_new_task request per call, up to ``window`` in flight: the task ids
        in order (fresh uuids, so a resend is safe). The first refusal raises its TaskError;
        every other call was still sent."""
        me = self._me()
        ids = [uuid.uuid4().hex for _ in calls]
        requests: list[tuple[str, list[Any] | dict[str, Any]]] = []
        for task, (method, params) in zip(ids, calls, strict=True):
            requests.append(("client_new_task", self._new_task_args(me, method, params, task)))
        for answer in self._calls_each(requests, window):
            if isinstance(answer, TaskError):
                raise answer
        return ids

    def results(self, task_ids: list[str], window: int = 64, wait_s: float = 30.0) -> list[Any]:
        """K4: each task's result, as :meth:`result` gives it, from one parked
        ``client_task_wait`` request per task, up to ``window`` in flight (a task not complete
        within one wait is asked again; after ``wait_s`` its TaskError not-finished is raised,
        as is a failed task's task-failed)."""
        me = self._me()
        limit = time.monotonic() + wait_s
        found: dict[str, Any] = {}
        left = list(task_ids)
        while left:
            left_ms = int(max(0.0, limit - time.monotonic()) * 1000)
            # parked for less than the transport's timeout, so a long wait is not a lost one
            wait = min(left_ms, 5000, max(0, int(self._client.timeout * 1000) - 500))
            answers = self._calls_each(
                [("client_task_wait", [me, task, wait]) for task in left], window
            )
            still = []
            for task, status in zip(left, answers, strict=True):
                if isinstance(status, TaskError):
                    raise status
                complete = isinstance(status, dict) and status.get("state") == "complete"
                if complete and "result" in status:
                    found[task] = status["result"]
                elif complete or left_ms == 0:
                    found[task] = self.call("client_task_result", [me, task])
                else:
                    still.append(task)
            left = still
        return [found[task] for task in task_ids]

    def status(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("client_task_status", [self._me(), task_id])
        return result

    def result(self, task_id: str, wait_s: float = 30.0) -> Any:
        """The task's result once ``client_task_wait`` says it is complete (waiting up to
        ``wait_s``): the wait's own ``result`` when it carries one, else client_task_result
        (TaskError task-failed for a failed task, not-finished after ``wait_s``)."""
        limit = time.monotonic() + wait_s
        while True:
            left_ms = int(max(0.0, limit - time.monotonic()) * 1000)
            status = self.call("client_task_wait", [self._me(), task_id, min(left_ms, 5000)])
            complete = isinstance(status, dict) and status.get("state") == "complete"
            if complete and "result" in status:
                return status["result"]
            if complete or left_ms == 0:
                return self.call("client_task_result", [self._me(), task_id])

    def cancel(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("client_task_cancel", [self._me(), task_id])
        return result

    def disconnect(self) -> None:
        if self.client_id is not None:
            self.call("client_disconnect", [self.client_id])
            self.client_id = None

    # ---- vespid, as a client ----

    def create(self, name: str, executable_pyscript: str, **fields: Any) -> dict[str, Any]:
        """task-create (``requirements``, ``repositories``, ``parent``... as keyword arguments)."""
        if self.auth_id is not None:
            fields = {"auth_id": self.auth_id, "auth_password": self.auth_password, **fields}
        return self.command(
            "task-create", name=name, executable_pyscript=executable_pyscript, **fields
        )

    def info(self, name: str) -> dict[str, Any]:
        """task-info -> the task-info-response object."""
        return self.command("task-info", name=name)

    def wait_complete(self, name: str, wait_s: float = 30.0, poll_s: float = 0.1) -> dict[str, Any]:
        """task-info until ``status`` is ``complete`` (TimeoutError after ``wait_s``)."""
        limit = time.monotonic() + wait_s
        while True:
            info = self.info(name)
            if info.get("status") in {"complete", "invalid"}:
                return info
            if time.monotonic() >= limit:
                raise TimeoutError(f"task {name!r} not complete after {wait_s} s: {info}")
            time.sleep(poll_s)

    @property
    def broker_answered(self) -> bool:
        """Whether the broker answered this client's negotiation (so a timeout means the
        coordinator, not the broker, did not answer)."""
        return self._client.config is not None

    # ---- lifetime ----

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_ = Scale0Error  # the transport errors callers may catch come from scale0.net.errors
