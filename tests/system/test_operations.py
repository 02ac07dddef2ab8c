"""docs/operations.md's procedures, scripted against real ``scale0-broker`` processes.

Each test follows one procedure as an operator would (edit files, run ``scale0ctl``, restart a
broker by PID) on a family of three brokers on loopback: b1 and b2 are config sources, b3 joins
from a seed. What the brokers did is read back with ``scale0ctl --json`` and from their JSON
logs. Every wait is bounded and every process is stopped by PID (scale0.testing).
"""

from __future__ import annotations

import contextlib
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

from scale0.crypto.keys import generate_keypair
from scale0.testing import (
    FAMILY_ADMINS,
    Family,
    FamilyMember,
    pick_free_ports,
    running_family,
    start_family_member,
    wait_until,
    write_family_configs,
)
from tests.system.ctl import RUN_TIMEOUT_S, edit_yaml, logged, restart
from tests.system.ctl import ctl_json as ctl

pytestmark = pytest.mark.system

FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}


@contextlib.contextmanager
def operated_family(tmp_path: Path, **network: Any) -> Iterator[Family]:
    """b1, b2 (config sources) and b3 (joins from b1), each restartable by itself."""
    with running_family(
        tmp_path, 3, management=False, sources=(0, 1), **{**FAST, **network}
    ) as family:
        yield family


def states(family: Family, broker: str = "b1") -> dict[str, tuple[str, int]]:
    """Each broker's (state, config_version), asked through ``broker`` (--family)."""
    code, document = ctl(family, "status", "--family", "--timeout", "3", broker=broker)
    if code not in (0, 3):
        return {}
    return {
        entry["broker"]: (entry["result"]["state"], entry["result"]["config_version"])
        for entry in document["result"]["brokers"]
        if entry.get("result")
    }


def everyone(family: Family, version: int) -> Callable[[], bool]:
    wanted = {member.identity: ("active", version) for member in family.members}
    return lambda: states(family) == wanted


def test_rotating_the_signing_key_as_operations_md_says(tmp_path: Path) -> None:
    """docs/operations.md "Rotating the signing key", step by step, with three brokers."""
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        network_file = tmp_path / "network.yaml"

        # 1. A new pair; its public key added to every broker's trusted_keys, one restart each.
        new_keys = tmp_path / "keys-new"
        new_keys.mkdir()
        generate_keypair(new_keys)
        for member in family.members:
            edit_yaml(
                member.broker_file,
                trusted_keys=["../keys/signing.pub", "../keys-new/signing.pub"],
            )
            restart(member)
            wait_until(everyone(family, 1), f"{member.identity} back after its restart")

        # 2. The config sources get the new private key; a higher version; reload on one.
        for source in ("b1", "b2"):
            edit_yaml(family[source].broker_file, signing_key="../keys-new/signing.key")
        edit_yaml(network_file, config_version=2)
        code, document = ctl(family, "reload-config", broker="b1")
        assert code == 0, document
        assert document["result"]["applied"] is True
        assert document["result"]["config_version"] == 2
        wait_until(everyone(family, 2), "v2 everywhere")

        # 3. The old public key removed everywhere, one restart at a time: each broker comes
        #    back active on v2, which only the new key signed. The joining broker first: the
        #    sources have not restarted, so what they hand out must already carry the new key.
        for member in reversed(family.members):
            edit_yaml(member.broker_file, trusted_keys=["../keys-new/signing.pub"])
            restart(member)
            wait_until(everyone(family, 2), f"{member.identity} active on v2, new key only")

        # And the next change, signed with the new key, reaches the whole family.
        edit_yaml(network_file, config_version=3)
        code, document = ctl(family, "reload-config", broker="b2")
        assert code == 0 and document["result"]["applied"] is True, document
        wait_until(everyone(family, 3), "v3 everywhere")


