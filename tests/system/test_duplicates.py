"""Duplicates across a broker's death (scale0/net/worker.py W7, docs/protocol.md §4.3), with real
processes: a client and a worker both at b1; b1 is killed while the handler runs; both fail over
to b2 and the client resends. With its recent-requests memory the worker answers the resend
with the reply it already made, and the handler has run once; without it, twice. The handler
is told the client's own ids either way."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scale0.net.client import Client
from scale0.testing import BrokerProcess, running_brokers

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
FAST = {"default_heartbeat_interval_ms": 200, "liveness": 5, "request_timeout_ms": 20_000}
HANDLER_S = 2.0  # long enough to kill b1 while it runs


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


def ready_workers(broker: BrokerProcess) -> int:
    return sum(1 for line in broker.logs() if line.get("event") == "worker_ready")


@contextlib.contextmanager
def worker(endpoint: str, record: Path, recent: int) -> Iterator[subprocess.Popen[bytes]]:
    executable = shutil.which("scale0-worker")
    assert executable is not None, "scale0-worker is not installed: pip install -e ."
    process = subprocess.Popen(  # our own installed script, fixed arguments
        [
            executable,
            endpoint,
            "tests.net.handlers:once",
            "--heartbeat-interval",
            "0.2",
            "--recent-requests",
            str(recent),
        ],
        cwd=REPO,
        env={
            **os.environ,
            "S0_RECORD": str(record),
            "S0_SLEEP": str(HANDLER_S),
            "PYTHONPATH": str(REPO),
        },
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@pytest.mark.parametrize(("recent", "runs"), [(10_000, 1), (0, 2)])
def test_a_request_resent_after_its_broker_died_runs_once(
    tmp_path: Path, recent: int, runs: int
) -> None:
    record = tmp_path / "runs.log"
    with running_brokers(tmp_path, 2, **FAST) as (b1, b2):
        wait_until(
            lambda: all(
                any(line.get("event") == "peer_linked" for line in b.logs()) for b in (b1, b2)
            ),
            "b1 and b2 linked",
        )
        with worker(b1.endpoints["backend"], record, recent):
            wait_until(lambda: ready_workers(b1) >= 1, "the worker at b1")
            answer: list[list[bytes]] = []
            errors: list[BaseException] = []
            client = Client(b1.endpoints["frontend"], client_id="alice", timeout=30.0)
            client.connect()
            assert client.brokers and len(client.brokers) == 2  # it learnt b2 from the config

            def ask() -> None:
                try:
                    answer.append(client.request("once", [b"pay"]))
                except BaseException as exc:  # reported below
                    errors.append(exc)

            asking = threading.Thread(target=ask)
            asking.start()
            try:
                wait_until(lambda: record.exists() and record.read_text() != "", "handler runs")
                os.kill(b1.pid, signal.SIGKILL)  # mid-run: its reply has nowhere to go
                b1.process.wait(WAIT_S)
                asking.join(WAIT_S)
                assert not asking.is_alive(), "the client got no answer"
            finally:
                asking.join(WAIT_S)
                client.close()
            assert errors == []
            assert ready_workers(b2) >= 1  # the worker moved to b2 too
            # The answer is the handler's, naming the client's own ids.
            client_id, request_id, body = answer[0]
            assert (client_id, body) == (b"alice", b"pay") and request_id
            executions = record.read_text().splitlines()
            assert len(executions) == runs, executions
            assert len(set(executions)) == 1  # every run was the same request, same ids
            assert executions[0].startswith("alice ")
