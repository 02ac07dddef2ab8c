"""scale0ctl's broker commands, as real processes, against a family of three scale0-broker
processes whose network config lists their real endpoints (scale0.testing.running_family)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from scale0.net.worker import Worker, WorkerThread
from scale0.testing import Family, running_family, start_family_member
from scale0.wire import (
    SIG_CLIENT,
    CheckConfig,
    ClientReply,
    ClientRequest,
    ConfigAck,
    ConfigType,
    DisconnectError,
    Heartbeat,
    ManagementReply,
    ManagementRequest,
)
from tests.net import s0p

pytestmark = pytest.mark.system

RUN_TIMEOUT_S = 60
EXIT_PARTIAL = 3
EXIT_NO_ANSWER = 4


def scale0ctl() -> str:
    path = shutil.which("scale0ctl")
    assert path is not None, "scale0ctl is not installed"
    return path


def echo(body: list[bytes]) -> list[bytes]:
    return body


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    # liveness 10: the raw test clients below do not heartbeat while a scale0ctl process starts
    # (seconds on a loaded machine), and their sessions must outlive it.
    with running_family(
        tmp_path_factory.mktemp("family"), management=False, liveness=10
    ) as started:
        yield started


@pytest.fixture(scope="module")
def worker(family: Family) -> Iterator[WorkerThread]:
    thread = Worker(family["b1"].endpoints["backend"], {"echo": echo}).start_in_thread()
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def ctl(
    family: Family,
    *args: str,
    user: str = "admin",
    broker: str = "b1",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    password, _ = family.admins[user]
    environment = {
        **os.environ,
        "SCALE0_AUTH_ID": user,
        "SCALE0_AUTH_PASSWORD": password,
        "SCALE0_BROKER": family[broker].frontend,
        **(env or {}),
    }
    return subprocess.run(
        [scale0ctl(), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=environment,
        check=False,
    )


def ctl_json(family: Family, *args: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    result = ctl(family, "--json", *args, **kw)
    assert result.stderr == "", result.stderr
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    return result.returncode, document


def wait_for_worker(family: Family, service: str = "echo", timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code, document = ctl_json(family, "services")
        if code == 0 and any(
            s["service"] == service and s["workers"] for s in document["result"]["services"]
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"no {service} worker registered within {timeout_s} s")


def echo_request(ctx: zmq.Context[Any], endpoint: str, request_id: bytes) -> object:
    with s0p.client(ctx, endpoint) as client:
        client.send(ClientRequest("echo", request_id, (b"hi",)))
        return client.recv_or_none(10.0)


# ---- each command, --json parsed ---------------------------------------------------------------


def test_status_json_describes_the_broker(family: Family, worker: WorkerThread) -> None:
    wait_for_worker(family)
    code, document = ctl_json(family, "status")
    assert code == 0 and document["ok"] is True
    status = document["result"]
    assert status["broker"] == "b1" and status["state"] == "active"
    assert status["family"] == "test" and status["config_version"] == 1
    assert {"requests", "replies", "replies_by_status", "banned_senders", "dropped"} <= set(status)
    assert [s["service"] for s in status["services"]] == ["echo"]


def test_status_text_is_a_readable_summary(family: Family) -> None:
    result = ctl(family, "status")
    assert result.returncode == 0, result.stderr
    assert "broker:    b1 (active), family test" in result.stdout


def test_services_workers_and_clients_list_live_state(
    family: Family, worker: WorkerThread, ctx: zmq.Context[Any]
) -> None:
    wait_for_worker(family)
    with s0p.Dealer(ctx, family["b1"].frontend, SIG_CLIENT) as client:
        client.send(CheckConfig(ConfigType.JSON, 1, client_id="alice", protocol=SIG_CLIENT))
        client.recv(ConfigAck)
        client.send(ClientRequest("echo", b"r1", (b"hi",)))
        assert client.recv(ClientReply).status == 200
        code, clients = ctl_json(family, "clients")
        assert code == 0
        assert "alice" in [c["client_id"] for c in clients["result"]["clients"]]
        client.send(Heartbeat(time.time(), 1, protocol=SIG_CLIENT))  # alive, as a client is
        client.recv(Heartbeat, heartbeats=True)
        text = ctl(family, "clients")
        assert text.returncode == 0 and "alice" in text.stdout
        assert text.stdout.splitlines()[0].split() == ["CLIENT", "REQUESTS", "IDLE_S", "CONFIG"]
    code, services = ctl_json(family, "services")
    assert code == 0
    (echo_row,) = services["result"]["services"]
    assert echo_row["workers"] == 1 and echo_row["latency_count"] >= 1
    code, workers = ctl_json(family, "workers")
    assert code == 0
    (row,) = workers["result"]["workers"]
    assert row["services"] == ["echo"]
    text = ctl(family, "workers")
    assert "echo" in text.stdout and text.stdout.startswith("WORKER")


def test_config_get_shows_the_config_without_password_hashes(family: Family) -> None:
    code, document = ctl_json(family, "config", "get", user="viewer")
    assert code == 0
    config = document["result"]["config"]
    assert [b["identity"] for b in config["brokers"]] == ["b1", "b2", "b3"]
    assert "scrypt$" not in json.dumps(document)


def test_family_wide_lists_ask_every_broker(family: Family, worker: WorkerThread) -> None:
    wait_for_worker(family)
    code, document = ctl_json(family, "services", "--family")
    assert code == 0 and document["complete"] is True
    brokers = document["result"]["brokers"]
    assert [b["broker"] for b in brokers] == ["b1", "b2", "b3"]
    assert [b["code"] for b in brokers] == [200, 200, 200]
    assert brokers[0]["result"]["services"][0]["service"] == "echo"
    text = ctl(family, "services", "--family")
    assert text.returncode == 0
    assert text.stdout.splitlines()[0].split()[:2] == ["BROKER", "SERVICE"]
    for command in ("workers", "clients"):
        assert ctl_json(family, command, "--family")[0] == 0
    code, configs = ctl_json(family, "config", "get", "--family")
    assert code == 0 and len(configs["result"]["brokers"]) == 3


# ---- disable, enable ---------------------------------------------------------------------------


def test_disable_then_a_request_gets_301_then_enable_serves_again(
    family: Family, worker: WorkerThread, ctx: zmq.Context[Any]
) -> None:
    wait_for_worker(family)
    frontend = family["b1"].frontend
    with s0p.client(ctx, frontend) as early:  # negotiated before the broker is disabled
        code, document = ctl_json(family, "disable")
        try:
            assert code == 0, document
            assert document["result"] == {"broker": "b1", "state": "disabled", "changed": True}
            # Refused with a 301 to an active member's frontend (§6.4): one seed is enough.
            others = {family["b2"].frontend, family["b3"].frontend}
            early.send(ClientRequest("echo", b"after-disable", (b"hi",)))
            refused = early.recv(DisconnectError)
            assert refused.code == 301 and "disabled" in refused.message
            assert refused.endpoint in others
            late = s0p.Dealer(ctx, frontend, SIG_CLIENT)
            late.send(CheckConfig(config_type=ConfigType.JSON, protocol=SIG_CLIENT))
            redirected = late.recv(DisconnectError)
            assert redirected.code == 301 and redirected.endpoint in others
            late.close()
            _, status = ctl_json(family, "status")
            assert status["result"]["state"] == "disabled"  # status still answers (§6.4)
            code, listed = ctl_json(family, "services")
            assert code == 1 and listed["code"] == 503
        finally:
            code, document = ctl_json(family, "enable")
        assert code == 0 and document["result"]["state"] == "active"
    reply = echo_request(ctx, frontend, b"after-enable")
    assert isinstance(reply, ClientReply) and reply.status == 200 and reply.body == (b"hi",)


def test_disable_and_enable_another_broker_by_target(family: Family) -> None:
    code, document = ctl_json(family, "disable", "--target", "b2")
    try:
        assert code == 0 and document["result"]["broker"] == "b2"
        _, status = ctl_json(family, "status", broker="b2")
        assert status["result"]["state"] == "disabled"
        _, mine = ctl_json(family, "status")
        assert mine["result"]["state"] == "active"
        text = ctl(family, "status", "--family")
        assert text.returncode == 0
        row = next(line for line in text.stdout.splitlines() if line.startswith("b2"))
        assert "disabled" in row
    finally:
        code, document = ctl_json(family, "enable", "--target", "b2")
    assert code == 0 and document["result"]["state"] == "active"


def test_read_user_may_look_but_not_disable(family: Family) -> None:
    assert ctl_json(family, "status", user="viewer")[0] == 0
    code, document = ctl_json(family, "disable", user="viewer")
    assert code == 1 and document["code"] == 403
    result = ctl(family, "disable", user="viewer")
    assert result.returncode == 1 and "403" in result.stderr and result.stdout == ""
    _, status = ctl_json(family, "status")
    assert status["result"]["state"] == "active"


# ---- credentials and failures ------------------------------------------------------------------


def test_wrong_password_is_exit_1_naming_401(family: Family) -> None:
    result = ctl(family, "status", env={"SCALE0_AUTH_PASSWORD": "not-it"}, broker="b3")
    assert result.returncode == 1
    assert "401 bad credentials" in result.stderr


def test_credentials_file_must_be_0600(family: Family, tmp_path: Path) -> None:
    password, _ = family.admins["viewer"]
    path = tmp_path / "credentials"
    path.write_text(json.dumps({"auth_id": "viewer", "password": password}))
    path.chmod(0o644)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SCALE0_AUTH")}
    environment.update({"SCALE0_CREDENTIALS": str(path), "SCALE0_BROKER": family["b1"].frontend})
    refused = subprocess.run(
        [scale0ctl(), "status"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=environment,
        check=False,
    )
    assert refused.returncode == 1 and "chmod 600" in refused.stderr
    path.chmod(0o600)
    accepted = subprocess.run(
        [scale0ctl(), "status"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=environment,
        check=False,
    )
    assert accepted.returncode == 0, accepted.stderr


def test_repeated_bad_passwords_ban_the_sender_429_then_silence(tmp_path: Path) -> None:
    """One DEALER keeps guessing: 401 up to the threshold, one 429, then nothing at all."""
    with running_family(tmp_path, size=1, management=False, error_threshold=3) as small:
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            dealer = s0p.Dealer(ctx, small["b1"].frontend, SIG_CLIENT)
            for n in range(3):
                dealer.send(ManagementRequest("admin", "guess", "status", f"g{n}"))
                assert dealer.recv(ManagementReply).code == 401
            dealer.send(ManagementRequest("admin", "guess", "status", "g3"))
            assert dealer.recv(DisconnectError).code == 429
            password, _ = small.admins["admin"]
            dealer.send(ManagementRequest("admin", password, "status", "right"))
            assert dealer.recv_or_none(1.5) is None  # banned: even the right password is ignored
        finally:
            ctx.destroy(linger=0)


# ---- family-wide with a broker stopped ---------------------------------------------------------


def test_family_status_with_one_broker_stopped_names_it_and_exits_partial(
    family: Family,
) -> None:
    b3 = family["b3"]
    b3.stop()
    try:
        code, document = ctl_json(family, "status", "--family", "--timeout", "3")
        assert code == EXIT_PARTIAL
        assert document["complete"] is False and document["ok"] is False
        result = document["result"]
        assert result["not_answering"] == ["b3"]
        assert [b["code"] for b in result["brokers"]] == [200, 200, None]
        assert [e["message"] for e in document["errors"]] == ["b3: did not answer"]
        text = ctl(family, "status", "--family", "--timeout", "3")
        assert text.returncode == EXIT_PARTIAL
        assert "b3: did not answer" in text.stderr
        row = next(line for line in text.stdout.splitlines() if line.startswith("b3"))
        assert "not answering" in row
        silent = ctl(family, "status", "--timeout", "1", broker="b3")
        assert silent.returncode == EXIT_NO_ANSWER and "no answer" in silent.stderr
    finally:
        start_family_member(b3)
    assert ctl_json(family, "status", "--family")[0] == 0
