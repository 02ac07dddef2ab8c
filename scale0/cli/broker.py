"""scale0-broker, the broker process: read its files, sign the config, run a BrokerNode.

This module owns the command line, the start-up checks and the exit codes; the sockets are
scale0.net.node's and every decision the core's. ``scale0-broker --config FILE
[--endpoints-file PATH]``. Exit codes: 0 after SIGINT/SIGTERM (everyone was told DISCONNECT),
1 when it cannot start (bad config, unusable key, port in use; the reason is on stderr),
2 usage error (click's own). Logs are JSON lines on stderr (scale0.net.logs).
"""

from __future__ import annotations

import asyncio
import errno
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from scale0.config.canonical import config_sha256
from scale0.config.errors import ConfigError
from scale0.config.loader import load, write_atomic
from scale0.config.model import BrokerConfig, NetworkConfig
from scale0.crypto.keys import CryptoError, load_private_key, sign_config
from scale0.mgmt.server import ManagementServer
from scale0.net.logs import configure
from scale0.net.node import BindError, BrokerNode

__all__ = ["Prepared", "StartError", "main", "prepare"]

_PROG = "scale0-broker"


class StartError(Exception):
    """The broker cannot start; the message says why (printed on stderr, exit 1)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """Everything a broker needs before it binds: its file, the family config, the signature."""

    broker: BrokerConfig
    network: NetworkConfig
    signature: str | None


def _resolve(base: Path, path: str) -> Path:
    """A path from the broker file: relative ones are relative to that file's directory."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def prepare(config_path: Path) -> Prepared:
    """Load the broker file and, for a config source, its network config and signing key.

    Raises ConfigError (file/line/path of every problem) or StartError.
    """
    broker = load(config_path, kind="broker")
    base = config_path.resolve().parent
    if not broker.config_source:
        raise StartError(
            f"{config_path}: broker {broker.identity!r} is not a config_source; "
            "joining a family from seeds is not built yet"
        )
    if broker.network_config is None:
        raise StartError(f"{config_path}: network_config: a config source needs one")
    if broker.signing_key is None:
        raise StartError(f"{config_path}: signing_key: a config source needs one")
    network = load(_resolve(base, broker.network_config), kind="network")
    key_path = _resolve(base, broker.signing_key)
    try:
        key = load_private_key(key_path)
    except CryptoError as exc:
        raise StartError(f"{config_path}: signing_key: {exc}") from None
    members = [entry.identity for entry in network.brokers]
    if broker.identity not in members:
        raise StartError(
            f"{config_path}: identity {broker.identity!r} is not one of the brokers of family "
            f"{network.family!r} ({', '.join(members)})"
        )
    signature = sign_config(key, network.family, network.config_version, config_sha256(network))
    return Prepared(broker, network, signature)


async def _serve(prepared: Prepared, config_path: Path, endpoints_file: Path | None) -> int:
    node = BrokerNode(prepared.broker, prepared.network, signature=prepared.signature)
    try:
        node.start()
    except BindError as exc:
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            hint = (
                f" (the port is in use by another process: stop it, or change"
                f" {exc.channel.value}_port in {config_path})"
            )
        click.echo(f"{_PROG}: {exc}{hint}", err=True)
        node.stop()
        return 1
    document = {channel.value: endpoint for channel, endpoint in node.endpoints.items()}
    server: ManagementServer | None = None
    settings = prepared.broker.management
    if settings.enabled:  # off by default; loopback unless configured (docs/management.md)
        server = ManagementServer(node, settings)
        try:
            document["management"] = server.start()
        except OSError as exc:
            click.echo(
                f"{_PROG}: cannot serve management on "
                f"{settings.http_address}:{settings.http_port}: {exc.strerror or exc}"
                f" (change management.http_port in {config_path})",
                err=True,
            )
            node.stop()
            return 1
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, node.stop)
    try:
        if endpoints_file is not None:
            try:
                write_atomic(endpoints_file, json.dumps(document).encode("utf-8") + b"\n")
            except OSError as exc:
                click.echo(f"{_PROG}: cannot write {endpoints_file}: {exc.strerror}", err=True)
                node.stop()
                return 1
        await node.serve()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if server is not None:
            server.stop()
        node.stop()
    return 0


@click.command(name=_PROG)
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The broker's own config file (any format: .yaml .json .xml .zfl).",
)
@click.option(
    "--endpoints-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help='Write {"frontend": ..., "backend": ..., "management": URL} here (atomically) once bound.',
)
def main(config_path: Path, endpoints_file: Path | None) -> None:
    """Run one Scale0 broker until SIGINT or SIGTERM."""
    try:
        prepared = prepare(config_path)
    except ConfigError as exc:
        click.echo(f"{_PROG}: cannot start, the config has problems:", err=True)
        for problem in exc.problems:
            click.echo(f"  {problem}", err=True)
        sys.exit(1)
    except StartError as exc:
        click.echo(f"{_PROG}: {exc}", err=True)
        sys.exit(1)
    configure(prepared.broker.log_level)
    sys.exit(asyncio.run(_serve(prepared, config_path, endpoints_file)))
