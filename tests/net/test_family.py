"""Failover over real sockets: several ``scale0-broker`` processes sharing one network config.

Brokers come from scale0.testing.running_brokers (real processes on loopback ports listed in
the family's config, stopped by PID); a test SIGKILLs one to make it die mid-stream. 301 and a
malformed CONFIG come from a raw ROUTER test peer (tests/net/s0p.py Router) speaking S0P/1.
Workers run in threads. Every wait is bounded: a hang fails a test, it never stalls the suite.
The rules themselves are driven with numbers in tests/net/test_failover.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import zmq

from scale0.net.client import AsyncClient, Client
from scale0.net.errors import RequestTimeout
from scale0.net.worker import Handler, Worker, WorkerThread, echo_handler
from scale0.testing import BrokerProcess, pick_free_ports, running_brokers, wait_until
from scale0.wire import (
    SIG_CLIENT,
    SIG_WORKER,
    CheckConfig,
    ClientRequest,
    Config,
    ConfigType,
    DisconnectError,
)
from tests.net.s0p import Router

pytestmark = pytest.mark.usefixtures("broker_io")  # loop and lane (tests/conftest.py)

WAIT_S = 10.0
HEARTBEAT_S = 0.2
# A short family heartbeat keeps death detection (liveness x interval) at one second; liveness 5
# rather than 3 so a broker slowed by a busy machine is not taken for dead (a spurious move
# would change the failover counts these tests check).
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}


def sigkill(broker: BrokerProcess) -> None:
    """Kill the broker without a word to anyone (no DISCONNECT), and reap it."""
    os.kill(broker.pid, signal.SIGKILL)
    broker.process.wait(WAIT_S)


def front(broker: BrokerProcess) -> str:
    return broker.endpoints["frontend"]


def back(broker: BrokerProcess) -> str:
    return broker.endpoints["backend"]


@contextlib.contextmanager
def serving(endpoint: str, handlers: dict[str, Handler], **options: Any) -> Iterator[Worker]:
    handle: WorkerThread = Worker(
        endpoint, handlers, heartbeat_interval=HEARTBEAT_S, **options
    ).start_in_thread()
    try:
        assert handle.wait_registered(WAIT_S), "worker did not register"
        yield handle.worker
    finally:
        handle.stop(WAIT_S)
        assert not handle.is_alive()


def registered_at(worker: Worker, endpoint: str) -> Callable[[], bool]:
    return lambda: worker.endpoint == endpoint and worker.registered.is_set()


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


# ---- the helpers themselves ------------------------------------------------------------------


def test_pick_free_ports_gives_distinct_bindable_ports() -> None:
    ports = pick_free_ports(8)
    assert len(set(ports)) == 8
    assert all(1024 <= port <= 65535 for port in ports)


def test_running_brokers_list_the_endpoints_they_bind(tmp_path: Path) -> None:
    with running_brokers(tmp_path, 2, states=["active", "disabled"]) as brokers:
        entries = brokers[0].network.brokers
        assert [entry.identity for entry in entries] == ["b1", "b2"]
        assert [front(b) for b in brokers] == [entry.frontend for entry in entries]
        assert [back(b) for b in brokers] == [entry.backend for entry in entries]
        assert brokers[0].network_file == brokers[1].network_file
        pids = [broker.pid for broker in brokers]
    for pid in pids:  # stopped by PID on exit
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# ---- bootstrap from one seed ----------------------------------------------------------------


@pytest.mark.parametrize("config_type", list(ConfigType))
def test_a_client_and_a_worker_given_one_seed_learn_the_family(
    tmp_path: Path, config_type: ConfigType
) -> None:
    with running_brokers(tmp_path, 3, **FAST) as brokers:
        fronts = [front(b) for b in brokers]
        backs = [back(b) for b in brokers]
        with Client(fronts[1], config_type=config_type.value, timeout=WAIT_S) as client:
            assert client.brokers == [fronts[1]]  # the seed alone, before CONFIG
            client.connect()
            assert client.brokers == fronts
            assert client.endpoint == fronts[1] and client.failovers == 0
        with serving(backs[2], {"echo": echo_handler}, config_type=config_type.value) as worker:
            assert worker.brokers == backs
            assert worker.endpoint == backs[2] and worker.failovers == 0


# ---- a broker dies ---------------------------------------------------------------------------


class _Stuck:
    """A handler that serves ``free`` requests, then holds the next one until ``release``."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.calls = 0
        self.stuck = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, body: list[bytes]) -> list[bytes]:
        with self._lock:
            self.calls += 1
            hold = self.calls > self.free
        if hold:
            self.stuck.set()
            self.release.wait(WAIT_S)
        return body


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigkill_mid_stream_every_pending_request_is_answered_once_by_another_broker(
    tmp_path: Path, kind: str
) -> None:
    bodies = [b"%d" % number for number in range(120)]
    with running_brokers(tmp_path, 2, **FAST) as (first, second):
        stuck = _Stuck(free=30)  # the first broker's worker: the stream stalls there for sure
        with (
            serving(back(first), {"work": stuck}),
            serving(back(second), {"work": lambda body: body}),
        ):
            if kind == "sync":
                with (
                    Client(front(first), timeout=30.0, heartbeat_interval=HEARTBEAT_S) as client,
                    ThreadPoolExecutor(1) as pool,
                ):
                    client.connect()
                    # The pool's thread owns the client until request_many returns.
                    future = pool.submit(client.request_many, "work", bodies, 20)
                    assert stuck.stuck.wait(WAIT_S)  # 20 requests outstanding, none can finish
                    sigkill(first)
                    stuck.release.set()
                    results = future.result(timeout=30.0)
                    failovers, endpoint = client.failovers, client.endpoint
            else:

                async def main() -> tuple[list[list[bytes]], int, str]:
                    async with AsyncClient(
                        front(first), timeout=30.0, heartbeat_interval=HEARTBEAT_S
                    ) as client:
                        await client.connect()
                        tasks = [
                            asyncio.create_task(client.request("work", body)) for body in bodies
                        ]
                        assert await asyncio.to_thread(stuck.stuck.wait, WAIT_S)
                        sigkill(first)
                        stuck.release.set()
                        answers = await asyncio.gather(*tasks)
                        return answers, client.failovers, client.endpoint

                results, failovers, endpoint = asyncio.run(asyncio.wait_for(main(), 40.0))
    # Exactly one answer per request, each its own, in order: replies to a request_id nobody
    # waits for any more (a late duplicate) are dropped, never delivered twice.
    assert results == [[body] for body in bodies]
    assert failovers == 1 and endpoint == front(second)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_worker_whose_broker_dies_registers_on_another_and_serves(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "scale0.failover")
    with (
        running_brokers(tmp_path, 2, **FAST) as (first, second),
        serving(back(first), {"who": lambda body: b"mover"}) as worker,
        Client(front(second), timeout=WAIT_S, heartbeat_interval=HEARTBEAT_S) as client,
    ):
        if how == "SIGKILL":
            sigkill(first)  # silence: liveness x interval
        else:
            first.stop()  # an orderly shutdown says DISCONNECT to every worker
        wait_until(registered_at(worker, back(second)))
        assert client.request("who", b"") == [b"mover"]
        assert worker.failovers == 1
    reason = "answered nothing" if how == "SIGKILL" else "DISCONNECT"
    assert any(
        back(first) in r.message and reason in r.message and back(second) in r.message
        for r in caplog.records
    )


