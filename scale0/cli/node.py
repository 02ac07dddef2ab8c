"""scale0-node: the node agent, running zerotask callables and vespid scripts (docs/tasks.md §9).

``scale0-node --config FILE``. The node reaches the coordinator through any broker frontend of
the family (``endpoint`` is a seed). It registers (``node_connect`` + ``node-set``), then long-
polls ``zerotask.broker.node_poll`` for what the coordinator publishes to it
(``broker_new_task``, ``broker_node_status``, ``task-run``, ``task-cancel``); each poll is also
its heartbeat and lists the attempts it holds (rule B4). Reports (``node_task_finished``,
``node_task_failed``, ``task-complete``) are sent again until the coordinator answers them; a
stale-attempt answer drops the report. While it has something to say, a step is one JSON-RPC
batch: its zerotask reports, its ``node_task_request``s and a ``node_poll`` that is not
parked, so one round trip moves every stage of the pipeline at once. When the coordinator says
the node is unknown (it was lost), every local run is killed and the node registers again.
SIGINT/SIGTERM: kill the runs, ``node_disconnect``, exit 0. A bad config exits 2.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

import click

from scale0.cli.options import config_option, log_level_option
from scale0.net.errors import Scale0Error
from scale0.net.logs import configure, log_event
from scale0.tasks.client import TaskClient, TaskError
from scale0.tasks.errors import ErrorCode
from scale0.tasks.runner import Limits, ScriptRun, call_method, load_callable, start_script
from scale0.tasks.settings import ConfigFileError, NodeConfig, load_node

__all__ = ["NodeAgent", "main"]

log = logging.getLogger("scale0.node")

#: Poll wait while something runs here (so its report leaves soon after it ends).
BUSY_WAIT_MS: Final = 20
#: How long a step waits for the zerotask calls it started before it polls again.
SETTLE_S: Final = 0.005
RETRY_PAUSE_S: Final = 0.2


@dataclass
class Report:
    """A result still to be acknowledged by the coordinator: a zerotask call (sent in one
    batch with the others) or a vespid command."""

    task: str
    attempt: int
    call: tuple[str, dict[str, Any]] | None = None
    send: Callable[[], object] | None = None


class NodeAgent:
    """One node: registration, the poll loop, runs and reports."""

    def __init__(self, config: NodeConfig, config_dir: Path) -> None:
        self.config = config
        self.name = config.name
        self.methods = {
            method: load_callable(target, config_dir) for method, target in config.methods.items()
        }
        self.client = TaskClient(
            config.endpoint,
            zerotask_service=config.zerotask_service,
            vespid_service=config.vespid_service,
            timeout=config.timeout_s,
            retry_s=0.0,
        )
        self.limits = Limits(config.max_wall_s, config.max_memory_mb, config.max_log_mb)
        self.executor = ThreadPoolExecutor(config.slots, thread_name_prefix="scale0-node")
        self.scripts: dict[tuple[str, int], ScriptRun] = {}
        self.calls: dict[tuple[str, int], Future[tuple[Any, dict[str, Any] | None]]] = {}
        self.offered: deque[str] = deque()
        self.reports: dict[tuple[str, int], Report] = {}
        self.connected = False
        self.stopping = threading.Event()
        self.counts = {"scripts": 0, "calls": 0, "stale": 0}

    # ---- registration ----

    def register(self) -> bool:
        try:
            self.client.call("node_connect", [self.name])
        except TaskError as exc:
            if exc.code == ErrorCode.ID_TAKEN:  # our previous life is not yet lost: wait
                return False
            raise
        self.client.command(
            "node-set",
            name=self.name,
            capabilities=dict(self.config.capabilities),
            repositories=dict(self.config.repositories),
            activetasks=[],
        )
        self.client.call("node_status", {"node_id": self.name, "methods": sorted(self.methods)})
        self.connected = True
        log_event(log, logging.INFO, "node_registered", {"node": self.name})
        return True

    def forget_everything(self) -> None:
        """The coordinator lost us: our runs are stale attempts now (F3)."""
        for run in self.scripts.values():
            run.cancel()
        self.scripts.clear()
        self.calls.clear()  # threads finish on their own; their results are dropped
        self.reports.clear()
        self.offered.clear()
        self.connected = False

    # ---- the loop ----

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.step()
            except (Scale0Error, TaskError, OSError, ValueError) as exc:
                if isinstance(exc, TaskError) and exc.code == ErrorCode.UNKNOWN_NODE:
                    log_event(log, logging.WARNING, "node_lost", {"node": self.name})
                    self.forget_everything()
                else:
                    log_event(log, logging.INFO, "node_retry", {"error": str(exc)})
                self.stopping.wait(RETRY_PAUSE_S)
        self.shutdown()

    def active(self) -> list[list[Any]]:
        held = set(self.scripts) | set(self.calls) | set(self.reports)
        return [[name, attempt] for name, attempt in sorted(held)]

    def step(self) -> None:
        """One exchange with the coordinator. While there is something to say (reports,
        offered tasks to ask for), one JSON-RPC batch carries the reports, the
        ``node_task_request``s and a ``node_poll`` that is not parked (Z5): one round trip per
        step, whatever it moves. With nothing to say, a parked ``node_poll`` waits for news."""
        if not self.connected and not self.register():
            self.stopping.wait(RETRY_PAUSE_S * 2)
            return
        self.send_commands()
        wanted = self.take_offered()
        batched = [(key, r) for key, r in self.reports.items() if r.call is not None]
        # Room: the slots not held by a running call or a kept announcement. The calls asked
        # for in this batch are not counted: the announcements come back with their grants and
        # are asked for in the next step, by when short calls have ended; a node whose calls
        # are long keeps at most ``slots`` announcements (B6 offers them to others meanwhile).
        room = max(0, self.config.slots - len(self.calls) - len(self.offered))
        poll = {"node_id": self.name, "active": self.active(), "room": room}
        if wanted or batched:
            calls: list[tuple[str, list[Any] | dict[str, Any]]] = [
                r.call for _, r in batched if r.call is not None
            ]
            calls += [("node_task_request", [task_id, self.name]) for task_id in wanted]
            calls.append(("node_poll", {**poll, "wait_ms": 0}))
            answers = self.client.call_batch(calls)
            self.acknowledged(batched, answers[: len(batched)])
            self.start_calls(wanted, answers[len(batched) : -1])
            messages = answers[-1]
            if isinstance(messages, TaskError):
                raise messages
        else:
            busy = bool(self.scripts or self.calls or self.reports)
            wait = BUSY_WAIT_MS if busy else self.config.poll_wait_ms
            messages = self.client.call("node_poll", {**poll, "wait_ms": wait})
        for message in messages if isinstance(messages, list) else []:
            if isinstance(message, dict):
                self.dispatch(message)
        self.settle()
        self.collect()

    def settle(self) -> None:
        """Give the calls just started up to SETTLE_S to end, so that short ones are reported
        now rather than after the next poll (which may be parked for BUSY_WAIT_MS)."""
        if self.calls:
            wait_for_futures(list(self.calls.values()), timeout=SETTLE_S)

    def dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        command = message.get("command")
        params = message.get("params")
        if method == "zerotask.node.broker_new_task" and isinstance(params, list) and params:
            if len(params) == 2 and params[0] in self.methods and isinstance(params[1], str):
                self.offered.append(params[1])
        elif method == "zerotask.node.broker_node_status":
            self.client.call(
                "node_status",
                {"node_id": self.name, "methods": sorted(self.methods), "running": self.active()},
            )
        elif command == "task-run":
            key = (str(message.get("name")), int(message.get("attempt") or 0))
            if key in self.scripts or key in self.reports:
                return  # B4 resend of what we already hold
            extra = {
                "SCALE0_TASKS_ENDPOINT": self.config.endpoint,
                "SCALE0_VESPID_SERVICE": self.config.vespid_service,
            }
            run = start_script(self.config.path, message, self.limits, self.config.python, extra)
            self.scripts[key] = run
            self.counts["scripts"] += 1
        elif command == "task-cancel":
            key = (str(message.get("name")), int(message.get("attempt") or 0))
            if key in self.scripts:
                self.scripts.pop(key).cancel()
            self.calls.pop(key, None)

    def take_offered(self) -> list[str]:
        """As many offered tasks as there are free slots, to ask for now."""
        wanted: list[str] = []
        while self.offered and len(self.calls) + len(wanted) < self.config.slots:
            wanted.append(self.offered.popleft())
        return wanted

    def start_calls(self, wanted: list[str], answers: list[Any]) -> None:
        """Start the zerotask calls the coordinator gave us (node_task_request answers)."""
        for task_id, got in zip(wanted, answers, strict=True):
            if isinstance(got, TaskError):
                if got.code == ErrorCode.UNKNOWN_NODE:
                    raise got
                continue
            if not isinstance(got, dict) or not got:
                continue
            key = (task_id, int(got.get("attempt") or 0))
            if key in self.calls or key in self.reports:
                continue
            function = self.methods.get(str(got.get("method")))
            if function is None:
                continue
            self.calls[key] = self.executor.submit(call_method, function, got.get("params"))
            self.counts["calls"] += 1

    def collect(self) -> None:
        now = time.monotonic()
        for key, run in list(self.scripts.items()):
            success = run.check(now)
            if success is None:
                continue
            del self.scripts[key]
            if run.cancelled:
                continue
            name, attempt = key
            self.reports[key] = Report(name, attempt, send=self._complete(name, attempt, success))
        for key, future in list(self.calls.items()):
            if not future.done():
                continue
            del self.calls[key]
            result, error = future.result()
            self.reports[key] = Report(
                key[0], key[1], self._finished(key[0], key[1], result, error)
            )

    def _complete(self, name: str, attempt: int, success: str) -> Callable[[], object]:
        return lambda: self.client.command(
            "task-complete", name=name, node=self.name, success=success, attempt=attempt
        )

    def _finished(
        self, task: str, attempt: int, result: Any, error: dict[str, Any] | None
    ) -> tuple[str, dict[str, Any]]:
        if error is not None:
            params: dict[str, Any] = {"task_id": task, "error": error}
            method = "node_task_failed"
        else:
            params = {"task_id": task, "task_result": result}
            method = "node_task_finished"
        params.update(node_id=self.name, attempt=attempt)
        return method, params

    def send_commands(self) -> None:
        """Send every unacknowledged vespid report (task-complete); a transport error keeps
        them for the next step. zerotask reports leave in the step's batch."""
        outcomes: list[tuple[tuple[str, int], Report, object]] = []
        for key, report in list(self.reports.items()):
            if report.send is not None:
                try:
                    outcomes.append((key, report, report.send()))
                except TaskError as exc:
                    outcomes.append((key, report, exc))
        self.settled(outcomes)

    def acknowledged(
        self, batched: list[tuple[tuple[str, int], Report]], answers: list[Any]
    ) -> None:
        self.settled([(key, r, answer) for (key, r), answer in zip(batched, answers, strict=True)])

    def settled(self, outcomes: list[tuple[tuple[str, int], Report, object]]) -> None:
        """Reports the coordinator answered are done; a refused one (stale) is logged."""
        for key, report, answer in outcomes:
            if isinstance(answer, TaskError):
                if answer.code == ErrorCode.UNKNOWN_NODE:
                    raise answer
                self.counts["stale"] += 1
                log_event(
                    log,
                    logging.WARNING,
                    "report_refused",
                    {"task": report.task, "attempt": report.attempt, "error": answer.message},
                )
            self.reports.pop(key, None)

    def shutdown(self) -> None:
        for run in self.scripts.values():
            run.cancel()
        if self.connected:
            with contextlib.suppress(Scale0Error, TaskError):
                self.client.call("node_disconnect", [self.name])
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        log_event(log, logging.INFO, "node_stopped", {"node": self.name, **self.counts})


@click.command(name="scale0-node")
@config_option("The node's YAML or JSON config (docs/tasks.md §9).")
@log_level_option()
def main(config_path: Path, log_level: str) -> None:
    """Run tasks for the coordinator until SIGINT/SIGTERM."""
    configure(log_level)
    try:
        config = load_node(config_path)
        agent = NodeAgent(config, config_path.resolve().parent)
    except (ConfigFileError, ImportError, AttributeError, TypeError) as exc:
        click.echo(f"scale0-node: {exc}", err=True)
        sys.exit(2)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    agent.run()