def test_reload_says_what_in_the_broker_file_needs_a_restart(tmp_path: Path) -> None:
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        b1 = family["b1"]
        edit_yaml(b1.broker_file, log_level="debug")
        edit_yaml(tmp_path / "network.yaml", config_version=2)
        code, document = ctl(family, "reload-config", broker="b1")
        assert code == 0 and document["result"]["applied"] is True, document
        (line,) = logged(b1, "broker_file_needs_restart")
        assert line["settings"] == ["log_level"]


def test_a_config_source_whose_ports_differ_from_its_entry_refuses_to_start(
    tmp_path: Path,
) -> None:
    """issue 11 #7: it would hand clients and workers endpoints nobody listens on."""
    broker_files, _network_file, network = write_family_configs(tmp_path, 2, sources=(0,))
    edit_yaml(broker_files[0], backend_port=1)
    path = shutil.which("scale0-broker")
    assert path is not None
    done = subprocess.run(
        [path, "--config", str(broker_files[0])],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    entry = network.brokers[0].backend
    assert "backend_port is 1" in done.stderr
    assert f"brokers[b1].backend in the network config is {entry}" in done.stderr


def test_restarting_a_config_source_with_the_same_file_is_no_conflict(tmp_path: Path) -> None:
    """issue 11 #6: the same document is not a conflict, whoever signed it and whenever."""
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        edit_yaml(tmp_path / "network.yaml", config_version=2)
        code, document = ctl(family, "reload-config", broker="b1")
        assert code == 0 and document["result"]["applied"] is True, document
        wait_until(everyone(family, 2), "v2 everywhere")
        for name in ("b1", "b2", "b1"):
            restart(family[name])
            wait_until(everyone(family, 2), f"{name} back on v2")
        time.sleep(1.0)  # a heartbeat or two: peers compare configs after a restart
        for member in family.members:
            assert logged(member, "config_conflict") == [], member.identity
        code, document = ctl(family, "peers", broker="b3")
        assert code == 0 and document["result"]["conflicts"] == [], document


def test_changing_the_config_reaches_every_broker(tmp_path: Path) -> None:
    """docs/operations.md "Changing the config": edit, raise the version, reload or SIGHUP."""
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        network_file = tmp_path / "network.yaml"
        edit_yaml(network_file, config_version=2, request_timeout_ms=7000)
        code, document = ctl(family, "reload-config", broker="b2")
        assert code == 0, document
        assert set(document["result"]["changed"]) == {"config_version", "request_timeout_ms"}
        wait_until(everyone(family, 2), "v2 everywhere")
        edit_yaml(network_file, config_version=3)
        assert family["b1"].process is not None
        os.kill(family["b1"].process.pid, signal.SIGHUP)
        wait_until(everyone(family, 3), "v3 everywhere after SIGHUP")
        code, document = ctl(family, "config", "get", broker="b3")
        assert document["result"]["config"]["request_timeout_ms"] == 7000


def test_adding_a_broker(tmp_path: Path) -> None:
    """docs/operations.md "Adding a broker": its entry first, then it starts from a seed."""
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        network_file = tmp_path / "network.yaml"
        front, back, peer, config_pub = pick_free_ports(4)
        tree = yaml.safe_load(network_file.read_text())
        tree["brokers"].append(
            {
                "identity": "b4",
                "frontend": f"tcp://127.0.0.1:{front}",
                "backend": f"tcp://127.0.0.1:{back}",
                "peer": f"tcp://127.0.0.1:{peer}",
                "config_pub": f"tcp://127.0.0.1:{config_pub}",
            }
        )
        tree["config_version"] = 2
        network_file.write_text(yaml.safe_dump(tree))
        code, document = ctl(family, "reload-config", broker="b1")
        assert code == 0 and document["result"]["applied"] is True, document

        home = tmp_path / "b4"
        home.mkdir()
        broker = yaml.safe_load(family["b3"].broker_file.read_text())
        broker.update(
            identity="b4",
            frontend_port=front,
            backend_port=back,
            peer_port=peer,
            config_pub_port=config_pub,
        )
        (home / "broker.yaml").write_text(yaml.safe_dump(broker))
        b4 = FamilyMember("b4", home, home / "broker.yaml")
        family.members.append(b4)  # stopped with the others
        start_family_member(b4)
        wait_until(everyone(family, 2), "b4 joined, v2 everywhere")

        def linked_to_all() -> bool:
            code, document = ctl(family, "peers", broker="b4")
            peers = document.get("result", {}).get("peers", []) if code == 0 else []
            return {p["broker_id"] for p in peers if p["linked"]} == {"b1", "b2", "b3"}

        wait_until(linked_to_all, "b4 linked to b1, b2 and b3")


def test_removing_a_broker(tmp_path: Path) -> None:
    """docs/operations.md "Removing a broker": disable, drop its entry, reload, stop it."""
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        code, document = ctl(family, "disable", "--target", "b3", broker="b1")
        assert code == 0 and document["result"]["state"] == "disabled", document
        network_file = tmp_path / "network.yaml"
        tree = yaml.safe_load(network_file.read_text())
        tree["brokers"] = [b for b in tree["brokers"] if b["identity"] != "b3"]
        tree["config_version"] = 2
        network_file.write_text(yaml.safe_dump(tree))
        code, document = ctl(family, "reload-config", broker="b1")
        assert code == 0 and document["result"]["applied"] is True, document
        for name in ("b1", "b2"):
            wait_until(
                lambda name=name: any(  # type: ignore[misc]
                    e.get("peer") == "b3" for e in logged(family[name], "peer_removed")
                ),
                f"{name} closed its link to b3",
            )
        wait_until(lambda: bool(logged(family["b3"], "not_a_member")), "b3 knows it was removed")
        assert family["b3"].stop() == 0
        family.members.remove(family["b3"])
        wait_until(everyone(family, 2), "b1 and b2 run v2")


def test_a_joining_broker_whose_ports_differ_from_its_entry_says_so(tmp_path: Path) -> None:
    """issue 11 #7 for a broker that gets its config from the family: a loud log line."""
    (other,) = pick_free_ports(1)
    broker_files, _network_file, network = write_family_configs(
        tmp_path, 3, sources=(0, 1), broker_overrides=[{}, {}, {"frontend_port": other}], **FAST
    )
    family = Family(
        [FamilyMember(path.parent.name, path.parent, path) for path in broker_files],
        network,
        dict(FAMILY_ADMINS),
    )
    try:
        for member in family.members:
            start_family_member(member)
        b3 = family["b3"]
        wait_until(lambda: bool(logged(b3, "own_endpoint_mismatch")), "b3 logs the mismatch")
        (line,) = logged(b3, "own_endpoint_mismatch")
        assert line["level"] == "error"
        entry = network.brokers[2].frontend
        assert line["problems"] == [
            f"frontend_port is {other}, but brokers[b3].frontend in config v1 is {entry}"
        ]
    finally:
        for member in family.members:
            member.stop()


def test_turning_the_lane_on_and_off_as_operations_md_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/operations.md "The lane": ``lane: true`` / ``false`` in one broker's file and a
    restart; broker_ready says it is off, then runs again, and the family is managed through
    it (MANAGEMENTREQ crosses the lane)."""
    monkeypatch.delenv("SCALE0_LANE", raising=False)  # the file decides here
    with operated_family(tmp_path) as family:
        wait_until(everyone(family, 1), "the family runs v1")
        b1 = family["b1"]
        for lane, said in ((False, "off"), (True, "c")):  # (on by default: off first)
            edit_yaml(b1.broker_file, lane=lane)
            restart(b1)
            wait_until(everyone(family, 1), f"b1 back with lane: {lane}")
            assert logged(b1, "broker_ready")[-1]["lane"] == said
