"""Idle beating (docs/protocol.md §3.4) with the real Worker and AsyncClient on loopback, against
the installed ``scale0-broker``: both go idle (beating at the idle interval, promising it, the
broker keeping them far past liveness x interval and beating the worker at its promise), come
back when there is work, and go idle again. Every wait is bounded; the broker is stopped by PID.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scale0.net.client import AsyncClient
from scale0.net.worker import Worker
from scale0.session.link import BrokerLink
from scale0.testing import BrokerProcess, running_broker
from tests.net.probe import PROBE, management_rows

pytestmark = pytest.mark.usefixtures("broker_io")  # loop and lane (tests/conftest.py)

WAIT_S = 10.0
# Interval 100 ms, idle 600 ms, liveness 3: idle peers are kept 1.8 s, 6x the interval's 0.3 s.
IDLE: dict[str, Any] = {"default_heartbeat_interval_ms": 100, "idle_heartbeat_interval_ms": 600}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path, **IDLE, **PROBE) as process:
        yield process


def _idle(link: BrokerLink) -> bool:
    """Our last HEARTBEAT promised the idle interval, and the broker's last one did too."""
    return link.idle and link.broker_interval_s == 0.6


def _promises(broker: BrokerProcess, table: str) -> list[int]:
    return [int(row["promise_ms"]) for row in management_rows(broker, table)]


def test_idle_worker_and_client_are_kept_and_come_back(broker: BrokerProcess) -> None:
    release = threading.Event()

    def held(body: list[bytes]) -> list[bytes]:
        """Answers once the test has seen both active (bounded: WAIT_S)."""
        release.wait(WAIT_S)
        return body

    worker = Worker(broker.endpoints["backend"], {"echo": held}, heartbeat_interval=0.1)
    handle = worker.start_in_thread()
    try:
        assert handle.wait_registered(WAIT_S), "worker did not register"
        asyncio.run(_client_side(broker, worker, release))
    finally:
        release.set()
        handle.stop(WAIT_S)
        assert not handle.is_alive()


async def _wait(condition: Any, what: str) -> None:
    """wait_until on the event loop (the client's own loop must keep running meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        assert loop.time() < deadline, f"{what}: not met within {WAIT_S} s"
        await asyncio.sleep(0.02)


async def _client_side(broker: BrokerProcess, worker: Worker, release: threading.Event) -> None:
    wlink = worker._session.link
    async with AsyncClient(broker.endpoints["frontend"], heartbeat_interval=0.1) as client:
        await client.connect(WAIT_S)
        clink = client._link
        assert clink.idle_interval_s == 0.6 and wlink.idle_interval_s == 0.6  # from CONFIG
        for round_ in range(2):
            # Idle: both promise 600 ms, the broker holds them to it and says so back.
            await _wait(lambda: _idle(wlink) and _idle(clink), f"idle, round {round_}")
            assert await asyncio.to_thread(_promises, broker, "workers") == [600]
            assert await asyncio.to_thread(_promises, broker, "clients") == [600]
            # Kept far past liveness x interval (0.3 s): three idle periods (1.8 s) go by.
            heard = wlink.last_heard
            await _wait(lambda h=heard: wlink.last_heard >= h + 1.8, "1.8 s of idle beats")
            assert worker.failovers == 0 and client.failovers == 0
            assert len(await asyncio.to_thread(management_rows, broker, "workers")) == 1
            # Work: while the request is held both are active, held to 100 ms by the broker,
            # and the broker beats the worker at 100 ms again; then it is answered.
            release.clear()
            reply = asyncio.create_task(client.request("echo", b"hello", timeout=WAIT_S))
            await _wait(lambda: wlink.busy, "the worker holds the request")
            assert not clink.idle and not wlink.idle
            assert await asyncio.to_thread(_promises, broker, "workers") == [0]
            assert await asyncio.to_thread(_promises, broker, "clients") == [0]
            await _wait(lambda: wlink.broker_interval_s == 0, "the broker beats it at 100 ms")
            release.set()
            assert await reply == [b"hello"]
        assert worker.failovers == 0 and client.failovers == 0
