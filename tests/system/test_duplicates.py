"""Duplicates across a broker's death (scale0/net/worker.py W7, docs/protocol.md §4.3, §5.4), with
real processes.

- A client and a worker both at b1; b1 is killed while the handler runs; both fail over to b2
  and the client resends. With its recent-requests memory the worker answers the resend with
  the reply it already made, and the handler has run once; without it, twice. The handler is
  told the client's own ids either way.
- A client at b1 whose request b1 forwarded to the worker's broker b3; b1 is killed while the
  handler runs and the client resends via b2, which forwards it to b3 too. FORWARDWITH carries
  the client's ids (F15), so b3 joins the resend to the request its worker runs: the handler
  runs once, told the client's own ids, with or without the worker's memory. Brokers that do
  not carry the ids (FORWARD, before F15) run it twice, and the handler sees empty ids."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scale0.net.client import Client
from scale0.testing import BrokerProcess, running_brokers, wait_until

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
FAST = {"default_heartbeat_interval_ms": 200, "liveness": 5, "request_timeout_ms": 20_000}
HANDLER_S = 2.0  # long enough to kill b1 while it runs


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


def answer_across_a_kill(client: Client, victim: BrokerProcess, record: Path) -> list[bytes]:
    """Ask ``once`` for b"pay" and SIGKILL ``victim`` while the handler runs; the answer the
    client got in the end (by its resend to the next broker)."""
    answer: list[list[bytes]] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            answer.append(client.request("once", [b"pay"]))
        except BaseException as exc:  # reported below
            errors.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        wait_until(lambda: record.exists() and record.read_text() != "", "handler runs")
        os.kill(victim.pid, signal.SIGKILL)
        victim.process.wait(WAIT_S)
        asking.join(WAIT_S)
        assert not asking.is_alive(), "the client got no answer"
    finally:
        asking.join(WAIT_S)
        client.close()
    assert errors == []
    return answer[0]


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
            client = Client(b1.endpoints["frontend"], client_id="alice", timeout=30.0)
            client.connect()
            assert client.brokers and len(client.brokers) == 2  # it learnt b2 from the config
            # b1 is killed mid-run: its reply has nowhere to go
            answer = answer_across_a_kill(client, b1, record)
            assert ready_workers(b2) >= 1  # the worker moved to b2 too
            # The answer is the handler's, naming the client's own ids.
            client_id, request_id, body = answer
            assert (client_id, body) == (b"alice", b"pay") and request_id
            executions = record.read_text().splitlines()
            assert len(executions) == runs, executions
            assert len(set(executions)) == 1  # every run was the same request, same ids
            assert executions[0].startswith("alice ")


@pytest.mark.parametrize("recent", [10_000, 0])
def test_a_request_resent_via_another_broker_to_a_worker_behind_a_peer_runs_once(
    tmp_path: Path, recent: int
) -> None:
    record = tmp_path / "runs.log"
    with running_brokers(tmp_path, 3, **FAST) as (b1, b2, b3):
        wait_until(
            lambda: all(
                sum(line.get("event") == "peer_linked" for line in b.logs()) >= 2
                for b in (b1, b2, b3)
            ),
            "b1, b2 and b3 linked",
        )
        with worker(b3.endpoints["backend"], record, recent):  # the only worker: behind b3
            wait_until(lambda: ready_workers(b3) >= 1, "the worker at b3")
            client = Client(b1.endpoints["frontend"], client_id="alice", timeout=30.0)
            client.connect()
            assert client.brokers and len(client.brokers) == 3
            # b1 is killed mid-run: b3's answer has no origin to go to
            answer = answer_across_a_kill(client, b1, record)
            # The resend went to b2 (the client's next broker, failover.py V4), which has no
            # worker: b2 forwarded it to b3, where only the ids can tell it is the same request.
            executions = record.read_text().splitlines()
            assert len(executions) == 1, executions  # no duplicate run
            assert executions[0].startswith("alice "), executions  # the client's own ids
            client_id, request_id, body = answer
            assert (client_id, body) == (b"alice", b"pay") and request_id
