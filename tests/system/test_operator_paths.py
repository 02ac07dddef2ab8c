"""The operator's paths of issue 11 on real ``scale0-broker`` processes: failover without a false
404, disable that keeps service, a disabled seed that still points the way, graceful stop, and
counters that agree.

Each test starts its own family of three (b1, b2 config sources, b3 joins from b1), workers as
threads or ``scale0-worker`` processes, and stops every process by PID. Waits are bounded; no
assertion is about time: what happened is read from answers, ``scale0ctl --json`` and logs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scale0.net.client import Client
from scale0.net.worker import Worker, WorkerThread
from scale0.testing import start_family_member, wait_until
from tests.system.ctl import WAIT_S
from tests.system.ctl import ctl_json as ctl
from tests.system.test_operations import edit_yaml, everyone, logged, operated_family

pytestmark = pytest.mark.system


def echo(body: list[bytes]) -> list[bytes]:
    return body


@contextlib.contextmanager
def worker_at(endpoint: str, handlers: dict[str, Any], **options: Any) -> Iterator[WorkerThread]:
    thread = Worker(endpoint, handlers, **options).start_in_thread()
    try:
        assert thread.wait_registered(WAIT_S), f"worker did not register at {endpoint}"
        yield thread
    finally:
        thread.stop()


def offered_through(family: Any, asked: str, service: str) -> Callable[[], bool]:
    """True once ``asked`` routes ``service``: a local worker, or a peer's table shows one."""

    def check() -> bool:
        code, document = ctl(family, "peers", broker=asked)
        if code != 0:
            return False
        return any(
            peer["services"].get(service) for peer in document["result"]["peers"] if peer["linked"]
        )

    return check


def worker_process(endpoint: str, log: Path) -> subprocess.Popen[bytes]:
    path = shutil.which("scale0-worker")
    assert path is not None
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [path, endpoint, "scale0.net.worker:echo_handler", "--service", "echo"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)


# ---- 2: no false 404 during failover ------------------------------------------------------------


