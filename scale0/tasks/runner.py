"""The node's task runs: vespid scripts as subprocesses with limits, zerotask callables in threads.

Rules (docs/tasks.md §9.2; tests/tasks/test_runner.py):

R1  A task-run's ``path`` and ``log`` are relative to the node's ``path`` directory; one that
    escapes it (absolute, ``..``) is refused and reported ``fatal``.
R2  ``executable_pyscript`` is Python source. It is written to ``PATH/task.py`` and run as
    ``python task.py`` with the working directory ``PATH``, stdout and stderr appended to
    ``log``, the task's ``environment`` plus ``VESPID_TASK=<name>`` (and
    ``SCALE0_TASK_ATTEMPT``) in its environment, in a new session, killed with the node
    (PR_SET_PDEATHSIG) so a dead node leaves no orphans running.
R3  Exit status 0 is ``ok``; any other exit is ``error``. A run past ``max_wall_s``, over
    ``max_memory_mb`` resident memory or writing more than ``max_log_mb`` of output is killed
    (its whole process group) and is ``fatal``; the reason is appended to its log.
R4  A cancelled run is killed and reports nothing (the coordinator already terminated it).
R5  A zerotask callable ``module:function`` is called with ``*params`` (list), ``**params``
    (object) or ``params`` (anything else); its return value is the result (it must be JSON),
    an exception is a JSON-RPC error object ``{code: -32000, message, data: {type}}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["Limits", "ScriptRun", "call_method", "load_callable", "start_script"]

_PR_SET_PDEATHSIG: Final = 1
PAGE_KB: Final = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


@dataclass(frozen=True, slots=True)
class Limits:
    max_wall_s: float = 3600.0
    max_memory_mb: int | None = None
    max_log_mb: float = 64.0


def _inside(root: Path, relative: object, what: str) -> Path:
    if not isinstance(relative, str) or not relative:
        raise ValueError(f"{what} must be a non-empty relative path")
    candidate = Path(relative)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise ValueError(f"{what} {relative!r} escapes the node's path")
    return root / candidate


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ScriptRun:
    """One attempt of a vespid task running as a subprocess (R1-R4)."""

    def __init__(
        self,
        name: str,
        attempt: int,
        process: subprocess.Popen[bytes] | None,
        log: Path | None,
        limits: Limits,
        started: float,
        failure: str | None = None,
    ) -> None:
        self.name = name
        self.attempt = attempt
        self.process = process
        self.log = log
        self.limits = limits
        self.started = started
        self.failure = failure
        self.cancelled = False

    def _kill(self, reason: str) -> None:
        self.failure = reason
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        if self.log is not None:
            with contextlib.suppress(OSError), self.log.open("a", encoding="utf-8") as out:
                out.write(f"\n[scale0-node] killed: {reason}\n")

    def cancel(self) -> None:
        """R4."""
        self.cancelled = True
        self._kill("cancelled")

    def _rss_mb(self) -> float:
        if self.process is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.process.pid}/statm").read_text().split()
        except OSError:
            return 0.0
        return int(fields[1]) * PAGE_KB / 1024

    def check(self, now: float) -> str | None:
        """The run's success label once it has ended (R3), None while it runs."""
        if self.failure is not None and self.process is None:
            return "fatal"
        process = self.process
        if process is None:
            return "fatal"
        code = process.poll()
        if code is None:
            limits = self.limits
            if now - self.started > limits.max_wall_s:
                self._kill(f"ran longer than max_wall_s {limits.max_wall_s:g}")
            elif limits.max_memory_mb is not None and self._rss_mb() > limits.max_memory_mb:
                self._kill(f"used more than max_memory_mb {limits.max_memory_mb}")
            elif self.log is not None and _size_mb(self.log) > limits.max_log_mb:
                self._kill(f"wrote more than max_log_mb {limits.max_log_mb:g}")
            else:
                return None
            return "fatal"
        if self.failure is not None:
            return "fatal"
        return "ok" if code == 0 else "error"


def _size_mb(path: Path) -> float:
    try:
        return path.stat().st_size / (1 << 20)
    except OSError:
        return 0.0


def start_script(
    root: Path,
    message: Mapping[str, Any],
    limits: Limits,
    python: str | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> ScriptRun:
    """R1/R2: start a task-run; a refused one comes back already failed (``fatal``)."""
    name = str(message.get("name"))
    attempt = message.get("attempt")
    attempt = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0
    now = time.monotonic()
    try:
        workdir = _inside(root, message.get("path"), "path")
        log = _inside(root, message.get("log"), "log")
        source = message.get("executable_pyscript")
        if not isinstance(source, str):
            raise ValueError("executable_pyscript must be a string")
        environment = message.get("environment") or {}
        if not isinstance(environment, dict):
            raise ValueError("environment must be an object")
        workdir.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        (workdir / "task.py").write_text(source, encoding="utf-8")
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in environment.items()})
        env.update(extra_env or {})
        env["VESPID_TASK"] = name
        env["SCALE0_TASK_ATTEMPT"] = str(attempt)
        with log.open("ab") as out:
            process = subprocess.Popen(  # noqa: S603 (running the task is the point)
                [python or sys.executable, "task.py"],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (only prctl, no locks)
            )
    except (OSError, ValueError) as exc:
        return ScriptRun(name, attempt, None, None, limits, now, failure=str(exc))
    return ScriptRun(name, attempt, process, log, limits, now)


def load_callable(reference: str, base: Path | None = None) -> Callable[..., Any]:
    """Import ``module:function`` (``base`` is put on the import path first when given)."""
    module_name, _, attribute = reference.partition(":")
    if base is not None and str(base) not in sys.path:
        sys.path.insert(0, str(base))
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{reference} is not callable")
    return target  # type: ignore[no-any-return]


def call_method(function: Callable[..., Any], params: Any) -> tuple[Any, dict[str, Any] | None]:
    """R5: (result, None) or (None, JSON-RPC error object)."""
    try:
        if isinstance(params, list):
            result = function(*params)
        elif isinstance(params, dict):
            result = function(**params)
        elif params is None:
            result = function()
        else:
            result = function(params)
        json.dumps(result)
    except Exception as exc:
        return None, {
            "code": -32000,
            "message": str(exc) or type(exc).__name__,
            "data": {"type": type(exc).__name__},
        }
    return result, None
