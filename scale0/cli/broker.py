"""scale0-broker, the broker process: read its files, sign the config, run a BrokerNode.

This module owns the command line, the start-up checks and the exit codes; the sockets are
scale0.net.node's and every decision the core's. ``scale0-broker --config FILE
[--endpoints-file PATH]``. Exit codes: 0 after SIGINT/SIGTERM (everyone was told DISCONNECT),
1 when it cannot start (bad config, unusable key, port in use; the reason is on stderr),
2 usage error (click's own). Logs are JSON lines on stderr (scale0.net.logs).

A config source starts from its network config file, signed with its key; any other broker
starts joining, from its seeds and config subscriptions. Either way the last good config saved
in ``data_dir`` is offered at start, and the core keeps whichever is newer (docs/operations.md).
SIGHUP makes a config source read its network config file again and offer it, signed.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.config.canonical import canonical_json, config_sha256
from scale0.config.errors import ConfigError
from scale0.config.lastgood import read_last_good
from scale0.config.loader import load, write_atomic
from scale0.config.model import BrokerConfig, NetworkConfig
from scale0.core.replica import Offer
from scale0.crypto.keys import CryptoError, load_private_key, load_public_key, sign_config
from scale0.mgmt.server import ManagementServer
from scale0.net.logs import configure
from scale0.net.node import BindError, BrokerNode
from scale0.wire.frames import ConfigType

__all__ = ["Prepared", "StartError", "main", "prepare"]

_PROG = "scale0-broker"


class StartError(Exception):
    """The broker cannot start; the message says why (printed on stderr, exit 1)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """Everything a broker needs before it binds: its file, keys, and what config it starts from.

    ``network`` is None for a broker that joins (it has no config until a peer or a config
    source gives it one); ``last_good`` is the config saved by an earlier run, if any.
    """

    broker: BrokerConfig
    network: NetworkConfig | None
    signature: str | None
    trusted: tuple[Ed25519PublicKey, ...]
    data_dir: Path
    last_good: Offer | None
    config_path: Path


def _resolve(base: Path, path: str) -> Path:
    """A path from the broker file: relative ones are relative to that file's directory."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def source_offer(prepared: Prepared) -> Offer:
    """A config source's network config file, read again and signed: what SIGHUP offers.

    Raises ConfigError (the file's problems) or StartError (the key).
    """
    broker = prepared.broker
    base = prepared.config_path.resolve().parent
    if broker.network_config is None or broker.signing_key is None:
        raise StartError(f"{prepared.config_path}: only a config source reads a network config")
    network = load(_resolve(base, broker.network_config), kind="network")
    try:
        key = load_private_key(_resolve(base, broker.signing_key))
    except CryptoError as exc:
        raise StartError(f"{prepared.config_path}: signing_key: {exc}") from None
    sha256 = config_sha256(network)
    return Offer(
        config_type=ConfigType.JSON,
        document=canonical_json(network),
        sha256=sha256,
        signature=sign_config(key, network.family, network.config_version, sha256),
        origin=broker.identity,
        family=network.family,
        config_version=network.config_version,
    )


def prepare(config_path: Path) -> Prepared:
    """Load the broker file, its trusted keys, and (for a config source) its network config.

    Raises ConfigError (file/line/path of every problem) or StartError.
    """
    broker = load(config_path, kind="broker")
    base = config_path.resolve().parent
    trusted: list[Ed25519PublicKey] = []
    for i, path in enumerate(broker.trusted_keys):
        try:
            trusted.append(load_public_key(_resolve(base, path)))
        except CryptoError as exc:
            raise StartError(f"{config_path}: trusted_keys[{i}]: {exc}") from None
    data_dir = _resolve(base, broker.data_dir)
    try:
        saved = read_last_good(data_dir)
    except ConfigError as exc:
        # A damaged saved config must not stop the broker: the family will give it a good one.
        click.echo(f"{_PROG}: ignoring the saved config: {exc}", err=True)
        saved = None
    last_good = None
    if saved is not None:
        last_good = Offer(
            config_type=ConfigType.JSON,
            document=saved.document,
            sha256=saved.sha256,
            signature=saved.signature,
            origin=saved.origin,
        )
    network: NetworkConfig | None = None
    signature: str | None = None
    prepared = Prepared(broker, None, None, tuple(trusted), data_dir, last_good, config_path)
    if broker.config_source:
        offer = source_offer(prepared)
        network = load(_resolve(base, broker.network_config or ""), kind="network")
        signature = offer.signature
        members = [entry.identity for entry in network.brokers]
        if broker.identity not in members:
            raise StartError(
                f"{config_path}: identity {broker.identity!r} is not one of the brokers of "
                f"family {network.family!r} ({', '.join(members)})"
            )
        if broker.family is not None and broker.family != network.family:
            raise StartError(
                f"{config_path}: family {broker.family!r} differs from the network config's "
                f"{network.family!r}"
            )
    return Prepared(broker, network, signature, tuple(trusted), data_dir, last_good, config_path)


def _reload(node: BrokerNode, prepared: Prepared) -> None:
    """SIGHUP on a config source: offer its network config file again, signed."""
    try:
        offer = source_offer(prepared)
    except (ConfigError, StartError) as exc:
        node.log_problem("config_reload_failed", str(exc))
        return
    node.offer_config(offer, "file")


async def _serve(prepared: Prepared, config_path: Path, endpoints_file: Path | None) -> int:
    node = BrokerNode(
        prepared.broker,
        prepared.network,
        signature=prepared.signature,
        trusted_keys=prepared.trusted,
        data_dir=prepared.data_dir,
        reload=(lambda: source_offer(prepared)) if prepared.broker.config_source else None,
    )
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
    document: dict[str, str] = node.endpoint_names()
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
    if prepared.broker.config_source:
        loop.add_signal_handler(signal.SIGHUP, _reload, node, prepared)
    if prepared.last_good is not None:
        node.offer_config(prepared.last_good, "disk")
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
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
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
    tune_gc()
    sys.exit(asyncio.run(_serve(prepared, config_path, endpoints_file)))


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between young collections (CPython's default is 700)."""


def tune_gc() -> None:
    """Make the cyclic collector cheaper for a long-running broker (docs/performance.md).

    A request's objects are freed by reference counting as soon as it is answered; the cyclic
    collector only walks what is still alive (requests in flight, the reply cache), and with
    CPython's default threshold it did so every 700 allocations: about 6 % of the broker's
    main thread under load (perf). ``gc.freeze()`` moves what start-up built (modules, config)
    out of its reach, and young collections become rarer. Cycles are still collected.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
