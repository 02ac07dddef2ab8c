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
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from scale0.crypto.curve import CurveKeyPair, generate_curve_keypair, load_curve_secret_key
from scale0.crypto.keys import generate_keypair
from scale0.crypto.passwords import hash_password
from scale0.wire.peer import BrokerState

__all__ = [
    "CURVE_PEERS",
    "FAMILY_ADMINS",
    "BrokerProcess",
    "Family",
    "FamilyMember",
    "PortTaken",
    "broker_command",
    "curve_options",
    "curve_worker_args",
    "pick_free_ports",
    "running_broker",
    "running_brokers",
    "running_family",
    "start_broker_process",
    "start_family_member",
    "wait_until",
    "write_configs",
    "write_family_configs",
]

#: How long start-up may take before the helper gives up (the process is then killed).
START_TIMEOUT_S = 15.0
#: How long SIGTERM may take before SIGKILL.
STOP_TIMEOUT_S = 10.0

IDENTITY = "solo"
#: How long a test waits for something a running process is to do, unless it says otherwise.
WAIT_S = 30.0


def wait_until(
    condition: Callable[[], object],
    what: str = "condition",
    timeout: float = WAIT_S,
    *,
    pause: float = 0.02,
) -> float:
    """Poll ``condition`` every ``pause`` s until it is true; return the seconds that took.

    Bounded: AssertionError naming ``what`` once ``timeout`` s have passed without it.
    """
    started = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - started
        if time.monotonic() - started >= timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(pause)


def broker_command() -> str:
    """Path of the installed console script (``pip install -e .`` puts it on PATH)."""
    path = shutil.which("scale0-broker")
    if path is None:
        raise RuntimeError(
            "scale0-broker is not on PATH: install Scale0 into the running environment "
            "(pip install scale0, or pip install -e . in a checkout)"
        )
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
        state=BrokerState.ACTIVE,
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

        # A port fixed by the overrides is the one clients must be told (scale0-broker refuses
        # a config source whose own ports differ from its entry).
        def fixed(port: int, placeholder: str) -> str:
            return f"tcp://127.0.0.1:{port}" if port else placeholder

        entry = dataclasses.replace(
            entry,
            frontend=fixed(broker.frontend_port, entry.frontend),
            backend=fixed(broker.backend_port, entry.backend),
            peer=fixed(broker.peer_port, entry.peer),
            config_pub=fixed(broker.config_pub_port, entry.config_pub),
        )
        network = dataclasses.replace(network, brokers=(entry,))
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
    command: Sequence[str] | None = None,
    **network_overrides: Any,
) -> Iterator[BrokerProcess]:
    """Start ``scale0-broker`` on ports 0 in ``tmp_path``; stop it (by PID) on exit.

    ``command`` replaces the installed script (e.g. a broker run from another source tree, so
    tools/bench can time two versions in one invocation); ``--config`` etc. are appended.
    """
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
                *(command if command is not None else [broker_command()]),
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


# ---- a family of brokers: several processes sharing one network config -----------------------

#: Identities of the brokers running_brokers starts: b1, b2, ...
FAMILY_IDENTITY = "b{}"
#: Tries with fresh ports when a port picked free was taken before the broker bound it.
FAMILY_START_ATTEMPTS = 3
#: The four endpoints of a broker entry, in the order their ports are picked.
_CHANNELS = ("frontend", "backend", "peer", "config_pub")


class PortTaken(RuntimeError):
    """A broker could not bind a port picked free for it (someone took it meanwhile)."""


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now.

    Each is found by binding port 0; all are held until every one is found (so they differ),
    then released. Another process may take one before our broker binds it:
    :func:`running_brokers` notices (the broker exits, saying the port is in use) and tries
    again with fresh ports.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


#: Admins of every family these helpers write: auth_id -> (password, role).
FAMILY_ADMINS: dict[str, tuple[str, str]] = {
    "admin": ("admin-secret", "admin"),
    "viewer": ("viewer-secret", "read"),
}