def test_a_503_from_a_disabled_broker_moves_clients_and_workers_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "scale0.failover")
    with (
        running_brokers(tmp_path, 3, states=["active", "disabled", "active"], **FAST) as brokers,
        serving(back(brokers[0]), {"who": lambda body: b"mover"}) as worker,
        Client(front(brokers[0]), timeout=WAIT_S, heartbeat_interval=HEARTBEAT_S) as client,
    ):
        first, disabled, third = brokers
        assert client.request("who", b"") == [b"mover"]
        sigkill(first)
        # Both know b1, b2, b3: after b1 comes b2, which answers 503 (§6.4), then b3.
        wait_until(registered_at(worker, back(third)))
        assert client.request("who", b"") == [b"mover"]
        assert client.endpoint == front(third) and client.failovers >= 2
        assert worker.failovers >= 2
    # The disabled broker points the way (R3): 301 to an active peer's frontend or backend.
    for endpoint in (front(disabled), back(disabled)):
        assert any(
            f"leaving broker {endpoint} (DISCONNECTERROR 301 broker b2 is disabled: go to "
            in r.message
            for r in caplog.records
        )


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_client_whose_every_broker_is_down_times_out_instead_of_hanging(
    tmp_path: Path, kind: str
) -> None:
    with running_brokers(tmp_path, 2, **FAST) as brokers:
        fronts = [front(b) for b in brokers]
        if kind == "sync":
            with (
                Client(fronts[0], timeout=3.0, heartbeat_interval=HEARTBEAT_S) as client,
                ThreadPoolExecutor(1) as pool,
            ):
                client.connect()
                assert client.brokers == fronts
                for broker in brokers:
                    sigkill(broker)
                future = pool.submit(client.request, "echo", b"x")
                with pytest.raises(RequestTimeout):
                    future.result(timeout=30.0)  # bounded: a hang fails here
                assert client.failovers >= 1
        else:

            async def main() -> None:
                async with AsyncClient(
                    fronts[0], timeout=3.0, heartbeat_interval=HEARTBEAT_S
                ) as client:
                    await client.connect()
                    assert client.brokers == fronts
                    for broker in brokers:
                        sigkill(broker)
                    with pytest.raises(RequestTimeout):
                        await client.request("echo", b"x")
                    assert client.failovers >= 1

            asyncio.run(asyncio.wait_for(main(), 30.0))


