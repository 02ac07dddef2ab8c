"""scale0.net.worker against the real broker process: handlers of every kind, LRU, lost workers.

Workers run in threads (``Worker.start_in_thread``) or as ``scale0-worker`` subprocesses;
the broker is the installed ``scale0-broker`` (scale0.testing.running_broker). Every wait is bounded
and every process is killed by PID in a ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from scale0.net.client import AsyncClient, Client
from scale0.net.errors import WorkerFailed
from scale0.net.worker import Handler, Worker, WorkerThread, echo_handler, reply_frames
from scale0.testing import BrokerProcess, running_broker, wait_until
from tests.net.probe import PROBE, management_rows

pytestmark = pytest.mark.usefixtures("broker_io")  # loop and lane (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 10.0
# A short family heartbeat keeps death detection (liveness x interval) well under a second.
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path, **FAST, **PROBE) as process:
        yield process


@contextlib.contextmanager
def serving(
    broker: BrokerProcess, handlers: dict[str, Handler], capacity: int = 1
) -> Iterator[WorkerThread]:
    handle = Worker(
        broker.endpoints["backend"], handlers, capacity=capacity, heartbeat_interval=0.2
    ).start_in_thread()
    try:
        assert handle.wait_registered(WAIT_S), "worker did not register"
        yield handle
    finally:
        handle.stop(WAIT_S)
        assert not handle.is_alive()


def client_for(broker: BrokerProcess, *, timeout: float = WAIT_S, retries: int = 2) -> Client:
    return Client(
        broker.endpoints["frontend"], timeout=timeout, retries=retries, heartbeat_interval=0.2
    )


# ---- values -> frames -------------------------------------------------------------------------


def test_reply_frames_accepts_bytes_lists_str_none() -> None:
    assert reply_frames(b"x") == (b"x",)
    assert reply_frames([b"a", bytearray(b"b")]) == (b"a", b"b")
    assert reply_frames("é") == ("é".encode(),)
    assert reply_frames(None) == ()
    with pytest.raises(TypeError):
        reply_frames(42)
    with pytest.raises(TypeError):
        reply_frames([b"a", 1])


# ---- through the broker -----------------------------------------------------------------------


def test_sync_handler_request_reply(broker: BrokerProcess) -> None:
    with serving(broker, {"echo": echo_handler}), client_for(broker) as client:
        assert client.request("echo", [b"a", b"", b"c"]) == [b"a", b"", b"c"]
        assert client.request("echo", b"one") == [b"one"]
        assert client.request("echo", []) == []


def test_async_handler(broker: BrokerProcess) -> None:
    async def upper(body: list[bytes]) -> list[bytes]:
        await asyncio.sleep(0.01)
        return [frame.upper() for frame in body]

    with serving(broker, {"upper": upper}), client_for(broker) as client:
        assert client.request("upper", [b"ab", b"cd"]) == [b"AB", b"CD"]


def test_slow_sync_handlers_do_not_block_heartbeats(broker: BrokerProcess) -> None:
    # 2 s of work at a 200 ms heartbeat: without the thread pool the broker would expire us.
    def sleepy(body: list[bytes]) -> bytes:
        time.sleep(2.0)
        return b"awake"

    with serving(broker, {"sleepy": sleepy}, capacity=2), client_for(broker, retries=0) as client:
        assert client.request_many("sleepy", [b"1", b"2"]) == [[b"awake"], [b"awake"]]


def test_streaming_partials_arrive_in_order_before_the_reply(broker: BrokerProcess) -> None:
    def count(body: list[bytes]) -> Iterator[bytes]:
        for number in range(int(body[0])):
            yield b"%d" % number
        yield b"done"

    async def acount(body: list[bytes]) -> AsyncIterator[list[bytes]]:
        for number in range(int(body[0])):
            await asyncio.sleep(0)
            yield [b"part", b"%d" % number]
        yield [b"done"]

    with serving(broker, {"count": count, "acount": acount}), client_for(broker) as client:
        assert list(client.request_stream("count", b"5")) == [
            [b"0"],
            [b"1"],
            [b"2"],
            [b"3"],
            [b"4"],
            [b"done"],
        ]
        parts = list(client.request_stream("acount", b"3"))
        assert parts == [[b"part", b"0"], [b"part", b"1"], [b"part", b"2"], [b"done"]]
        # request() skips the PARTIALs and returns the final REPLY.
        assert client.request("count", b"3") == [b"done"]


def test_handler_exception_is_500_and_the_worker_keeps_serving(broker: BrokerProcess) -> None:
    def picky(body: list[bytes]) -> bytes:
        if body[0] == b"bad":
            raise ValueError("boom: bad input")
        return b"ok"

    with serving(broker, {"picky": picky}), client_for(broker) as client:
        with pytest.raises(WorkerFailed) as failed:
            client.request("picky", b"bad")
        assert failed.value.status == 500
        assert failed.value.message == "boom: bad input"
        assert failed.value.service == "picky"
        assert failed.value.request_id
        assert client.request("picky", b"good") == [b"ok"]


def test_lru_spreads_work_over_idle_workers(broker: BrokerProcess) -> None:
    def named(name: str) -> Handler:
        def handler(body: list[bytes]) -> bytes:
            time.sleep(float(body[0]))
            return name.encode()

        return handler

    with contextlib.ExitStack() as stack:
        for number in range(4):
            stack.enter_context(serving(broker, {"who": named(f"w{number}")}))
        # READY sent is not READY processed: wait until the broker lists all four.
        wait_until(lambda: len(management_rows(broker, "workers")) == 4, "four workers ready")

        async def concurrent() -> list[list[bytes]]:
            async with AsyncClient(broker.endpoints["frontend"], timeout=WAIT_S) as client:
                return await asyncio.gather(*(client.request("who", b"0.3") for _ in range(4)))

        replies = asyncio.run(concurrent())
        assert sorted(reply[0] for reply in replies) == [b"w0", b"w1", b"w2", b"w3"]

        # One at a time, least recently used first: every worker gets its turn.
        with client_for(broker) as client:
            served = Counter(client.request("who", b"0")[0] for _ in range(8))
        assert served == {b"w0": 2, b"w1": 2, b"w2": 2, b"w3": 2}


def _start_cli_worker(endpoint: str, *args: str) -> subprocess.Popen[bytes]:
    executable = shutil.which("scale0-worker")
    assert executable is not None, "scale0-worker is not installed: pip install -e ."
    command = [executable, endpoint, *args]
    return subprocess.Popen(
        command,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    process.wait(WAIT_S)


def test_worker_killed_mid_request_is_answered_by_another(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    victim = _start_cli_worker(
        broker.endpoints["backend"],
        "tests.net.handlers:slow",
        "--heartbeat-interval",
        "0.2",
    )
    try:
        with client_for(broker) as probe:
            wait_until(lambda: probe.request("mmi.service", b"slow") == [b"200"])

        def ask() -> list[bytes]:
            with client_for(broker, timeout=20.0) as client:
                return client.request("slow", [str(marker).encode(), b"60"])

        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(ask)
            wait_until(marker.exists)  # the subprocess has the request
            assert marker.read_text() == str(victim.pid)

            def rescue(body: list[bytes]) -> bytes:
                return b"rescued"

            with serving(broker, {"slow": rescue}):
                os.kill(victim.pid, signal.SIGKILL)
                assert answer.result(timeout=15.0) == [b"rescued"]
    finally:
        _kill(victim)


def test_cli_worker_serves_and_stops_on_sigterm(broker: BrokerProcess) -> None:
    process = _start_cli_worker(
        broker.endpoints["backend"],
        "tests.net.handlers:whoami",
        "--service",
        "pid",
        "--capacity",
        "2",
    )
    try:
        with client_for(broker) as client:
            wait_until(lambda: client.request("mmi.service", b"pid") == [b"200"])
            assert client.request("pid", b"") == [str(process.pid).encode()]
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT_S) == 0
    finally:
        _kill(process)


def test_stop_is_thread_safe_and_prompt_without_a_broker() -> None:
    # Nothing listens on the endpoint: the worker keeps backing off until told to stop.
    worker = Worker("tcp://127.0.0.1:9", {"echo": echo_handler}, heartbeat_interval=0.05)
    handle = worker.start_in_thread()
    try:
        # Running without a broker: it gave up on the silent seed at least once.
        wait_until(lambda: worker.failovers >= 1, "the worker leaves the silent seed")
        assert not worker.registered.is_set()
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        stopper.join(WAIT_S)
        started = time.monotonic()
        handle.join(WAIT_S)
        assert not handle.is_alive()
        assert time.monotonic() - started < 2.0
    finally:
        handle.stop(WAIT_S)
