"""CURVE and authorization by key on real ``scale0-broker`` processes (issue 15 items 1-2).

Each test starts brokers whose sockets serve CURVE (``running_brokers(..., curve=True)``),
clients and workers with key pairs of their own (``keys/client.curve.key``...), and checks what
a key that is missing, wrong, not granted or past its grant gets, and that everyone else is
still served. Waits are bounded; what a broker did is read from its JSON log lines.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scale0.config.model import KeyGrant
from scale0.crypto.curve import generate_curve_keypair, load_curve_secret_key
from scale0.net.client import Client
from scale0.net.worker import Worker, echo_handler
from scale0.session.errors import BrokerRefused, Forbidden, RequestTimeout
from scale0.testing import (
    BrokerProcess,
    _spawn_broker,
    curve_options,
    curve_worker_args,
    running_brokers,
    wait_for_endpoints,
    wait_until,
    write_family_configs,
)

# Each test runs on the loop and in the C lane (tests/conftest.py broker_io).
pytestmark = [pytest.mark.system, pytest.mark.usefixtures("broker_io")]

WAIT_S = 20.0
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}


def events(broker: BrokerProcess, name: str) -> list[dict[str, Any]]:
    return [line for line in broker.logs() if line.get("event") == name]


def keys(tmp_path: Path, *names: str) -> dict[str, str]:
    """Key pairs made before the family (its helper keeps them): name -> public key."""
    directory = tmp_path / "keys"
    directory.mkdir(parents=True, exist_ok=True)
    return {name: generate_curve_keypair(directory, name)[2].public for name in names}


@contextlib.contextmanager
def worker(broker: BrokerProcess, services: dict[str, Any], who: str = "worker") -> Iterator[Any]:
    handle = Worker(
        broker.endpoints["backend"], services, heartbeat_interval=0.2, **curve_options(broker, who)
    ).start_in_thread()
    try:
        yield handle
    finally:
        handle.stop(WAIT_S)


def test_a_client_without_the_right_key_cannot_connect_and_the_rest_are_served(
    tmp_path: Path,
) -> None:
    public = keys(tmp_path, "client", "client2", "worker")
    grants = {
        "clients": [{"key": public["client"]}],
        "workers": [{"key": public["worker"]}],
    }
    with running_brokers(tmp_path, 1, curve=True, **FAST, **_grants(grants)) as (b1,):
        with worker(b1, {"echo": echo_handler}) as handle:
            assert handle.wait_registered(WAIT_S)
            good = curve_options(b1, "client")
            with Client(b1.endpoints["frontend"], timeout=10.0, **good) as client:
                assert client.request("echo", b"granted") == [b"granted"]

                # No CURVE at all: the handshake fails, the client hears nothing.
                with (
                    pytest.raises(RequestTimeout, match="if the family serves CURVE"),
                    Client(b1.endpoints["frontend"], timeout=2.0) as plain,
                ):
                    plain.connect(timeout=2.0)

                # A valid key pair the config does not grant: ZAP refuses it, logged with it.
                other = curve_options(b1, "client2")
                with (
                    pytest.raises(RequestTimeout, match="curve_refused"),
                    Client(b1.endpoints["frontend"], timeout=2.0, **other) as refused,
                ):
                    refused.connect(timeout=2.0)
                wait_until(
                    lambda: any(
                        e.get("key") == public["client2"] and e.get("domain") == "frontend"
                        for e in events(b1, "curve_refused")
                    ),
                    what="the refusal logged with the key",
                )
                refusal = next(
                    e for e in events(b1, "curve_refused") if e.get("key") == public["client2"]
                )
                assert refusal["address"] == "127.0.0.1"
                assert "no grant in clients" in refusal["reason"]

                # The right client key but the wrong server key: CURVE fails, nothing leaks.
                wrong = dict(good, server_key=public["client2"])
                with (
                    pytest.raises(RequestTimeout),
                    Client(b1.endpoints["frontend"], timeout=2.0, **wrong) as lost,
                ):
                    lost.connect(timeout=2.0)

                # Everyone else is still served.
                assert client.request("echo", b"still") == [b"still"]
        assert b1.stop() == 0


def _grants(grants: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        field: tuple(KeyGrant(**entry) for entry in entries) for field, entries in grants.items()
    }


def test_the_secret_key_file_must_be_0600_and_match_the_config(tmp_path: Path) -> None:
    files, _network_file, network = write_family_configs(tmp_path, 1, curve=True)
    key_file = tmp_path / "keys" / "b1.curve.key"
    os.chmod(key_file, 0o644)
    process, endpoints_file, stderr_path = _spawn_broker(files[0])
    with pytest.raises(RuntimeError):
        wait_for_endpoints(process, endpoints_file, stderr_path, WAIT_S)
    assert process.wait(WAIT_S) == 1
    assert "curve_secret_key" in stderr_path.read_text() and "chmod 600" in stderr_path.read_text()

    os.chmod(key_file, 0o600)
    pair = load_curve_secret_key(key_file)
    generate_curve_keypair(tmp_path / "keys", "b1", overwrite=True)  # no longer the config's
    process, endpoints_file, stderr_path = _spawn_broker(files[0])
    with pytest.raises(RuntimeError):
        wait_for_endpoints(process, endpoints_file, stderr_path, WAIT_S)
    assert process.wait(WAIT_S) == 1
    assert f"curve_public_key is {pair.public}" in stderr_path.read_text()
    assert network.brokers[0].curve_public_key == pair.public


def served_by(name: str) -> Callable[[list[bytes]], list[bytes]]:
    return lambda body: [name.encode(), *body]


def test_a_worker_with_a_valid_key_but_no_right_to_a_service_is_refused_with_403(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    public = keys(tmp_path, "client", "worker", "worker2")
    grants = {
        "workers": [
            {"key": public["worker"], "services": ["echo", "secret.*"]},
            {"key": "*", "services": ["echo"]},  # every other key: echo only
        ],
    }
    with (
        running_brokers(tmp_path, 1, curve=True, **FAST, **_grants(grants)) as (b1,),
        worker(b1, {"echo": served_by("w1"), "secret.a": served_by("w1")}) as allowed,
        worker(b1, {"secret.a": served_by("w2")}, who="worker2"),
    ):
        assert allowed.wait_registered(WAIT_S)
        wait_until(
            lambda: any(
                e.get("key") == public["worker2"] and "may not serve secret.a" in e["reason"]
                for e in events(b1, "key_refused")
            ),
            what="worker2 refused with 403, logged with its key",
        )
        # The worker was told why: DISCONNECTERROR 403 naming the service (it may hear it a
        # moment after the broker logged it).
        wait_until(
            lambda: any(
                "broker refused: 403" in r.getMessage() and "secret.a" in r.getMessage()
                for r in caplog.records
            ),
            what="worker2 told DISCONNECTERROR 403 naming secret.a",
        )
        with Client(b1.endpoints["frontend"], timeout=10.0, **curve_options(b1)) as client:
            for i in range(20):
                assert client.request("secret.a", b"%d" % i) == [b"w1", b"%d" % i]
        ready = [e for e in events(b1, "worker_ready") if "secret.a" in e["services"]]
        assert len(ready) == 1, ready  # only the granted worker ever registered it


def test_a_client_calling_a_service_it_may_not_call_gets_403(tmp_path: Path) -> None:
    public = keys(tmp_path, "client", "client2", "worker")
    grants = {
        "clients": [
            {"key": public["client"], "services": ["echo"]},
            {"key": public["client2"], "services": "all"},
        ],
    }
    with running_brokers(tmp_path, 2, curve=True, **FAST, **_grants(grants)) as (b1, b2):
        wait_until(
            lambda: any(e.get("peer") == "b2" for e in events(b1, "peer_linked")),
            what="b1 linked to b2",
        )
        # The worker is at b2 only: b1 forwards what it lets through.
        with worker(b2, {"echo": served_by("w"), "admin.reset": served_by("w")}) as handle:
            assert handle.wait_registered(WAIT_S)
            with (
                Client(b1.endpoints["frontend"], timeout=10.0, **curve_options(b1)) as limited,
                Client(
                    b1.endpoints["frontend"], timeout=10.0, **curve_options(b1, "client2")
                ) as full,
            ):
                wait_until(lambda: _answers(full, "admin.reset"), what="b1 forwards to b2")
                assert limited.request("echo", b"x") == [b"w", b"x"]
                with pytest.raises(Forbidden) as info:
                    limited.request("admin.reset", b"x")
                assert info.value.status == 403
                assert "may not call 'admin.reset'" in str(info.value)
                assert full.request("admin.reset", b"y") == [b"w", b"y"]
                assert limited.request("echo", b"z") == [b"w", b"z"]  # still served
            refused = [e for e in events(b1, "request_refused") if e["key"] == public["client"]]
            assert refused and refused[0]["service"] == "admin.reset"


@pytest.mark.parametrize("io", ["c", "pyzmq"])
def test_each_connection_s_key_reaches_the_core_on_both_io_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    """A CURVE port is read with each message's sender's key (frames_io.recv_batch_keyed),
    through the C batch and through its pyzmq fallback (SCALE0_PURE=1) alike: the core knows
    every connection's key before its first message, so a granted key is served from its first
    request, and one granted less is refused what it lacks, logged with its key."""
    if io == "pyzmq":
        monkeypatch.setenv("SCALE0_PURE", "1")
    elif importlib.util.find_spec("scale0.net._zmqio") is None:
        pytest.skip("the C extension was not built here (no C compiler at install)")
    public = keys(tmp_path, "client", "client2", "worker", "worker2")
    grants = {
        "clients": [
            {"key": public["client"], "services": ["echo"]},
            {"key": public["client2"], "services": "all"},
        ],
        "workers": [
            {"key": public["worker"], "services": ["echo", "secret.*"]},
            {"key": public["worker2"], "services": ["echo"]},
        ],
    }
    with (
        running_brokers(tmp_path, 1, curve=True, **FAST, **_grants(grants)) as (b1,),
        worker(b1, {"echo": served_by("w1"), "secret.a": served_by("w1")}) as allowed,
        worker(b1, {"secret.a": served_by("w2")}, who="worker2"),
    ):
        assert [e["io"] for e in events(b1, "broker_ready")] == [io]
        assert allowed.wait_registered(WAIT_S)
        wait_until(
            lambda: any(
                e.get("key") == public["worker2"] and "may not serve secret.a" in e["reason"]
                for e in events(b1, "key_refused")
            ),
            what="worker2 refused with 403, logged with its key",
        )
        with (
            Client(b1.endpoints["frontend"], timeout=10.0, **curve_options(b1)) as limited,
            Client(b1.endpoints["frontend"], timeout=10.0, **curve_options(b1, "client2")) as full,
        ):
            with pytest.raises(Forbidden) as info:
                limited.request("secret.a", b"first")  # its first request: the key was known
            assert info.value.status == 403
            for i in range(50):  # many batches: the key stays the connection's
                assert limited.request("echo", b"%d" % i) == [b"w1", b"%d" % i]
                assert full.request("secret.a", b"%d" % i) == [b"w1", b"%d" % i]
        refused = [e for e in events(b1, "request_refused") if e["key"] == public["client"]]
        assert [e["service"] for e in refused] == ["secret.a"]
        ready = [e for e in events(b1, "worker_ready") if "secret.a" in e["services"]]
        assert len(ready) == 1, ready  # only the granted worker ever registered it
        assert b1.stop() == 0


def _answers(client: Client, service: str) -> bool:
    try:
        return client.request(service, b"?", timeout=2.0)[-1] == b"?"
    except Exception:
        return False


def test_a_rotated_key_works_across_the_overlap_and_is_refused_after(tmp_path: Path) -> None:
    public = keys(tmp_path, "client", "client2", "worker")
    grants = {"clients": [{"key": public["client"]}]}  # v1: the old key only
    with (
        running_brokers(tmp_path, 1, curve=True, **FAST, **_grants(grants)) as (b1,),
        worker(b1, {"echo": served_by("w")}) as handle,
    ):
        assert handle.wait_registered(WAIT_S)
        old = Client(b1.endpoints["frontend"], timeout=5.0, **curve_options(b1, "client"))
        new_options = curve_options(b1, "client2")
        with old:
            assert old.request("echo", b"v1") == [b"w", b"v1"]
            with (
                pytest.raises(RequestTimeout),
                Client(b1.endpoints["frontend"], timeout=2.0, **new_options) as early,
            ):
                early.connect(timeout=2.0)  # the new key is not granted yet

            # v2: the new key, and the old one until the end of the overlap.
            overlap_s = 20  # generous: a loaded machine takes seconds per step
            until = int(time.time()) + overlap_s
            tree = yaml.safe_load(b1.network_file.read_text())
            tree["config_version"] = 2
            tree["clients"] = [
                {"key": public["client"], "until": until},
                {"key": public["client2"]},
            ]
            b1.network_file.write_text(yaml.safe_dump(tree))
            os.kill(b1.pid, signal.SIGHUP)
            wait_until(
                lambda: any(e.get("version") == 2 for e in events(b1, "config_applied")),
                what="v2 applied",
            )
            with Client(b1.endpoints["frontend"], timeout=5.0, **new_options) as new:
                # Within the overlap both keys work, on one connection and on new ones.
                assert new.request("echo", b"new") == [b"w", b"new"]
                assert old.request("echo", b"old") == [b"w", b"old"]
                with Client(
                    b1.endpoints["frontend"], timeout=5.0, **curve_options(b1, "client")
                ) as again:
                    assert again.request("echo", b"old2") == [b"w", b"old2"]
                assert time.time() < until, "the machine was too slow for the overlap"

                # After it (and the next sweep): the old key's connections are refused
                # with 403 (a session still open, or one opening again: the key is
                # logged), a new connection with it is refused by ZAP.
                wait_until(
                    lambda: time.time() > until + 1.5,
                    timeout=overlap_s + WAIT_S,
                    what="the end of the overlap",
                )
                with pytest.raises((BrokerRefused, RequestTimeout, Forbidden)):
                    old.request("echo", b"late", timeout=2.0)
                wait_until(
                    lambda: any(
                        e.get("key") == public["client"] for e in events(b1, "key_refused")
                    ),
                    what="the old key's refusal logged",
                )
                with (
                    pytest.raises(RequestTimeout),
                    Client(
                        b1.endpoints["frontend"], timeout=2.0, **curve_options(b1, "client")
                    ) as late,
                ):
                    late.connect(timeout=2.0)
                assert any(
                    e.get("key") == public["client"] and e.get("domain") == "frontend"
                    for e in events(b1, "curve_refused")
                )
                assert new.request("echo", b"after") == [b"w", b"after"]


def test_scale0_worker_takes_its_key_pair_and_the_seeds_key(tmp_path: Path) -> None:
    executable = shutil.which("scale0-worker")
    assert executable is not None
    bad = subprocess.run(
        [executable, "tcp://127.0.0.1:1", "scale0.net.worker:echo_handler", "--server-key", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "--server-key needs --curve-key" in bad.stderr
    with running_brokers(tmp_path, 1, curve=True, **FAST) as (b1,):
        args = curve_worker_args(b1)
        broken = subprocess.run(
            [
                executable,
                b1.endpoints["backend"],
                "scale0.net.worker:echo_handler",
                *args[:2],
                "--server-key",
                "short",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert broken.returncode == 2 and "40 Z85 characters" in broken.stderr
        process = subprocess.Popen(
            [
                executable,
                b1.endpoints["backend"],
                "scale0.net.worker:echo_handler",
                "--service",
                "echo",
                "--heartbeat-interval",
                "0.2",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with Client(b1.endpoints["frontend"], timeout=10.0, **curve_options(b1)) as client:
                wait_until(lambda: _answers(client, "echo"), what="the CURVE worker serves")
        finally:
            process.terminate()
            process.wait(WAIT_S)