# ---- told to move: 301, and a test peer that misbehaves ---------------------------------------


def test_a_301_moves_the_client_and_a_garbage_301_counts_as_503(
    tmp_path: Path, context: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "scale0.failover")
    with (
        running_brokers(tmp_path, 1, **FAST) as (broker,),
        serving(back(broker), {"echo": echo_handler}),
        Router(context, SIG_CLIENT) as peer,
        Client(peer.endpoint, timeout=WAIT_S, heartbeat_interval=HEARTBEAT_S) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        future = pool.submit(client.request, "echo", b"moved")
        routing_id, _ = peer.recv(CheckConfig)
        peer.send(routing_id, DisconnectError(301, "elsewhere", "ipc:///x", protocol=SIG_CLIENT))
        # Handled as 503: the seed is the only broker it knows, so a new DEALER comes back.
        again, _ = peer.recv(CheckConfig)
        assert again != routing_id
        peer.send(again, DisconnectError(301, "go there", front(broker), protocol=SIG_CLIENT))
        assert future.result(timeout=WAIT_S) == [b"moved"]
        assert client.endpoint == front(broker) and client.failovers == 2
    assert "handled as 503" in caplog.text


def test_a_301_moves_the_worker(tmp_path: Path, context: zmq.Context[zmq.Socket[bytes]]) -> None:
    with (
        running_brokers(tmp_path, 1, **FAST) as (broker,),
        Router(context, SIG_WORKER) as peer,
    ):
        handle = Worker(
            peer.endpoint, {"echo": echo_handler}, heartbeat_interval=HEARTBEAT_S
        ).start_in_thread()
        try:
            routing_id, _ = peer.recv(CheckConfig)
            peer.send(routing_id, DisconnectError(301, "go", back(broker), protocol=SIG_WORKER))
            wait_until(registered_at(handle.worker, back(broker)))
            with Client(front(broker), timeout=WAIT_S) as client:
                assert client.request("echo", b"served") == [b"served"]
            assert handle.worker.failovers == 1
        finally:
            handle.stop(WAIT_S)
        assert not handle.is_alive()


def test_a_malformed_brokers_list_is_survived_and_a_503_moves_the_client_on(
    tmp_path: Path, context: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "scale0.failover")
    with (
        running_brokers(tmp_path, 1, **FAST) as (broker,),
        serving(back(broker), {"echo": echo_handler}),
        Router(context, SIG_CLIENT) as peer,
        Client(peer.endpoint, timeout=WAIT_S, heartbeat_interval=HEARTBEAT_S) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        future = pool.submit(client.request, "echo", b"x")
        routing_id, _ = peer.recv(CheckConfig)
        view = {
            "family": "test",
            "config_version": 1,
            "brokers": [
                "junk",
                {"identity": "nowhere"},
                {"frontend": "udp://127.0.0.1:1"},
                {"frontend": peer.endpoint},
                {"frontend": front(broker), "role": "active"},
            ],
        }
        document = json.dumps(view).encode()
        peer.send(
            routing_id,
            Config(ConfigType.JSON, 1, "0" * 64, "c.1", document, protocol=SIG_CLIENT),
        )
        routing_id, _ = peer.recv(ClientRequest)
        peer.send(routing_id, DisconnectError(503, "test peer not accepting", protocol=SIG_CLIENT))
        assert future.result(timeout=WAIT_S) == [b"x"]  # resent, same id, to the next broker
        assert client.brokers == [peer.endpoint, front(broker)]
        assert client.endpoint == front(broker) and client.failovers == 1
    assert sum("skipped" in r.message for r in caplog.records) == 3
