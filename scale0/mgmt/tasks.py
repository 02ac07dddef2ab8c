"""The page's Tasks panel: the task coordinator's ``task-stats``, asked through the family.

The coordinator (scale0-coordinator) is a worker of the family serving the ``vespid`` service,
so the management server reaches it the way any client does: it is one more client of its own
broker (an :class:`~scale0.net.client.AsyncClient` on the broker's frontend, on the broker's
loop), sends one ``task-stats`` command (docs/tasks.md §3.2, V6) with the logged-in admin's
credentials, and waits at most ``management.tasks_timeout_ms``. The family routes it to
whichever broker the coordinator is attached to; when this broker is disabled or draining the
client fails over like any other (C7). Nothing here decides anything about tasks.

Rules (docs/management.md "Tasks"; tests/system/test_management_tasks.py):

Q1  The client exists only while the panel is used: made at the first request, closed (with
    DISCONNECT) after IDLE_CLOSE_S without one (and none waiting), and when the server stops.
    A broker whose page nobody looks at has no such client. A client that failed, or whose
    session the broker refused, is dropped at once: the next request makes a new one.
Q2  At most MAX_CALLS requests wait for the coordinator at once; one more is 503 ``busy`` at
    once, so a flood of page loads cannot pile up waiting requests.
Q3  No coordinator is an answer, not a failure: the family knows no such service (404) is
    503 ``not-served``; no answer in time (503 from the family, a lost worker, the timeout)
    is 504 ``no-answer``. Both messages name the service and say what to do.
Q4  The coordinator's refusal passes through: ``forbidden`` is 403 with its message; any other
    error, or an answer that is not a task-stats-response, is 502 ``bad-answer``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Final

import zmq.asyncio

from scale0.net.client import AsyncClient
from scale0.net.errors import (
    BrokerRefused,
    RequestTimeout,
    Scale0Error,
    ServiceNotFound,
    ServiceUnavailable,
    WorkerFailed,
    WorkerLost,
)
from scale0.tasks.errors import ErrorCode
from scale0.wire.frames import JsonValue

__all__ = ["IDLE_CLOSE_S", "MAX_CALLS", "TaskPanel", "connectable"]

log = logging.getLogger("scale0.mgmt")

#: Q1: the panel's client is closed after this long without a request.
IDLE_CLOSE_S: Final = 60.0
#: Q2: requests waiting for the coordinator at once.
MAX_CALLS: Final = 8
#: The keys a task-stats-response must have for the page to draw it (Q4).
STATS_KEYS: Final = (
    "states",
    "queue",
    "queue_depth",
    "created",
    "completed",
    "failed",
    "reruns",
    "refused",
    "nodes_connected",
    "nodes",
    "recent",
)

Answer = tuple[int, dict[str, JsonValue]]


def connectable(endpoint: str) -> str:
    """A bound endpoint as a client connects to it: a wildcard address becomes loopback."""
    scheme, _, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    if scheme != "tcp" or not colon:
        return endpoint
    if host in ("0.0.0.0", "*"):  # noqa: S104 (reads a bound address, binds nothing)
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"{scheme}://{host}:{port}"


class TaskPanel:
    """Asks the coordinator serving ``service`` for ``task-stats`` through the broker at
    ``frontend()`` (a callable: the endpoint is known once the node has bound it)."""

    def __init__(
        self,
        frontend: Callable[[], str | None],
        identity: str,
        service: str,
        timeout_s: float,
        *,
        idle_close_s: float = IDLE_CLOSE_S,
    ) -> None:
        self.frontend = frontend
        self.identity = identity
        self.service = service
        self.timeout_s = timeout_s
        self.idle_close_s = idle_close_s
        self.calls = 0
        self._client: AsyncClient | None = None
        self._context: zmq.asyncio.Context | None = None
        self._last_used = 0.0
        self._idle: asyncio.TimerHandle | None = None
        self._clients_made = 0
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def connected(self) -> bool:
        """Whether the panel holds a client now (Q1)."""
        return self._client is not None

    async def ask(self, auth_id: str, password: str, recent: int) -> Answer:
        """The answer to ``GET /api/tasks``: (HTTP status, JSON body). Never raises."""
        if self.calls >= MAX_CALLS:
            return self._not_shown(
                503, "busy", f"{MAX_CALLS} task panel requests are waiting already; try again"
            )
        client = self._client_now()
        if client is None:
            return self._not_shown(503, "no-answer", "this broker's frontend is not bound yet")
        body = json.dumps(
            {
                "command": "task-stats",
                "recent": recent,
                "auth_id": auth_id,
                "auth_password": password,
            }
        ).encode()
        self.calls += 1
        self._last_used = time.monotonic()
        try:
            frames = await client.request(self.service, body, timeout=self.timeout_s)
        except ServiceNotFound:
            return self._not_shown(
                503,
                "not-served",
                f"no task coordinator serves {self.service!r} in this family: start "
                "scale0-coordinator (docs/tasks.md §9), or set management.tasks_service to "
                "its vespid_service",
            )
        except (ServiceUnavailable, WorkerLost, RequestTimeout):
            return self._not_shown(
                504,
                "no-answer",
                f"no task coordinator serving {self.service!r} answered within "
                f"{self.timeout_s:g} s (is scale0-coordinator running?)",
            )
        except WorkerFailed as exc:
            return self._not_shown(502, "bad-answer", f"the coordinator failed: {exc}")
        except BrokerRefused as exc:
            self._discard()  # a refused session is over: the next request starts afresh
            return self._not_shown(
                504, "no-answer", f"the broker refused the panel's session: {exc}"
            )
        except Scale0Error as exc:
            self._discard()  # the client itself failed: never keep a broken one
            return self._not_shown(502, "bad-answer", f"the panel's client failed: {exc}")
        finally:
            self.calls -= 1
            self._last_used = time.monotonic()
            self._arm_idle()
        return self._read(frames)

    def _read(self, frames: list[bytes]) -> Answer:
        """Q4: the coordinator's reply as the API's answer."""
        try:
            reply = json.loads(b"".join(frames))
        except (ValueError, UnicodeDecodeError):
            return self._not_shown(502, "bad-answer", "the coordinator's answer is not JSON")
        if not isinstance(reply, dict):
            return self._not_shown(502, "bad-answer", "the coordinator's answer is not an object")
        if reply.get("command") == "error":
            message = str(reply.get("message", ""))
            code = reply.get("code")
            if code == ErrorCode.FORBIDDEN:
                return self._not_shown(403, "refused", f"the task coordinator refused: {message}")
            if code == ErrorCode.METHOD_NOT_FOUND:
                message = (
                    f"the task coordinator does not know task-stats (older than this broker?): "
                    f"{message}"
                )
            return self._not_shown(502, "bad-answer", message)
        missing = [key for key in STATS_KEYS if key not in reply]
        if reply.get("command") != "task-stats-response" or missing:
            return self._not_shown(
                502,
                "bad-answer",
                f"the coordinator's answer is not a task-stats-response (missing {missing})",
            )
        result: dict[str, JsonValue] = {
            "coordinator": True,
            "service": self.service,
            "asked_by": self.identity,
        }
        result.update({k: v for k, v in reply.items() if k != "command"})
        return 200, {"code": 200, "message": "", "result": result}

    def _not_shown(self, status: int, reason: str, message: str) -> Answer:
        return status, {
            "code": status,
            "message": message,
            "result": {
                "coordinator": False if reason == "not-served" else None,
                "service": self.service,
                "asked_by": self.identity,
                "reason": reason,
            },
        }

    # ---- the client's life (Q1) ------------------------------------------------------------

    def _client_now(self) -> AsyncClient | None:
        if self._client is not None:
            return self._client
        endpoint = self.frontend()
        if endpoint is None:
            return None
        if self._context is None:
            self._context = zmq.asyncio.Context()
        self._clients_made += 1
        # A name operators recognise in the clients table; new per client, since a client_id
        # is refused while another live session holds it.
        client_id: str | None = f"{self.identity}.management-{self._clients_made}"
        if client_id is not None and len(client_id.encode()) > 255:
            client_id = None  # the broker names it
        self._client = AsyncClient(
            connectable(endpoint),
            client_id=client_id,
            timeout=self.timeout_s,
            context=self._context,
        )
        log.debug("task panel client opened to %s", endpoint)
        return self._client

    def _arm_idle(self) -> None:
        if self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(self.idle_close_s, self._idle_check)

    def _idle_check(self) -> None:
        self._idle = None
        if self._client is None:
            return
        left = self._last_used + self.idle_close_s - time.monotonic()
        if self.calls or left > 0:
            again = max(left, self.idle_close_s / 10)
            self._idle = asyncio.get_running_loop().call_later(again, self._idle_check)
            return
        self._discard()

    def _discard(self) -> None:
        """Close the client in the background; the next request makes a new one."""
        client, self._client = self._client, None
        if client is None:
            return
        task = asyncio.get_running_loop().create_task(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close the client (DISCONNECT) and its context; the server is stopping."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        for task in list(self._closing):
            await task
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None
