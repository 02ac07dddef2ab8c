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
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scale0.config.loader import dumps
from scale0.config.model import BrokerConfig, BrokerEntry, NetworkConfig
from scale0.crypto.keys import generate_keypair

__all__ = ["BrokerProcess", "broker_command", "running_broker", "write_configs"]

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
