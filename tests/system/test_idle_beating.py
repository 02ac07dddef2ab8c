"""Idle beating (docs/protocol.md §3.4) between real processes: a ``scale0-broker`` and a
``scale0-worker``. The idle worker promises the idle interval and is kept; it serves a request
at once; and once it dies while idle the broker finds it dead after liveness x the idle
interval (the detection time idle beating costs), not liveness x the interval. Every wait is
bounded; both processes are stopped by PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scale0.net.client import Client
from scale0.testing import BrokerProcess, running_broker, wait_until
from tests.net.probe import PROBE, management_rows

# Each test runs on the loop and in the C lane (tests/conftest.py broker_io).
pytestmark = [pytest.mark.system, pytest.mark.usefixtures("broker_io")]

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 15.0
INTERVAL_MS, IDLE_MS, LIVENESS = 100, 600, 3


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    overrides: dict[str, Any] = {
        "default_heartbeat_interval_ms": INTERVAL_MS,
        "idle_heartbeat_interval_ms": IDLE_MS,
        "liveness": LIVENESS,
    }
    with running_broker(tmp_path, **overrides, **PROBE) as process:
        yield process


def _promises(broker: BrokerProcess) -> list[int]:
    return [int(row["promise_ms"]) for row in management_rows(broker, "workers")]


def test_an_idle_worker_is_kept_serves_and_is_found_dead_after_liveness_idle(
    broker: BrokerProcess,
) -> None:
    executable = shutil.which("scale0-worker")
    assert executable is not None, "scale0-worker is not installed: pip install -e ."
    worker = subprocess.Popen(
        [
            executable,
            broker.endpoints["backend"],
            "tests.net.handlers:whoami",
            "--service",
            "pid",
            "--heartbeat-interval",
            str(INTERVAL_MS / 1000),
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _promises(broker) == [IDLE_MS], "the worker idles", WAIT_S)
        with Client(broker.endpoints["frontend"], timeout=WAIT_S) as client:
            assert client.request("pid", b"") == [b"%d" % worker.pid]  # served at once
        wait_until(lambda: _promises(broker) == [IDLE_MS], "idle again", WAIT_S)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(WAIT_S)

        def lost() -> list[dict[str, Any]]:
            return [line for line in broker.logs() if line["event"] == "worker_lost"]

        wait_until(lambda: len(lost()) == 1, "the broker finds the dead worker", WAIT_S)
        [line] = lost()
        assert line["reason"] == "expired"
        # Kept for liveness x the idle interval since it was last heard (1.8 s), not 0.3 s.
        assert line["silent_ms"] >= LIVENESS * IDLE_MS
    finally:
        if worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        worker.wait(WAIT_S)