def write_family_configs(
    directory: Path,
    count: int,
    *,
    sources: Sequence[int] | None = None,
    extra_config_subs: Sequence[str] = (),
    states: Sequence[BrokerState | str] | None = None,
    broker_overrides: Sequence[Mapping[str, Any]] | None = None,
    management: bool = False,
    management_overrides: Sequence[Mapping[str, Any]] | None = None,
    admins: Mapping[str, tuple[str, str]] = FAMILY_ADMINS,
    hosts: Sequence[str] | None = None,
    curve: bool = False,
    **network_overrides: Any,
) -> tuple[list[Path], Path, NetworkConfig]:
    """Write one network config naming ``count`` brokers on free ports, and each broker's file.

    Layout: ``directory/keys/`` (one signing key pair), ``directory/network.yaml`` (the shared
    network config: every broker entry with its real loopback endpoints) and
    ``directory/b1/broker.yaml``... (paths relative, as an operator writes them).
    ``sources`` lists the indexes of the config sources (default: every broker); the others
    have no network config of their own: they join from the first source's peer endpoint and
    subscribe to ``extra_config_subs`` as well as to the sources (docs/operations.md).
    ``states[i]`` is broker i's initial state (default active); ``broker_overrides[i]`` changes
    its file. ``admins`` (auth_id -> (password, role)) are hashed into the network config;
    ``management`` turns each broker's HTTP management server on (127.0.0.1, port 0: its URL
    is in the endpoints file); ``management_overrides[i]`` changes broker i's ``management``
    section (``{"trend_summary": "../trend/summary.json"}``). ``hosts[i]`` is the address
    broker i binds and is known by (default 127.0.0.1 for all; the partition harness gives each
    broker the address of its own network namespace). ``curve`` turns CURVE on for the family
    (``curve: true``): a key pair per broker, and for each of :data:`CURVE_PEERS` (``client``,
    ``worker``...), in ``keys/`` (:func:`curve_options` gives a client or worker its pair and
    its seed's key). Returns ``(broker_files, network_file, network)``.
    """
    if count < 1:
        raise ValueError("a family needs at least one broker")
    if states is not None and len(states) != count:
        raise ValueError(f"states names {len(states)} brokers, the family has {count}")
    if broker_overrides is not None and len(broker_overrides) != count:
        raise ValueError(f"broker_overrides names {len(broker_overrides)} brokers, not {count}")
    if management_overrides is not None and len(management_overrides) != count:
        raise ValueError(
            f"management_overrides names {len(management_overrides)} brokers, not {count}"
        )
    if hosts is not None and len(hosts) != count:
        raise ValueError(f"hosts names {len(hosts)} brokers, not {count}")
    host_of = list(hosts) if hosts is not None else ["127.0.0.1"] * count

    keys = directory / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    if not (keys / "signing.key").exists():
        generate_keypair(keys)
    ports = pick_free_ports(len(_CHANNELS) * count)
    is_source = [sources is None or index in sources for index in range(count)]
    if not any(is_source):
        raise ValueError("a family needs at least one config source")
    entries = []
    curve_keys: list[str | None] = [None] * count
    if curve:
        for index in range(count):
            name = FAMILY_IDENTITY.format(index + 1)
            curve_keys[index] = _curve_pair(keys, name).public
        for name in CURVE_PEERS:
            _curve_pair(keys, name)
        network_overrides.setdefault("curve", True)
    for index in range(count):
        front, back, peer, config_pub = ports[index * len(_CHANNELS) : (index + 1) * len(_CHANNELS)]
        entries.append(
            BrokerEntry(
                identity=FAMILY_IDENTITY.format(index + 1),
                frontend=f"tcp://{host_of[index]}:{front}",
                backend=f"tcp://{host_of[index]}:{back}",
                peer=f"tcp://{host_of[index]}:{peer}",
                config_pub=f"tcp://{host_of[index]}:{config_pub}",
                config_source=is_source[index],
                curve_public_key=curve_keys[index],
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
    network_file = directory / "network.yaml"
    network_file.write_bytes(dumps(network, "yaml"))
    seed_entry = next(entry for entry in entries if entry.config_source)
    seed = seed_entry.peer
    broker_files = []
    for index, entry in enumerate(entries):
        home = directory / entry.identity
        home.mkdir(exist_ok=True)
        port = {name: int(getattr(entry, name).rsplit(":", 1)[1]) for name in _CHANNELS}
        broker = BrokerConfig(
            identity=entry.identity,
            bind_address=host_of[index],
            frontend_port=port["frontend"],
            backend_port=port["backend"],
            peer_port=port["peer"],
            config_pub_port=port["config_pub"],
            state=BrokerState(states[index]) if states is not None else BrokerState.ACTIVE,
            config_source=entry.config_source,
            family=network.family,
            network_config="../network.yaml" if entry.config_source else None,
            signing_key="../keys/signing.key" if entry.config_source else None,
            seeds=() if entry.config_source else (seed,),
            seed_curve_keys=(
                (seed_entry.curve_public_key,)
                if seed_entry.curve_public_key is not None and not entry.config_source
                else ()
            ),
            curve_secret_key=f"../keys/{entry.identity}.curve.key" if curve else None,
            config_sub_ports=tuple(extra_config_subs),
            trusted_keys=("../keys/signing.pub",),
            management=ManagementSettings(
                **{
                    "enabled": management,
                    "http_address": "127.0.0.1",
                    "http_port": 0,
                    **(management_overrides[index] if management_overrides is not None else {}),
                }
            ),
            data_dir="data",
            event_log_dir="events",
            log_level="info",
        )
        if broker_overrides is not None and broker_overrides[index]:
            broker = dataclasses.replace(broker, **dict(broker_overrides[index]))
        broker_file = home / "broker.yaml"
        broker_file.write_bytes(dumps(broker, "yaml"))
        broker_files.append(broker_file)
    return broker_files, network_file, network


#: The key pairs besides the brokers' that a CURVE family of these helpers has (``keys/NAME.
#: curve.key``): clients and workers of the tests, and spare ones for refusals and rotations.
CURVE_PEERS = ("client", "worker", "client2", "worker2")


def _curve_pair(keys: Path, name: str) -> CurveKeyPair:
    path = keys / f"{name}.curve.key"
    if path.exists():
        return load_curve_secret_key(path)
    return generate_curve_keypair(keys, name)[2]


def curve_options(broker: BrokerProcess | FamilyMember, who: str = "client") -> dict[str, Any]:
    """What a Client or Worker (``who``: a name of :data:`CURVE_PEERS`) needs to use
    ``broker`` as its seed: ``{"curve": its key pair, "server_key": the broker's key}``, or
    ``{}`` when the broker serves no CURVE."""
    home = broker.broker_file.parent
    network = broker.network if isinstance(broker, BrokerProcess) else None
    identity = home.name
    key = None
    if network is not None:
        key = next((e.curve_public_key for e in network.brokers if e.identity == identity), None)
    else:
        secret = home.parent / "keys" / f"{identity}.curve.key"
        key = load_curve_secret_key(secret).public if secret.exists() else None
    if key is None:
        return {}
    return {
        "curve": load_curve_secret_key(home.parent / "keys" / f"{who}.curve.key"),
        "server_key": key,
    }


def curve_worker_args(broker: BrokerProcess, who: str = "worker") -> list[str]:
    """``scale0-worker`` options equal to :func:`curve_options` (empty without CURVE)."""
    options = curve_options(broker, who)
    if not options:
        return []
    home = broker.broker_file.parent
    return [
        "--curve-key",
        str(home.parent / "keys" / f"{who}.curve.key"),
        "--server-key",
        options["server_key"],
    ]


def _spawn_broker(
    broker_file: Path, *, append: bool = False
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start ``scale0-broker`` on ``broker_file``; its endpoints file and stderr sit beside it.

    ``append`` keeps what an earlier run of the same broker wrote to its stderr (a restart).
    """
    endpoints_file = broker_file.parent / "endpoints.json"
    endpoints_file.unlink(missing_ok=True)
    stderr_path = broker_file.parent / "broker.stderr"
    # stderr to a file, not a pipe: a chatty broker must never block on a full pipe.
    with stderr_path.open("ab" if append else "wb") as stderr:
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
    return process, endpoints_file, stderr_path


def start_broker_process(
    broker_file: Path,
    network_file: Path,
    network: NetworkConfig,
    timeout_s: float = START_TIMEOUT_S,
) -> BrokerProcess:
    """(Re)start one broker of a family written by :func:`write_family_configs`, by its file.

    The caller stops it (``broker.stop()``, by PID). For a restart after a SIGKILL: the broker
    begins from the last good config saved in its ``data_dir``.
    """
    process, endpoints_file, stderr_path = _spawn_broker(broker_file, append=True)
    try:
        endpoints = wait_for_endpoints(process, endpoints_file, stderr_path, timeout_s)
    except BaseException:
        _terminate(process, STOP_TIMEOUT_S)
        raise
    return BrokerProcess(process, endpoints, broker_file, network_file, network, stderr_path)


def _start_family(
    broker_files: Sequence[Path], network_file: Path, network: NetworkConfig, timeout_s: float
) -> list[BrokerProcess]:
    """Start every broker at once, then wait for each; on any failure stop them all (by PID)."""
    spawned = [_spawn_broker(path) for path in broker_files]
    started: list[BrokerProcess] = []
    try:
        deadline = time.monotonic() + timeout_s
        for broker_file, (process, endpoints_file, stderr_path) in zip(
            broker_files, spawned, strict=True
        ):
            try:
                endpoints = wait_for_endpoints(
                    process, endpoints_file, stderr_path, max(0.0, deadline - time.monotonic())
                )
            except RuntimeError as exc:
                if "in use" in str(exc):
                    raise PortTaken(str(exc)) from None
                raise
            started.append(
                BrokerProcess(process, endpoints, broker_file, network_file, network, stderr_path)
            )
    except BaseException:
        for process, _endpoints_file, _stderr_path in spawned:
            _terminate(process, STOP_TIMEOUT_S)
        raise
    return started


@contextlib.contextmanager
def running_brokers(
    tmp_path: Path,
    count: int,
    *,
    sources: Sequence[int] | None = None,
    extra_config_subs: Sequence[str] = (),
    states: Sequence[BrokerState | str] | None = None,
    broker_overrides: Sequence[Mapping[str, Any]] | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    curve: bool = False,
    **network_overrides: Any,
) -> Iterator[list[BrokerProcess]]:
    """Start ``count`` ``scale0-broker`` processes sharing ONE network config; stop them by PID.

    The network config's ``brokers`` list holds the endpoints the brokers really bind (ports
    picked free beforehand, :func:`pick_free_ports`), so a client given one broker's frontend
    learns the others from its CONFIG. Files are laid out by :func:`write_family_configs`;
    keyword arguments are NetworkConfig overrides. ``sources`` picks the config sources (default
    all); the others join from a seed. The brokers link to each other, share their tables and
    forward requests (docs/protocol.md §5). Yields the processes in the config's order
    (identities b1, b2...); a test may SIGKILL one (``os.kill(broker.pid, ...)``) or
    ``broker.stop()`` it early; on exit every one still running gets SIGTERM, then SIGKILL.
    """
    for attempt in range(FAMILY_START_ATTEMPTS):
        broker_files, network_file, network = write_family_configs(
            tmp_path,
            count,
            sources=sources,
            extra_config_subs=extra_config_subs,
            states=states,
            broker_overrides=broker_overrides,
            curve=curve,
            **network_overrides,
        )
        try:
            brokers = _start_family(broker_files, network_file, network, start_timeout_s)
        except PortTaken:
            if attempt + 1 == FAMILY_START_ATTEMPTS:
                raise
            continue
        try:
            yield brokers
        finally:
            for broker in brokers:
                broker.stop()
        return


# ---- the same family as FamilyMember objects (the management tests restart members) ----


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


def start_family_member(member: FamilyMember, timeout_s: float = START_TIMEOUT_S) -> None:
    """Start (or restart) one member's ``scale0-broker`` and wait for its endpoints."""
    process, endpoints_file, stderr_path = _spawn_broker(member.broker_file, append=True)
    member.process = process
    member.returncode = None
    member.endpoints = wait_for_endpoints(process, endpoints_file, stderr_path, timeout_s)


@contextlib.contextmanager
def running_family(
    tmp_path: Path,
    size: int = 3,
    *,
    management: bool = True,
    management_overrides: Sequence[Mapping[str, Any]] | None = None,
    admins: Mapping[str, tuple[str, str]] = FAMILY_ADMINS,
    broker_overrides: Sequence[Mapping[str, Any]] | None = None,
    **network_overrides: Any,
) -> Iterator[Family]:
    """Start ``size`` brokers ``b1``.. as real processes, each with its HTTP management server
    unless ``management`` is False; stop every one (by PID) on exit. The files are those of
    :func:`write_family_configs` (``management_overrides`` included; ``broker_overrides``:
    BrokerConfig fields per broker); the members can be stopped and started again one by one.
    A port taken by another process between picking and binding is picked again, as
    :func:`running_brokers` does (at most FAMILY_START_ATTEMPTS times)."""
    for attempt in range(FAMILY_START_ATTEMPTS):
        broker_files, _network_file, network = write_family_configs(
            tmp_path,
            size,
            management=management,
            management_overrides=management_overrides,
            admins=admins,
            broker_overrides=broker_overrides,
            **network_overrides,
        )
        family = Family(
            [FamilyMember(path.parent.name, path.parent, path) for path in broker_files],
            network,
            dict(admins),
        )
        try:
            for member in family.members:
                try:
                    start_family_member(member)
                except RuntimeError as exc:
                    if "in use" in str(exc):
                        raise PortTaken(str(exc)) from None
                    raise
        except PortTaken:
            for member in family.members:
                member.stop()
            if attempt + 1 == FAMILY_START_ATTEMPTS:
                raise
            continue
        except BaseException:
            for member in family.members:
                member.stop()
            raise
        try:
            yield family
        finally:
            for member in family.members:
                member.stop()
        return
