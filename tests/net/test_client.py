"""scale0.net.client against the real broker process (and BrokerLink's rules without sockets).

Brokers are the installed ``scale0-broker`` (scale0.testing.running_broker), workers run in threads.
Every wait is bounded; brokers are stopped by PID when their ``with`` block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from scale0.net import errors
from scale0.net.client import AsyncClient, BrokerLink, Client, LinkEvent
from scale0.net.errors import (
    RequestTimeout,
    Scale0Error,
    ServiceNotFound,
    ServiceUnavailable,
    WorkerFailed,
    WorkerLost,
    error_for_reply,
)
from scale0.net.worker import Handler, Worker, WorkerThread, echo_handler
from scale0.session.failover import Failover
from scale0.session.requests import ClientSession
from scale0.testing import BrokerProcess, running_broker, wait_until
from scale0.wire.client import (
    CheckConfig,
    ClientReply,
    Config,
    ConfigAck,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.frames import SIG_CLIENT, ConfigType
from scale0.wire.registry import decode_to_broker
from tests.net.probe import PROBE, management_rows

pytestmark = pytest.mark.usefixtures("broker_io")  # loop and lane (tests/conftest.py)

WAIT_S = 10.0
#: The UNIX time the pure tests pass to the link (it only goes into HEARTBEAT).
WALL = 1_700_000_000.0
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200}


@contextlib.contextmanager
def serving(broker: BrokerProcess, handlers: dict[str, Handler]) -> Iterator[WorkerThread]:
    handle = Worker(broker.endpoints["backend"], handlers, heartbeat_interval=0.2).start_in_thread()
    try:
        assert handle.wait_registered(WAIT_S), "worker did not register"
        yield handle
    finally:
        handle.stop(WAIT_S)
        assert not handle.is_alive()


# ---- BrokerLink without sockets ---------------------------------------------------------------


def _sent(link: BrokerLink) -> list[bytes]:
    """Commands in the outbox, emptied."""
    commands = [frames[2] for frames in link.outbox]
    link.outbox.clear()
    return commands


def test_link_negotiates_then_heartbeats_and_detects_silence() -> None:
    link = BrokerLink(SIG_CLIENT, heartbeat_interval_s=0.5)
    link.reset(100.0)
    [frames] = link.outbox
    check = decode_to_broker(frames, max_frame_bytes=1 << 20)
    assert isinstance(check, CheckConfig) and check.config_version is None
    link.outbox.clear()
    assert not link.tick(100.4, WALL)
    assert _sent(link) == []  # no HEARTBEAT before negotiation
    event = link.handle(
        Config(ConfigType.JSON, 3, "0" * 64, "me", b'{"liveness": 4}', protocol=SIG_CLIENT), 100.5
    )
    assert event is LinkEvent.NEGOTIATED
    assert link.client_id == "me" and link.config is not None and link.config.version == 3
    assert link.liveness == 4
    link.heard(100.5)
    assert not link.tick(101.0, WALL)
    assert _sent(link) == [b"HEARTBEAT"]
    assert not link.tick(102.5, WALL)  # 2.0 s of silence < 4 x 0.5
    assert link.tick(102.6, WALL)


def test_link_raises_its_interval_to_what_the_broker_announces() -> None:
    link = BrokerLink(SIG_CLIENT, heartbeat_interval_s=0.1)
    link.reset(0.0)
    link.handle(Heartbeat(1.0, 0, hbeatinterval_ms=750, protocol=SIG_CLIENT), 0.0)
    assert link.interval_s == 0.75
    link.handle(Heartbeat(1.0, 0, hbeatinterval_ms=50, protocol=SIG_CLIENT), 0.0)
    assert link.interval_s == 0.1  # the broker's latest word, never below what we asked for


def test_link_reacts_to_each_refusal_code() -> None:
    link = BrokerLink(SIG_CLIENT, client_id="mine")
    link.reset(0.0)
    link.outbox.clear()
    link.handle(ConfigAck(1, "mine", protocol=SIG_CLIENT), 0.0)

    def refuse(code: int, endpoint: str | None = None) -> LinkEvent | None:
        error = DisconnectError(code, "no", endpoint, protocol=SIG_CLIENT)
        return link.handle(error, 1.0)

    assert refuse(426) is LinkEvent.REFUSED
    assert _sent(link) == [b"CHECKCONFIG"]  # at once
    assert refuse(409) is LinkEvent.REFUSED
    assert link.client_id is None  # another id, assigned by the broker
    assert _sent(link) == []
    assert link.retry_at is not None
    link.tick(link.retry_at, WALL)
    assert _sent(link) == [b"CHECKCONFIG"]  # after the back-off
    assert refuse(301, "tcp://127.0.0.1:7") is LinkEvent.RECONNECT
    assert link.move_to == "tcp://127.0.0.1:7"
    assert refuse(401) is LinkEvent.STOP
    assert link.handle(ForceNegotiate("no session", protocol=SIG_CLIENT), 5.0) is None
    assert _sent(link) == [b"CHECKCONFIG"]
    # More FORCENEGOTIATEs while that CHECKCONFIG is young (one per message sent before it)
    # do not ask again; an old unanswered one does.
    assert link.handle(ForceNegotiate("no session", protocol=SIG_CLIENT), 5.5) is None
    assert _sent(link) == []
    assert link.handle(ForceNegotiate("no session", protocol=SIG_CLIENT), 6.1) is None
    assert _sent(link) == [b"CHECKCONFIG"]


def test_a_409_to_a_resent_request_is_not_its_answer() -> None:
    link = BrokerLink(SIG_CLIENT)
    failover = Failover("tcp://127.0.0.1:1", "frontend")
    session = ClientSession(link, retries=2, failover=failover, id_prefix=bytes(8))
    link.reset(0.0)
    session.receive(ConfigAck(1, "me", protocol=SIG_CLIENT).to_frames(), 0.0)
    link.outbox.clear()
    request = session.submit("svc", b"x", 3.0, 0.0)
    session.tick(1.0, WALL)  # attempt timeout 3 / (2 + 1): resent once, same request_id
    sent = [frames[4] for frames in link.outbox if frames[2] == b"REQUEST"]
    assert sent == [request.request_id] * 2
    duplicate = ClientReply.failure("svc", request.request_id, 409, "in flight")
    session.receive(duplicate.to_frames(), 1.1)
    assert not request.finished() and not request.outcomes
    session.receive(ClientReply("svc", request.request_id, 200, (b"ok",)).to_frames(), 1.2)
    assert request.finished() and list(request.outcomes) == [(True, [b"ok"])]


def test_error_for_reply_maps_statuses() -> None:
    assert type(error_for_reply("s", b"r", 404, "m")) is ServiceNotFound
    assert type(error_for_reply("s", b"r", 503, "m")) is ServiceUnavailable
    assert type(error_for_reply("s", b"r", 504, "m")) is WorkerLost
    failed = error_for_reply("s", b"r", 418, "teapot")
    assert type(failed) is WorkerFailed and failed.status == 418 and failed.message == "teapot"


def test_every_error_readme_names_imports_from_where_it_says() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("errors raise")
    paragraph = readme[start : readme.index("\n\n", start)]
    [module_name] = re.findall(r"`from (scale0[\w.]*) import \w+`", paragraph)
    names = set(re.findall(r"`([A-Z]\w+)`", paragraph)) - {"AsyncClient"}
    assert {"ServiceNotFound", "ServiceUnavailable", "WorkerLost", "WorkerFailed"} <= names
    assert {"RequestTimeout", "BrokerRefused", "Scale0Error"} <= names
    module = importlib.import_module(module_name)
    for name in sorted(names):
        error = getattr(module, name)
        assert isinstance(error, type) and issubclass(error, Scale0Error), name
        assert error is getattr(errors, name)  # the same classes, not look-alikes
    from scale0.net.client import ServiceUnavailable as FromClient

    assert FromClient is ServiceUnavailable


def test_connect_without_a_broker_times_out() -> None:
    with Client("tcp://127.0.0.1:9", timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            client.connect()
        with pytest.raises(RequestTimeout) as timed_out:
            client.request("echo", b"x")
        assert timed_out.value.service == "echo"
        assert time.monotonic() - started < 2.0


# ---- through the broker -----------------------------------------------------------------------


def test_request_reply_and_the_config_received(tmp_path: Path) -> None:
    with (
        running_broker(tmp_path, **FAST) as broker,
        serving(broker, {"echo": echo_handler}),
        Client(broker.endpoints["frontend"], timeout=WAIT_S) as client,
    ):
        assert client.request("echo", [b"hello", b"world"]) == [b"hello", b"world"]
        config = client.config
        assert config is not None
        assert config.version == broker.network.config_version
        assert config.family == "test"
        assert [entry["identity"] for entry in config.brokers] == ["solo"]
        assert client.client_id == config.client_id
        # request_many keeps the order of the bodies.
        bodies = [b"%d" % number for number in range(300)]
        assert client.request_many("echo", bodies, window=50) == [[body] for body in bodies]


def test_an_idle_client_is_renegotiated_transparently(tmp_path: Path) -> None:
    with (
        running_broker(tmp_path, **FAST, **PROBE) as broker,
        serving(broker, {"echo": echo_handler}),
        Client(broker.endpoints["frontend"], timeout=WAIT_S, heartbeat_interval=0.2) as client,
    ):
        assert client.request("echo", b"1") == [b"1"]
        first_id = client.client_id

        def forgotten() -> bool:
            rows = management_rows(broker, "clients")
            return all(row.get("client_id") != first_id for row in rows)

        # No I/O from the client: the broker forgets the session after 3 x 0.2 s of silence.
        wait_until(forgotten, "the broker forgets the idle client")
        started = time.monotonic()
        assert client.request("echo", b"2") == [b"2"]
        assert time.monotonic() - started < 1.0
        assert client.client_id == first_id  # the same id is asked for again


def test_async_client_pipelines_200_requests(tmp_path: Path) -> None:
    async def main(endpoint: str) -> None:
        async with AsyncClient(endpoint, timeout=WAIT_S) as client:
            config = await client.connect()
            assert config.family == "test"
            bodies = [b"%d" % number for number in range(200)]
            replies = await asyncio.gather(*(client.request("echo", body) for body in bodies))
            assert replies == [[body] for body in bodies]
            parts = [part async for part in client.request_stream("echo", b"s")]
            assert parts == [[b"s"]]

    with running_broker(tmp_path, **FAST) as broker, serving(broker, {"echo": echo_handler}):
        asyncio.run(asyncio.wait_for(main(broker.endpoints["frontend"]), 30.0))


def test_unknown_service_and_no_worker(tmp_path: Path) -> None:
    with (
        running_broker(tmp_path, request_timeout_ms=1000, **FAST) as broker,
        Client(broker.endpoints["frontend"], timeout=WAIT_S) as client,
    ):
        # Young broker: an unknown service waits for a worker until the deadline (503).
        with pytest.raises(ServiceUnavailable) as unavailable:
            client.request("nobody", b"x")
        assert unavailable.value.status == 503
        # Once it has run longer than request_timeout_ms, an unknown service is 404 at once.
        started = time.monotonic()
        with pytest.raises(ServiceNotFound) as not_found:
            client.request("nobody", b"x")
        assert not_found.value.status == 404
        assert not_found.value.service == "nobody"
        assert time.monotonic() - started < 0.9


def test_client_timeout_when_the_worker_is_too_slow(tmp_path: Path) -> None:
    def sluggish(body: list[bytes]) -> bytes:
        time.sleep(1.5)
        return b"late"

    with (
        running_broker(tmp_path, **FAST) as broker,
        serving(broker, {"sluggish": sluggish}),
        Client(broker.endpoints["frontend"], timeout=0.6, retries=2) as client,
    ):
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            client.request("sluggish", b"x")
        assert 0.5 < time.monotonic() - started < 1.5
        # The late reply is dropped, and the client still works.
        assert client.request("sluggish", b"y", timeout=5.0) == [b"late"]


def test_client_and_worker_survive_a_broker_restart(tmp_path: Path) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    with running_broker(first_dir, **FAST) as first:
        endpoints = dict(first.endpoints)
        ports_of = {name: endpoints[name] for name in ("frontend", "backend")}
        ports = {
            f"{name}_port": int(endpoints[name].rsplit(":", 1)[1])
            for name in ("frontend", "backend")
        }
        with (
            serving(first, {"echo": echo_handler}) as worker,
            Client(endpoints["frontend"], timeout=15.0, heartbeat_interval=0.2) as client,
            ThreadPoolExecutor(1) as pool,
        ):
            assert client.request("echo", b"before") == [b"before"]
            os.kill(first.pid, signal.SIGKILL)
            first.process.wait(WAIT_S)
            # A request made while no broker runs; the client's thread hands it to the pool's
            # thread, which owns the client until the answer comes.
            during = pool.submit(client.request, "echo", b"during")
            # After liveness x interval (3 x 0.2 s) of silence both give up on the socket.
            wait_until(
                lambda: client.failovers >= 1 and worker.worker.failovers >= 1,
                "the client and the worker leave the dead broker",
            )
            assert not worker.worker.registered.is_set()
            with running_broker(second_dir, broker_overrides=ports, **FAST) as second:
                assert {k: second.endpoints[k] for k in ports_of} == ports_of
                started = time.monotonic()
                assert during.result(timeout=12.0) == [b"during"]
                assert time.monotonic() - started < 10.0
                assert worker.wait_registered(WAIT_S)
                assert client.request("echo", b"after") == [b"after"]
                assert client.request_many("echo", [b"1", b"2"]) == [[b"1"], [b"2"]]
