"""docs/operations.md "Turning CURVE on, broker by broker", scripted as written.

A family of three real ``scale0-broker`` processes (b1, b2 config sources, b3 joining from b1)
runs without CURVE with a client and a worker busy; the test follows the procedure's steps (key
pairs, files, config versions, reloads, restarts by PID) and checks after each that the family
still answers, and at the end that every socket serves CURVE: a client without a key pair
cannot connect any more, and ``curve: true`` with grants holds. Waits are bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scale0.crypto.curve import generate_curve_keypair, load_curve_secret_key
from scale0.net.client import Client
from scale0.net.worker import Worker
from scale0.session.errors import RequestTimeout
from scale0.testing import Family, running_family, start_family_member, wait_until
from tests.system.ctl import RUN_TIMEOUT_S, WAIT_S, edit_yaml, logged, restart

pytestmark = pytest.mark.system

FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}


def ctl(family: Family, keys: Path, *args: str, broker: str = "b1") -> tuple[int, dict[str, Any]]:
    """``scale0ctl ARGS --json`` as the admin, with CURVE when ``broker`` serves it."""
    path = shutil.which("scale0ctl")
    assert path is not None
    password, _ = family.admins["admin"]
    env = {
        **os.environ,
        "SCALE0_AUTH_ID": "admin",
        "SCALE0_AUTH_PASSWORD": password,
        "SCALE0_BROKER": family[broker].frontend,
    }
    tree = yaml.safe_load((keys.parent / "network.yaml").read_text())
    entry = next(e for e in tree["brokers"] if e["identity"] == broker)
    if entry.get("curve_public_key") and not entry.get("curve_off"):
        env["SCALE0_CURVE_KEY"] = str(keys / "client.curve.key")
        env["SCALE0_SERVER_KEY"] = entry["curve_public_key"]
    done = subprocess.run(
        [path, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=env,
        check=False,
    )
    document = json.loads(done.stdout)
    assert isinstance(document, dict), done.stdout
    return done.returncode, document


#: What the last status check saw (shown when a wait fails).
LAST: dict[str, Any] = {}


def everyone_on(family: Family, keys: Path, version: int) -> bool:
    code, document = ctl(family, keys, "status", "--family", "--timeout", "3")
    LAST["status"] = (code, document)
    if code != 0:
        return False
    found = {
        entry["broker"]: (entry["result"]["state"], entry["result"]["config_version"])
        for entry in document["result"]["brokers"]
        if entry.get("result")
    }
    return found == {m.identity: ("active", version) for m in family.members}


def answers(client: Client, body: bytes) -> bool:
    try:
        return client.request("echo", body, timeout=3.0) == [body]
    except Exception:
        return False


@contextlib.contextmanager
def busy_worker(endpoint: str, keys: Path) -> Iterator[None]:
    """A worker with its own key pair at b2 (no server key: its seed serves no CURVE yet)."""
    thread = Worker(
        endpoint,
        {"echo": lambda body: body},
        heartbeat_interval=0.2,
        curve=load_curve_secret_key(keys / "worker.curve.key"),
    ).start_in_thread()
    try:
        assert thread.wait_registered(WAIT_S)
        yield
    finally:
        thread.stop()


def test_turning_curve_on_broker_by_broker_as_operations_md_says(tmp_path: Path) -> None:
    with running_family(tmp_path, 3, management=False, sources=(0, 1), **FAST) as family:
        keys = tmp_path / "keys"
        network_file = tmp_path / "network.yaml"
        version = 1
        wait_until(lambda: everyone_on(family, keys, 1), "the family runs v1")

        # 1. Key pairs; every broker's own in its file; one restart at a time.
        public = {
            name: generate_curve_keypair(keys, name)[2].public
            for name in ("b1", "b2", "b3", "client", "worker")
        }
        for member in family.members:
            edit_yaml(member.broker_file, curve_secret_key=f"../keys/{member.identity}.curve.key")
            restart(member)
            wait_until(lambda: everyone_on(family, keys, 1), f"{member.identity} back")

        # 2. Every broker's key in its entry, with curve_off: nothing changes on the wire.
        tree = yaml.safe_load(network_file.read_text())
        for entry in tree["brokers"]:
            entry.update(curve_public_key=public[entry["identity"]], curve_off=True)
        version += 1
        tree["config_version"] = version
        network_file.write_text(yaml.safe_dump(tree))
        code, document = ctl(family, keys, "reload-config", broker="b1")
        assert code == 0 and document["result"]["applied"] is True, document
        wait_until(lambda v=version: everyone_on(family, keys, v), "the keys everywhere")

        # 3. Clients and workers get their key pairs (no server key: nothing serves CURVE yet).
        with (
            busy_worker(family["b2"].endpoints["backend"], keys),
            Client(
                family["b1"].frontend,
                timeout=10.0,
                heartbeat_interval=0.2,
                curve=load_curve_secret_key(keys / "client.curve.key"),
            ) as client,
        ):
            wait_until(lambda: answers(client, b"before"), "the client answered before")

            # 4. Broker by broker: curve_off removed, a higher version, a reload, a restart.
            for member in family.members:
                tree = yaml.safe_load(network_file.read_text())
                for entry in tree["brokers"]:
                    if entry["identity"] == member.identity:
                        del entry["curve_off"]
                version += 1
                tree["config_version"] = version
                network_file.write_text(yaml.safe_dump(tree))
                source = "b2" if member.identity == "b1" else "b1"
                code, document = ctl(family, keys, "reload-config", broker=source)
                assert code == 0 and document["result"]["applied"] is True, document
                wait_until(
                    lambda m=member: bool(logged(m, "curve_needs_restart")),
                    f"{member.identity} says it needs a restart",
                )
                restart(member)
                try:
                    wait_until(
                        lambda v=version: everyone_on(family, keys, v), f"{member.identity} back"
                    )
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; the last status: {LAST}") from None
                assert logged(member, "broker_ready")
                wait_until(lambda: answers(client, b"during"), f"answers after {member.identity}")

            # 5. curve: true, grants for the client and worker keys, the seed's key for b3.
            tree = yaml.safe_load(network_file.read_text())
            version += 1
            tree.update(
                config_version=version,
                curve=True,
                clients=[{"key": public["client"]}],
                workers=[{"key": public["worker"]}],
            )
            network_file.write_text(yaml.safe_dump(tree))
            code, document = ctl(family, keys, "reload-config", broker="b1")
            assert code == 0 and document["result"]["applied"] is True, document
            edit_yaml(family["b3"].broker_file, seed_curve_keys=[public["b1"]])
            wait_until(lambda: everyone_on(family, keys, version), "curve: true everywhere")
            wait_until(lambda: answers(client, b"after"), "answers with CURVE everywhere")

        # Every socket serves CURVE now: without a key pair nobody gets in, anywhere.
        for member in family.members:
            with (
                pytest.raises(RequestTimeout),
                Client(member.frontend, timeout=2.0) as plain,
            ):
                plain.connect(timeout=2.0)
        # And the joining broker joins again from its seed alone, without its saved config.
        b3 = family["b3"]
        assert b3.stop() == 0
        shutil.rmtree(b3.directory / "data")
        start_family_member(b3)
        wait_until(lambda: everyone_on(family, keys, version), "b3 joined again from its seed")
