"""Real coordinator and node processes for the task tests, stopped by PID whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 10.0


@dataclass
class Proc:
    """One started process, its config and stderr file."""

    kind: str
    config: Path
    stderr: Path
    process: subprocess.Popen[bytes] | None = None
    history: list[int] = field(default_factory=list)

    def start(self) -> None:
        # An outer PYTHONPATH stays first: tools/bench-tasks runs an older tree that way.
        outer = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [outer, str(REPO)])))
        with self.stderr.open("ab") as err:
            self.process = subprocess.Popen(
                [f"scale0-{self.kind}", "--config", str(self.config)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=REPO,
                env=env,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.history.append(self.process.wait(STOP_TIMEOUT_S))

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a bound."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.terminate()
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(STOP_TIMEOUT_S)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def write(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data)), encoding="utf-8")
    return path


def coordinator(tmp: Path, backend: str, name: str = "coordinator", **options: Any) -> Proc:
    config = write(
        tmp / f"{name}.yaml",
        {"endpoint": backend, "data_dir": str(tmp / "coordinator"), **options},
    )
    return Proc("coordinator", config, tmp / f"{name}.stderr")


def node(tmp: Path, name: str, frontend: str, **options: Any) -> Proc:
    methods = {m: f"tests.tasks.methods:{m}" for m in ("square", "add", "noop", "fail", "nap")}
    config = write(
        tmp / f"{name}.yaml",
        {
            "name": name,
            "endpoint": frontend,
            "path": str(tmp / name),
            "methods": methods,
            "poll_wait_ms": 300,
            **options,
        },
    )
    return Proc("node", config, tmp / f"{name}.stderr")


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[tuple[Proc, ...]]:
    """Start ``procs`` in order; stop them in reverse order (by PID) on the way out."""
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in reversed(procs):
            proc.stop()
