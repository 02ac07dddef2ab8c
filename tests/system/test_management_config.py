"""scale0ctl peers, config set and reload-config against a family of real brokers.

Its own family (not shared with test_management_ctl.py): these tests move the family's config
version on, and the replicas must agree on it at every step.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scale0.crypto.keys import generate_keypair
from scale0.testing import Family, running_family, wait_until
from tests.system.ctl import RUN_TIMEOUT_S, WAIT_S, ctl_json

pytestmark = pytest.mark.system


@pytest.fixture
def family(tmp_path: Path) -> Iterator[Family]:
    with running_family(
        tmp_path, management=False, default_heartbeat_interval_ms=200, liveness=5
    ) as started:
        yield started


def versions(family: Family) -> dict[str, int]:
    code, document = ctl_json(family, "status", "--family")
    if code != 0:
        return {}
    return {
        entry["broker"]: entry["result"]["config_version"]
        for entry in document["result"]["brokers"]
        if entry.get("result")
    }


def write_version(source: Path, target: Path, version: int, **changes: Any) -> Path:
    tree = yaml.safe_load(source.read_text())
    tree.update(config_version=version, **changes)
    target.write_text(yaml.safe_dump(tree))
    return target


def sign(family: Family, path: Path, key: Path) -> None:
    path_ctl = shutil.which("scale0ctl")
    assert path_ctl is not None
    done = subprocess.run(
        [path_ctl, "config", "sign", str(path), "--key", str(key)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_peers_config_set_and_reload_config(family: Family, tmp_path: Path) -> None:
    # peers: b1 sees b2 and b3 linked and active.
    def all_linked() -> bool:
        code, document = ctl_json(family, "peers")
        peers = document.get("result", {}).get("peers", []) if code == 0 else []
        return {p["broker_id"] for p in peers if p["linked"] and p["state"] == "active"} == {
            "b2",
            "b3",
        }

    wait_until(all_linked, "b1 linked to b2 and b3")
    assert versions(family) == {"b1": 1, "b2": 1, "b3": 1}

    # config set on b2: signed v2 in YAML; every broker runs it soon after.
    network_file = tmp_path / "network.yaml"
    v2 = write_version(network_file, tmp_path / "v2.yaml", 2, request_timeout_ms=8000)
    sign(family, v2, tmp_path / "keys" / "signing.key")
    code, document = ctl_json(family, "config", "set", str(v2), broker="b2")
    assert code == 0, document
    result = document["result"]
    assert result["applied"] is True and result["config_version"] == 2
    assert result["previous_version"] == 1
    assert set(result["changed"]) == {"config_version", "request_timeout_ms"}
    assert result["restart_needed"] == []
    wait_until(lambda: versions(family) == {"b1": 2, "b2": 2, "b3": 2}, "v2 everywhere")

    # A config signed by a key nobody trusts: refused, with the reason; nothing changes.
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    generate_keypair(stranger)
    v3 = write_version(network_file, tmp_path / "v3.yaml", 3)
    sign(family, v3, stranger / "signing.key")
    code, document = ctl_json(family, "config", "set", str(v3))
    assert code == 1 and document["code"] == 400
    assert "signature" in document["errors"][0]["message"]
    assert versions(family) == {"b1": 2, "b2": 2, "b3": 2}

    # reload-config on a source: it reads its own file (edited by the operator) and signs it.
    write_version(network_file, network_file, 4, liveness=6)
    code, document = ctl_json(family, "reload-config", broker="b3")
    assert code == 0, document
    assert document["result"]["applied"] is True
    assert document["result"]["config_version"] == 4
    assert "liveness" in document["result"]["changed"]
    wait_until(lambda: versions(family) == {"b1": 4, "b2": 4, "b3": 4}, "v4 everywhere")

    # Reloading the same file again changes nothing, and says so.
    code, document = ctl_json(family, "reload-config", broker="b3")
    assert code == 0 and document["result"]["applied"] is False


def test_disable_moves_a_client_to_another_broker_and_enable_takes_it_back(
    family: Family,
) -> None:
    from scale0.net.client import Client
    from scale0.net.worker import Worker, echo_handler

    worker = Worker(family["b2"].endpoints["backend"], {"echo": echo_handler}).start_in_thread()
    try:
        assert worker.wait_registered(WAIT_S)
        with Client(family["b1"].frontend, timeout=10.0) as client:
            wait_until(lambda: _echoes(client), "b1 routes echo to b2's worker")
            assert client.endpoint == family["b1"].frontend
            code, document = ctl_json(family, "disable", "--target", "b1", broker="b2")
            assert code == 0 and document["result"]["state"] == "disabled", document
            # b1 answers 503 now: the client moves to another broker and is answered there.
            assert client.request("echo", b"after disable") == [b"after disable"]
            assert client.endpoint != family["b1"].frontend
            assert client.failovers >= 1
            code, document = ctl_json(family, "enable", "--target", "b1", broker="b2")
            assert code == 0 and document["result"]["state"] == "active", document
            code, document = ctl_json(family, "status")
            assert code == 0 and document["result"]["state"] == "active"
    finally:
        worker.stop()


def _echoes(client: Any) -> bool:
    try:
        return bool(client.request("echo", b"x", timeout=2.0) == [b"x"])
    except Exception:
        return False