def test_a_service_the_family_knew_a_moment_ago_waits_for_a_worker(tmp_path: Path) -> None:
    """b2's only worker is frozen, b2 dies; a request at b1 waits, a worker appears at b3.

    request_timeout_ms is short (3 s), and b1 has run longer than that before b2 dies: a broker
    younger than request_timeout_ms treats every service as known (R7), which would hide the
    defect.
    """
    with operated_family(tmp_path, request_timeout_ms=3000) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        wait_until(lambda: uptime(family, "b1") > 3.5, "b1 older than request_timeout_ms")
        frozen = worker_process(family["b2"].endpoints["backend"], tmp_path / "worker.log")
        try:
            wait_until(offered_through(family, "b1", "echo"), "b1 sees echo at b2")
            os.kill(frozen.pid, signal.SIGSTOP)  # it can move nowhere: only a new worker will do
            os.kill(family["b2"].process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            wait_until(
                lambda: any(e["peer"] == "b2" for e in logged(family["b1"], "peer_lost")),
                "b1 notices b2 is gone",
            )
            answers: list[object] = []
            with Client(family["b1"].frontend, timeout=20.0) as client:
                asked = threading.Thread(
                    target=lambda: answers.append(_outcome(client, "echo", b"still there?"))
                )
                asked.start()
                # The request is at b1, for a service no live broker offers: answered already
                # (the defect) or waiting. Then a worker appears at b3, as a failed-over one would.
                wait_until(
                    lambda: not asked.is_alive() or waiting(family, "b1") > 0,
                    "the request is answered or waits at b1",
                )
                with worker_at(family["b3"].endpoints["backend"], {"echo": echo}):
                    asked.join(30)
            assert answers == [[b"still there?"]]
        finally:
            stop_process(frozen)


def uptime(family: Any, name: str) -> float:
    code, document = ctl(family, "status", broker=name)
    return float(document["result"]["uptime_s"]) if code == 0 else 0.0


def waiting(family: Any, name: str) -> int:
    code, document = ctl(family, "status", broker=name)
    return int(document["result"]["queued"]) if code == 0 else 0


def _outcome(client: Client, service: str, body: bytes) -> object:
    try:
        return client.request(service, body)
    except Exception as exc:  # the test compares it: a ServiceNotFound is the defect
        return exc


# ---- 3: disable keeps service -----------------------------------------------------------------


def test_disabling_the_broker_of_the_only_worker_keeps_the_service(tmp_path: Path) -> None:
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        with worker_at(family["b1"].endpoints["backend"], {"echo": echo}) as worker:
            wait_until(offered_through(family, "b2", "echo"), "b2 sees echo at b1")
            with (
                Client(family["b2"].frontend, timeout=20.0) as elsewhere,
                Client(family["b1"].frontend, timeout=20.0) as there,
            ):
                assert there.request("echo", b"before") == [b"before"]
                code, document = ctl(family, "disable", "--target", "b1", broker="b2")
                assert code == 0 and document["result"]["state"] == "disabled", document
                # Clients at b1 and elsewhere are served: the worker moved to an active broker.
                assert elsewhere.request("echo", b"elsewhere") == [b"elsewhere"]
                assert there.request("echo", b"moved") == [b"moved"]
                assert there.endpoint != family["b1"].frontend
                assert worker.worker.endpoint != family["b1"].endpoints["backend"]
                code, status = ctl(family, "status", broker="b1")
                assert status["result"]["workers"] == 0, status


# ---- 4: a disabled seed points the way --------------------------------------------------------


def test_a_client_whose_only_seed_is_disabled_is_sent_to_an_active_broker(tmp_path: Path) -> None:
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        with worker_at(family["b2"].endpoints["backend"], {"echo": echo}):
            wait_until(offered_through(family, "b1", "echo"), "b1 sees echo at b2")
            code, document = ctl(family, "disable", broker="b1")
            assert code == 0 and document["result"]["state"] == "disabled", document
            # A new client that knows only b1: negotiation there is answered 301 elsewhere.
            with Client(family["b1"].frontend, timeout=20.0) as client:
                assert client.request("echo", b"one seed") == [b"one seed"]
                assert client.endpoint in {family["b2"].frontend, family["b3"].frontend}


# ---- 5: graceful stop ----------------------------------------------------------------------------


def test_sigterm_lets_the_request_in_flight_finish_once_then_everyone_moves(
    tmp_path: Path,
) -> None:
    started = threading.Event()
    release = threading.Event()
    runs: list[bytes] = []

    def slow(body: list[bytes]) -> list[bytes]:
        runs.append(body[0])
        started.set()
        release.wait(WAIT_S)
        return body

    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        b1 = family["b1"]
        with (
            worker_at(b1.endpoints["backend"], {"slow": slow}, capacity=4) as worker,
            Client(b1.frontend, timeout=30.0) as client,
        ):
            answers: list[object] = []
            asked = threading.Thread(
                target=lambda: answers.append(_outcome(client, "slow", b"in flight"))
            )
            asked.start()
            assert started.wait(WAIT_S)
            assert b1.process is not None
            os.kill(b1.process.pid, signal.SIGTERM)
            wait_until(lambda: bool(logged(b1, "broker_draining")), "b1 drains")
            release.set()
            asked.join(30)
            assert answers == [[b"in flight"]]
            assert runs == [b"in flight"]  # finished where it ran, not run again elsewhere
            assert b1.process.wait(30) == 0
            # Client and worker moved at once, and are served elsewhere.
            assert client.request("slow", b"after") == [b"after"]
            assert client.endpoint != b1.frontend
            assert worker.worker.endpoint != b1.endpoints["backend"]


def test_sigterm_waits_at_most_the_grace_for_a_request_that_does_not_end(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    started = threading.Event()
    returned = threading.Event()

    def stuck(body: list[bytes]) -> list[bytes]:
        started.set()
        release.wait(WAIT_S)
        returned.set()
        return body

    with operated_family(tmp_path) as family:
        b1 = family["b1"]
        b1.stop()
        edit_yaml(b1.broker_file, shutdown_grace_ms=500)
        start_family_member(b1)
        wait_until(everyone(family, 1), "the family runs v1")
        try:
            with (
                worker_at(b1.endpoints["backend"], {"stuck": stuck}),
                Client(b1.frontend, timeout=30.0) as client,
            ):
                asked = threading.Thread(target=lambda: _outcome(client, "stuck", b"x"))
                asked.start()
                assert started.wait(WAIT_S)
                assert b1.process is not None
                os.kill(b1.process.pid, signal.SIGTERM)
                # It exits while the handler still runs: the grace bounds the wait.
                assert b1.process.wait(WAIT_S) == 0
                assert not returned.is_set()
                # The last run's line (the first run stopped with nothing in flight).
                assert logged(b1, "broker_drained")[-1]["unfinished"] == 1
                release.set()
                asked.join(30)
        finally:
            release.set()


# ---- 8: counters agree ---------------------------------------------------------------------------


def test_requests_and_replies_agree_on_every_broker(tmp_path: Path) -> None:
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        with worker_at(family["b2"].endpoints["backend"], {"echo": echo}):
            wait_until(offered_through(family, "b1", "echo"), "b1 sees echo at b2")
            with Client(family["b1"].frontend, timeout=20.0) as client:
                for number in range(20):
                    assert client.request("echo", b"%d" % number) == [b"%d" % number]
            with Client(family["b2"].frontend, timeout=20.0) as client:
                for number in range(5):
                    assert client.request("echo", b"%d" % number) == [b"%d" % number]
            for name, requests in (("b1", 20), ("b2", 25)):
                code, document = ctl(family, "status", broker=name)
                result = document["result"]
                assert code == 0
                assert (result["requests"], result["replies"]) == (requests, requests), (
                    name,
                    result,
                )
                assert result["counters"]["forwarded"] == (20 if name == "b1" else 0)
                assert result["counters"]["forwards_served"] == (20 if name == "b2" else 0)
