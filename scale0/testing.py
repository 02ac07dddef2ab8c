"""Throwaway brokers for tests and benchmarks: the installed ``scale0-broker`` as a real process.

For your own test suites as much as ours (no mocks: a real broker on loopback, ports chosen by
the OS, stopped by PID however the test ends)::

    from scale0.testing import running_broker

    def test_something(tmp_path):
        with running_broker(tmp_path, request_timeout_ms=2000) as broker:
            broker.endpoints["frontend"]   # "tcp://127.0.0.1:PORT" (bound with port 0)
            broker.endpoints["backend"]
            broker.network                 # the NetworkConfig it serves
            broker.pid, broker.rss_kb(), broker.logs()

Keyword arguments are NetworkConfig overrides (``error_threshold=5``...); ``broker_overrides``
changes the broker's own file. On exit the process gets SIGTERM, then SIGKILL after a bound;
``broker.stop()`` does the same early and returns the exit code. Everything goes in
``tmp_path``: keys/, broker.yaml, network.yaml, endpoints.json, broker.stderr (JSON log lines).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scale0.config.loader import dumps
from scale0.config.model import (
    Admin,
    BrokerConfig,
    BrokerEntry,
    ManagementSettings,
    NetworkConfig,
)
from scale0.crypto.keys import generate_keypair
from scale0.crypto.passwords import hash_password

__all__ = [
    "FAMILY_ADMINS",
    "BrokerProcess",
    "Family",
    "FamilyMember",
    "broker_command",
    "family_loopback_ports",
    "running_broker",
    "running_family",
    "start_family_member",
    "write_configs",
    "write_family_configs",
]

#: How long start-up may take before the helper gives up (the process is then killed).
START_TIMEOUT_S = 15.0
#: How long SIGTERM may take before SIGKILL.
STOP_TIMEOUT_S = 10.0

IDENTITY = "solo"


def broker_command() -> str:
    """Path of the installed console script (``pip install -e .`` puts it on PATH)."""
    path = shutil.which("scale0-broker")
    if path is None:
        raise RuntimeError("scale0-broker is not installed: pip install -e /work/main")
    return path


def write_configs(
    directory: Path,
    *,
    broker_overrides: Mapping[str, Any] | None = None,
    **network_overrides: Any,
) -> tuple[Path, Path, NetworkConfig]:
    """Write keys/, broker.yaml (all ports 0) and network.yaml into ``directory``.

    Returns ``(broker_file, network_file, network)``. Paths inside broker.yaml are relative,
    as an operator would write them.
    """
    keys = directory / "keys"
    keys.mkdir(exist_ok=True)
    if not (keys / "signing.key").exists():
        generate_keypair(keys)
    # The entry's endpoints are what clients are told; with port 0 nobody knows the real ports
    # before the broker binds, so these are placeholders (nothing connects to them in tests).
    entry = BrokerEntry(
        identity=IDENTITY,
        frontend="tcp://127.0.0.1:15555",
        backend="tcp://127.0.0.1:15556",
        peer="tcp://127.0.0.1:15557",
        config_pub="tcp://127.0.0.1:15558",
        config_source=True,
    )
    network = NetworkConfig(
        family="test", config_version=1, brokers=(entry,), **dict(network_overrides)
    )
    broker = BrokerConfig(
        identity=IDENTITY,
        bind_address="127.0.0.1",
        frontend_port=0,
        backend_port=0,
        peer_port=0,
        config_pub_port=0,
        state="active",
        config_source=True,
        network_config="network.yaml",
        signing_key="keys/signing.key",
        trusted_keys=("keys/signing.pub",),
        data_dir="data",
        event_log_dir="events",
        log_level="info",
    )
    if broker_overrides:
        broker = dataclasses.replace(broker, **dict(broker_overrides))
    network_file = directory / "network.yaml"
    broker_file = directory / "broker.yaml"
    network_file.write_bytes(dumps(network, "yaml"))
    broker_file.write_bytes(dumps(broker, "yaml"))
    return broker_file, network_file, network


@dataclass
class BrokerProcess:
    """A running ``scale0-broker``; ``endpoints`` maps "frontend"/"backend" to tcp endpoints."""

    process: subprocess.Popen[bytes]
    endpoints: dict[str, str]
    broker_file: Path
    network_file: Path
    network: NetworkConfig
    stderr_path: Path
    returncode: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_kb(self) -> int:
        """Resident set size of the broker (VmRSS from /proc), in kB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS line")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def logs(self) -> list[dict[str, Any]]:
        """The broker's JSON log lines so far (non-JSON lines are skipped)."""
        lines = []
        for line in self.stderr().splitlines():
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    lines.append(value)
        return lines

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit code."""
        if self.returncode is None:
            self.returncode = _terminate(self.process, timeout_s)
        return self.returncode


def _terminate(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout_s)
    return process.returncode


def wait_for_endpoints(
    process: subprocess.Popen[bytes], path: Path, stderr_path: Path, timeout_s: float
) -> dict[str, str]:
    """Poll for the endpoints file; raise (with the broker's stderr) on exit or timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return dict(json.loads(path.read_text()))  # written atomically: complete or absent
        if process.poll() is not None:
            raise RuntimeError(
                f"scale0-broker exited with {process.returncode} before binding:\n"
                + stderr_path.read_text(errors="replace")
            )
        time.sleep(0.02)
    raise TimeoutError(
        f"scale0-broker wrote no {path.name} within {timeout_s} s:\n"
        + stderr_path.read_text(errors="replace")
    )


@contextlib.contextmanager
def running_broker(
    tmp_path: Path,
    *,
    broker_overrides: Mapping[str, Any] | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    **network_overrides: Any,
) -> Iterator[BrokerProcess]:
    """Start ``scale0-broker`` on ports 0 in ``tmp_path``; stop it (by PID) on exit."""
    broker_file, network_file, network = write_configs(
        tmp_path, broker_overrides=broker_overrides, **network_overrides
    )
    endpoints_file = tmp_path / "endpoints.json"
    endpoints_file.unlink(missing_ok=True)
    stderr_path = tmp_path / "broker.stderr"
    # stderr to a file, not a pipe: a chatty broker must never block on a full pipe.
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(  # noqa: S603 - our own installed script, fixed arguments
            [
                broker_command(),
                "--config",
                str(broker_file),
                "--endpoints-file",
                str(endpoints_file),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        endpoints = wait_for_endpoints(process, endpoints_file, stderr_path, start_timeout_s)
        broker = BrokerProcess(process, endpoints, broker_file, network_file, network, stderr_path)
        yield broker
    finally:
        _terminate(process, STOP_TIMEOUT_S)


# ---- a family of brokers (management tests) ----------------------------------------------------

#: Admins of every family ``running_family`` starts: auth_id -> (password, role).
FAMILY_ADMINS: dict[str, tuple[str, str]] = {
    "admin": ("admin-secret", "admin"),
    "viewer": ("viewer-secret", "read"),
}


def family_loopback_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1, found by binding port 0.

    The network config must name every broker's real endpoints before any broker starts, so
    the ports are chosen up front; a port taken in between makes that broker fail to start
    (with its stderr in the error), never a silent mix-up.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class FamilyMember:
    """One broker of a :class:`Family`: its process, directory and endpoints."""

    identity: str
    directory: Path
    broker_file: Path
    process: subprocess.Popen[bytes] | None = None
    endpoints: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None

    @property
    def frontend(self) -> str:
        return self.endpoints["frontend"]

    @property
    def management(self) -> str:
        """The base URL of its HTTP management server."""
        return self.endpoints["management"]

    @property
    def stderr_path(self) -> Path:
        return self.directory / "broker.stderr"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (then SIGKILL) this broker; returns its exit code."""
        if self.process is not None and self.returncode is None:
            self.returncode = _terminate(self.process, timeout_s)
        return self.returncode if self.returncode is not None else 0


@dataclass
class Family:
    """Brokers sharing one network config whose ``brokers`` list their real endpoints."""

    members: list[FamilyMember]
    network: NetworkConfig
    admins: dict[str, tuple[str, str]]

    def __getitem__(self, identity: str) -> FamilyMember:
        return next(m for m in self.members if m.identity == identity)


def write_family_configs(
    directory: Path,
    size: int = 3,
    *,
    management: bool = True,
    admins: Mapping[str, tuple[str, str]] = FAMILY_ADMINS,
    **network_overrides: Any,
) -> Family:
    """Write keys/ and, per broker ``b1``..``bN``, a directory with broker.yaml + network.yaml.

    Every broker is a config source (so each starts on its own today) and they all serve the
    same network config, whose ``brokers`` list the real loopback ports chosen here. The HTTP
    management server, when on, binds 127.0.0.1 port 0 (its URL is in the endpoints file).
    """
    keys = directory / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    if not (keys / "signing.key").exists():
        generate_keypair(keys)
    ports = family_loopback_ports(4 * size)
    entries = []
    for index in range(size):
        frontend, backend, peer, pub = ports[4 * index : 4 * index + 4]
        entries.append(
            BrokerEntry(
                identity=f"b{index + 1}",
                frontend=f"tcp://127.0.0.1:{frontend}",
                backend=f"tcp://127.0.0.1:{backend}",
                peer=f"tcp://127.0.0.1:{peer}",
                config_pub=f"tcp://127.0.0.1:{pub}",
                config_source=True,
            )
        )
    admin_entries = tuple(
        Admin(auth_id, hash_password(password), role)  # type: ignore[arg-type]
        for auth_id, (password, role) in admins.items()
    )
    network = NetworkConfig(
        family="test",
        config_version=1,
        brokers=tuple(entries),
        admins=admin_entries,
        **dict(network_overrides),
    )
    members = []
    for index, entry in enumerate(entries):
        home = directory / entry.identity
        home.mkdir(exist_ok=True)
        frontend, backend, peer, pub = ports[4 * index : 4 * index + 4]
        broker = BrokerConfig(
            identity=entry.identity,
            bind_address="127.0.0.1",
            frontend_port=frontend,
            backend_port=backend,
            peer_port=peer,
            config_pub_port=pub,
            state="active",
            config_source=True,
            network_config="network.yaml",
            signing_key="../keys/signing.key",
            trusted_keys=("../keys/signing.pub",),
            management=ManagementSettings(
                enabled=management, http_address="127.0.0.1", http_port=0
            ),
        )
        (home / "network.yaml").write_bytes(dumps(network, "yaml"))
        (home / "broker.yaml").write_bytes(dumps(broker, "yaml"))
        members.append(FamilyMember(entry.identity, home, home / "broker.yaml"))
    return Family(members, network, dict(admins))


def start_family_member(member: FamilyMember, timeout_s: float = START_TIMEOUT_S) -> None:
    """Start (or restart) one member's ``scale0-broker`` and wait for its endpoints."""
    endpoints_file = member.directory / "endpoints.json"
    endpoints_file.unlink(missing_ok=True)
    with member.stderr_path.open("ab") as stderr:
        member.process = subprocess.Popen(  # noqa: S603 - our own installed script
            [
                broker_command(),
                "--config",
                str(member.broker_file),
                "--endpoints-file",
                str(endpoints_file),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    member.returncode = None
    member.endpoints = wait_for_endpoints(
        member.process, endpoints_file, member.stderr_path, timeout_s
    )


@contextlib.contextmanager
def running_family(
    tmp_path: Path,
    size: int = 3,
    *,
    management: bool = True,
    admins: Mapping[str, tuple[str, str]] = FAMILY_ADMINS,
    **network_overrides: Any,
) -> Iterator[Family]:
    """Start ``size`` brokers ``b1``.. as real processes; stop every one (by PID) on exit."""
    family = write_family_configs(
        tmp_path, size, management=management, admins=admins, **network_overrides
    )
    try:
        for member in family.members:
            start_family_member(member)
        yield family
    finally:
        for member in family.members:
            member.stop()
