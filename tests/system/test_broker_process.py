"""The installed ``scale0-broker`` as a real process: serve, SIGTERM, and refusing to start."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from scale0.testing import broker_command, running_broker, write_configs
from scale0.wire import ClientReply, ClientRequest, WorkerReply, WorkerRequest
from tests.net import s0p

# Each test runs on the loop and in the C lane (tests/conftest.py broker_io).
pytestmark = [pytest.mark.system, pytest.mark.usefixtures("broker_io")]

RUN_TIMEOUT_S = 30


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run scale0-broker expecting it to exit by itself (bounded)."""
    return subprocess.run(
        [broker_command(), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize("io", ["c", "pyzmq"])
def test_serves_a_request_then_sigterm_disconnects_and_exits_0(
    tmp_path: Path, ctx: zmq.Context[Any], monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    # "pyzmq": the broker without its C extension (scale0.net.frames_io's fallback). "c" where
    # the install built it; where it did not (no C compiler), the broker must say "pyzmq".
    # The worker pool follows SCALE0_PURE too: C where scale0.core._pool is built, unless pure.
    monkeypatch.setenv("SCALE0_PURE", "1" if io == "pyzmq" else "0")
    monkeypatch.delenv("SCALE0_POOL", raising=False)
    pool = "c" if io == "c" and importlib.util.find_spec("scale0.core._pool") else "python"
    if io == "c" and importlib.util.find_spec("scale0.net._zmqio") is None:
        io = "pyzmq"
    with running_broker(tmp_path) as broker:
        with (
            s0p.worker(ctx, broker.endpoints["backend"], ("echo",)) as worker,
            s0p.client(ctx, broker.endpoints["frontend"]) as client,
        ):
            client.send(ClientRequest("echo", b"r1", (b"hello",)))
            request = worker.recv(WorkerRequest)
            worker.send(WorkerReply(request.ticket, 200, request.body))
            reply = client.recv(ClientReply)
            assert (reply.status, reply.body) == (200, (b"hello",))

            assert broker.stop() == 0
            client.expect_command(b"DISCONNECT")
            worker.expect_command(b"DISCONNECT")
        events = [line["event"] for line in broker.logs()]
        assert events.count("broker_ready") == 1
        assert "broker_stopped" in events
        ready = next(line for line in broker.logs() if line["event"] == "broker_ready")
        assert ready["broker"] == "solo"
        assert ready["io"] == io
        assert ready["pool"] == pool
        assert ready["endpoints"] == broker.endpoints
        assert {"ts", "level"} <= set(ready)


def test_sigint_is_a_clean_shutdown_too(tmp_path: Path) -> None:
    with running_broker(tmp_path) as broker:
        broker.process.send_signal(signal.SIGINT)
        assert broker.process.wait(RUN_TIMEOUT_S) == 0


def test_bad_config_exits_1_naming_file_and_line(tmp_path: Path) -> None:
    broker_file, _, _ = write_configs(tmp_path)
    lines = broker_file.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.startswith("frontend_port:"))
    lines[number - 1] = "frontend_port: 99999"
    broker_file.write_text("\n".join(lines) + "\n")
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert f"{broker_file}:{number}" in result.stderr
    assert "frontend_port" in result.stderr


def test_bad_network_config_exits_1_naming_it(tmp_path: Path) -> None:
    broker_file, network_file, _ = write_configs(tmp_path)
    network_file.write_text(network_file.read_text().replace("liveness: 3", "liveness: many"))
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert str(network_file) in result.stderr
    assert "liveness" in result.stderr


def test_an_unknown_worker_pool_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker_file, _, _ = write_configs(tmp_path)
    monkeypatch.setenv("SCALE0_POOL", "rust")
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert "SCALE0_POOL must be one of c, python, not 'rust'" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_exits_1(tmp_path: Path) -> None:
    result = _run("--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert "nope.yaml" in result.stderr


def test_port_in_use_exits_1_with_a_clear_message(tmp_path: Path, ctx: zmq.Context[Any]) -> None:
    squatter = ctx.socket(zmq.ROUTER)
    squatter.setsockopt(zmq.LINGER, 0)
    try:
        squatter.bind("tcp://127.0.0.1:0")
        port = int(squatter.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        broker_file, _, _ = write_configs(tmp_path, broker_overrides={"backend_port": port})
        result = _run("--config", str(broker_file))
    finally:
        squatter.close(linger=0)
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr
    assert "in use" in result.stderr
    assert "backend" in result.stderr


def test_a_joining_broker_without_a_family_is_refused(tmp_path: Path) -> None:
    broker_file, _, _ = write_configs(
        tmp_path, broker_overrides={"config_source": False, "seeds": ("tcp://127.0.0.1:1",)}
    )
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert "family: a broker that joins from seeds must name the family it joins" in result.stderr


def test_an_identity_outside_the_family_is_refused(tmp_path: Path) -> None:
    broker_file, _, _ = write_configs(tmp_path, broker_overrides={"identity": "stranger"})
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert "stranger" in result.stderr
    assert "not one of the brokers" in result.stderr


def test_an_unreadable_signing_key_is_refused(tmp_path: Path) -> None:
    broker_file, _, _ = write_configs(tmp_path)
    (tmp_path / "keys" / "signing.key").write_text("not a key\n")
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert "signing_key" in result.stderr


def test_an_event_log_dir_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    broker_file, _, _ = write_configs(tmp_path, broker_overrides={"event_log_dir": "a-file/ev"})
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert f"event_log_dir: cannot create {tmp_path / 'a-file' / 'ev'}" in result.stderr


def test_an_empty_event_log_dir_is_refused_naming_the_key(tmp_path: Path) -> None:
    broker_file, _, _ = write_configs(tmp_path, broker_overrides={"event_log_dir": ""})
    result = _run("--config", str(broker_file))
    assert result.returncode == 1
    assert "event_log_dir" in result.stderr and "must not be empty" in result.stderr
