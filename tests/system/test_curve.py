"""CURVE and authorization by key on real ``scale0-broker`` processes (issue 15 items 1-2).

Each test starts brokers whose sockets serve CURVE (``running_brokers(..., curve=True)``),
clients and workers with key pairs of their own (``keys/client.curve.key``...), and checks what
a key that is missing, wrong, not granted or past its grant gets, and that everyone else is
still served. Waits are bounded; what a broker did is read from its JSON log lines.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scale0.config.model import KeyGrant
from scale0.crypto.curve import generate_curve_keypair, load_curve_secret_key
from scale0.net.client import Client
from scale0.net.worker import Worker, echo_handler
from scale0.session.errors import RequestTimeout
from scale0.testing import (
    BrokerProcess,
    _spawn_broker,
    curve_options,
    running_brokers,
    wait_for_endpoints,
    write_family_configs,
)

pytestmark = pytest.mark.system

WAIT_S = 20.0
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}


def wait_until(condition: Callable[[], bool], timeout: float = WAIT_S, what: str = "") -> None:
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


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
