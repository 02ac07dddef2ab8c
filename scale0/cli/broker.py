"""scale0-broker, the broker process: read its files, sign the config, run a BrokerNode.

This module owns the command line, the start-up checks and the exit codes; the sockets are
scale0.net.node's and every decision the core's. ``scale0-broker --config FILE
[--endpoints-file PATH]``. SIGINT/SIGTERM stop it gracefully: no new work, requests in flight
finish within ``shutdown_grace_ms``, everyone is told DISCONNECT (a second signal: at once).
Exit codes: 0 after SIGINT/SIGTERM, 1 when it cannot start (bad config, unusable key, port in
use; the reason is on stderr), 2 usage error (click's own). Logs are JSON lines on stderr
(scale0.net.logs).

A config source starts from its network config file, signed with its key; any other broker
starts joining, from its seeds and config subscriptions. Either way the last good config saved
in ``data_dir`` is offered at start, and the core keeps whichever is newer (docs/operations.md).
SIGHUP (or ``scale0ctl reload-config``) makes a config source read its broker file and its
network config file again and offer the config signed with the ``signing_key`` the broker file
names *now*: rotating the key needs no restart (docs/operations.md). A change to anything else
in the broker file (ports, trusted keys, ...) needs a restart and is logged as
``broker_file_needs_restart``.

A broker whose own ports differ from its entry in the network config would tell clients and
workers endpoints nobody listens on: a config source refuses to start, naming both values; any
broker logs ``own_endpoint_mismatch`` (a warning) when the config it starts from disagrees.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import json
import logging
import os
import resource
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.cli.options import config_option
from scale0.config.canonical import canonical_json
from scale0.config.errors import ConfigError
from scale0.config.lastgood import read_last_good
from scale0.config.loader import load, loads, write_atomic
from scale0.config.model import BrokerConfig, NetworkConfig
from scale0.config.signature import signature_for
from scale0.core.ledger import default_pool
from scale0.core.replica import Offer
from scale0.crypto.curve import CurveKeyPair, load_curve_secret_key
from scale0.crypto.keys import CryptoError, load_private_key, load_public_key
from scale0.mgmt.server import ManagementServer, TlsError, tls_context
from scale0.net.logs import LOGGER_NAME, configure, log_event
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
    event_log_dir: Path | None = None
    curve: CurveKeyPair | None = None  # curve_secret_key, loaded: its sockets serve CURVE
    view_signature: str | None = None  # a config source's: its client view's signature


def _resolve(base: Path, path: str) -> Path:
    """A path from the broker file: relative ones are relative to that file's directory."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


#: Broker-file fields a reload takes from the file as it is now; any other change needs a restart.
RELOADED_FIELDS: Final = frozenset({"signing_key", "network_config"})

#: Channel name -> the broker-file field holding its port.
_PORT_FIELDS: Final = {
    "frontend": "frontend_port",
    "backend": "backend_port",
    "peer": "peer_port",
    "config_pub": "config_pub_port",
}


def port_mismatches(broker: BrokerConfig, network: NetworkConfig) -> list[str]:
    """How the broker's own ports differ from its ``brokers[]`` entry in ``network``.

    One line per differing channel, naming both values. A port 0 in the broker file (the OS
    picks one, as tests do) cannot be compared and is left out; so is the host, since the entry
    names the address other hosts use, which the broker's ``bind_address`` may not be.
    """
    entry = next((e for e in network.brokers if e.identity == broker.identity), None)
    if entry is None:
        return []
    problems = []
    for channel, field_name in _PORT_FIELDS.items():
        own = int(getattr(broker, field_name))
        endpoint = str(getattr(entry, channel))
        _, _, port_text = endpoint.rpartition(":")
        if own == 0 or not port_text.isdigit() or int(port_text) == own:
            continue
        problems.append(
            f"{field_name} is {own}, but brokers[{broker.identity}].{channel} in the network "
            f"config is {endpoint}"
        )
    return problems


def curve_mismatch(
    broker: BrokerConfig, curve: CurveKeyPair | None, network: NetworkConfig
) -> str | None:
    """How the broker's CURVE key and its entry's ``curve_public_key`` disagree, if they do.

    An entry with a key whose broker has none, or another one, would be unreachable for
    everyone who follows the config. A broker with a key pair whose entry has none is a rollout
    under way (docs/operations.md "CURVE"): it connects with its key and serves without CURVE.
    """
    entry = next((e for e in network.brokers if e.identity == broker.identity), None)
    if entry is None:
        return None
    if curve is None and entry.curve_public_key is not None:
        return (
            f"brokers[{broker.identity}].curve_public_key is set in the network config, but "
            "the broker file names no curve_secret_key"
        )
    if curve is not None and entry.curve_public_key not in (None, curve.public):
        return (
            f"curve_secret_key's public key is {curve.public}, but "
            f"brokers[{broker.identity}].curve_public_key is {entry.curve_public_key}"
        )
    return None


def serves_curve(prepared: Prepared) -> bool:
    """Whether the broker's sockets serve CURVE: it has a key pair and its entry in the config
    it starts from (the file's, else the saved one) has a curve_public_key; with no config at
    all, when its seeds serve CURVE (``seed_curve_keys``): it joins a CURVE family."""
    if prepared.curve is None:
        return False
    network = prepared.network
    if network is None and prepared.last_good is not None:
        try:
            network = loads(prepared.last_good.document, "json", kind="network")
        except ConfigError:
            network = None
    if network is None:
        return bool(prepared.broker.seed_curve_keys)
    entry = next((e for e in network.brokers if e.identity == prepared.broker.identity), None)
    return entry is not None and entry.serves_curve is not None


def reread_broker_file(prepared: Prepared) -> tuple[BrokerConfig, list[str]]:
    """The broker file as it is now, and the fields that changed but need a restart.

    Raises ConfigError. Only :data:`RELOADED_FIELDS` are taken from it by a reload.
    """
    now = load(prepared.config_path, kind="broker")
    stale = [
        f.name
        for f in dataclasses.fields(BrokerConfig)
        if f.name not in RELOADED_FIELDS
        and getattr(now, f.name) != getattr(prepared.broker, f.name)
    ]
    return now, stale


def source_offer(prepared: Prepared, broker: BrokerConfig | None = None) -> Offer:
    """A config source's network config file, read again and signed: what SIGHUP offers.

    ``broker`` is the broker file to take ``network_config`` and ``signing_key`` from (default:
    the one read at start). Raises ConfigError (the file's problems) or StartError (the key).
    """
    broker = broker if broker is not None else prepared.broker
    base = prepared.config_path.resolve().parent
    if broker.network_config is None or broker.signing_key is None:
        raise StartError(f"{prepared.config_path}: only a config source reads a network config")
    network = load(_resolve(base, broker.network_config), kind="network")
    try:
        key = load_private_key(_resolve(base, broker.signing_key))
    except CryptoError as exc:
        raise StartError(f"{prepared.config_path}: signing_key: {exc}") from None
    signed = signature_for(network, key)  # the config and its client view (§6.2)
    return Offer(
        config_type=ConfigType.JSON,
        document=canonical_json(network),
        sha256=signed.sha256,
        signature=signed.signature,
        origin=broker.identity,
        family=network.family,
        config_version=network.config_version,
        view_signature=signed.view_signature,
    )


def _claimed(document: bytes) -> tuple[str | None, int | None]:
    """The family and version a saved config names, so that the core recognises the config it
    already runs (same version and sha256, K3) instead of judging it again: judged in full,
    the same document at the same version was logged as a conflict with itself (issue 11 #6).
    Anything unexpected gives (None, None): the core then checks the document in full."""
    try:
        tree = json.loads(document)
    except ValueError:
        return None, None
    if not isinstance(tree, dict):
        return None, None
    family, version = tree.get("family"), tree.get("config_version")
    return (
        family if isinstance(family, str) else None,
        version if isinstance(version, int) and not isinstance(version, bool) else None,
    )


def prepare(config_path: Path) -> Prepared:
    """Load the broker file, its trusted keys, and (for a config source) its network config.

    Raises ConfigError (file/line/path of every problem) or StartError.
    """
    try:
        default_pool()  # SCALE0_POOL, checked before anything is bound (scale0.core.ledger)
    except ValueError as exc:
        raise StartError(str(exc)) from None
    broker = load(config_path, kind="broker")
    base = config_path.resolve().parent
    trusted: list[Ed25519PublicKey] = []
    for i, path in enumerate(broker.trusted_keys):
        try:
            trusted.append(load_public_key(_resolve(base, path)))
        except CryptoError as exc:
            raise StartError(f"{config_path}: trusted_keys[{i}]: {exc}") from None
    curve = None
    if broker.curve_secret_key is not None:
        try:
            curve = load_curve_secret_key(_resolve(base, broker.curve_secret_key))
        except CryptoError as exc:
            raise StartError(f"{config_path}: curve_secret_key: {exc}") from None
    data_dir = _resolve(base, broker.data_dir)
    event_log_dir = None
    if broker.event_log_dir is not None:
        event_log_dir = _resolve(base, broker.event_log_dir)
        try:
            event_log_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(event_log_dir, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "not writable")
        except OSError as exc:
            raise StartError(
                f"{config_path}: event_log_dir: cannot create {event_log_dir}: "
                f"{exc.strerror or exc}"
            ) from None
    try:
        saved = read_last_good(data_dir)
    except ConfigError as exc:
        # A damaged saved config must not stop the broker: the family will give it a good one.
        click.echo(f"{_PROG}: ignoring the saved config: {exc}", err=True)
        saved = None
    last_good = None
    if saved is not None:
        claimed = _claimed(saved.document)
        last_good = Offer(
            config_type=ConfigType.JSON,
            document=saved.document,
            sha256=saved.sha256,
            signature=saved.signature,
            origin=saved.origin,
            family=claimed[0],
            config_version=claimed[1],
            view_signature=saved.view_signature,
        )
    network: NetworkConfig | None = None
    signature: str | None = None
    view_signature: str | None = None
    prepared = Prepared(
        broker, None, None, tuple(trusted), data_dir, last_good, config_path, event_log_dir, curve
    )
    if broker.config_source:
        offer = source_offer(prepared)
        network = load(_resolve(base, broker.network_config or ""), kind="network")
        signature = offer.signature
        view_signature = offer.view_signature
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
        mismatches = port_mismatches(broker, network)
        if mismatches:
            # Clients and workers would be sent to endpoints nobody listens on (issue 11 #7).
            raise StartError(
                f"{config_path}: the broker's own ports differ from its entry in "
                f"{broker.network_config}: "
                + "; ".join(mismatches)
                + " (make them agree, then start again)"
            )
        problem = curve_mismatch(broker, curve, network)
        if problem is not None:
            raise StartError(f"{config_path}: {problem} (docs/operations.md, CURVE)")
    return Prepared(
        broker,
        network,
        signature,
        tuple(trusted),
        data_dir,
        last_good,
        config_path,
        event_log_dir,
        curve,
        view_signature,
    )


def _warn_saved_mismatch(prepared: Prepared) -> None:
    """Log ``own_endpoint_mismatch`` when the saved config's entry for us names other ports."""
    if prepared.last_good is None:
        return
    try:
        saved = loads(prepared.last_good.document, "json", kind="network")
    except ConfigError:
        return  # the core refuses it with the reason (config_refused)
    problem = curve_mismatch(prepared.broker, prepared.curve, saved)
    if problem is not None:
        log_event(
            logging.getLogger(LOGGER_NAME),
            logging.WARNING,
            "curve_key_mismatch",
            {"file": str(prepared.config_path), "problem": problem},
            broker=prepared.broker.identity,
        )
    mismatches = port_mismatches(prepared.broker, saved)
    if mismatches:
        log_event(
            logging.getLogger(LOGGER_NAME),
            logging.WARNING,
            "own_endpoint_mismatch",
            {"file": str(prepared.config_path), "problems": mismatches},
            broker=prepared.broker.identity,
        )


def reload_offer(prepared: Prepared) -> Offer:
    """What a reload offers: the network config file signed with the key the broker file names
    now (so a new ``signing_key`` takes effect, docs/operations.md "Rotating the signing key").

    Other changed broker-file fields are logged as needing a restart. Raises ConfigError or
    StartError, whose message the admin (reload_config) or the log (SIGHUP) gets.
    """
    broker, stale = reread_broker_file(prepared)
    if stale:
        log_event(
            logging.getLogger(LOGGER_NAME),
            logging.WARNING,
            "broker_file_needs_restart",
            {"file": str(prepared.config_path), "settings": stale},
            broker=broker.identity,
        )
    if not broker.config_source:
        raise StartError(f"{prepared.config_path}: config_source is no longer true; restart it")
    return source_offer(prepared, broker)


def _reload(node: BrokerNode, prepared: Prepared) -> None:
    """SIGHUP on a config source: offer its network config file again, signed."""
    try:
        offer = reload_offer(prepared)
    except (ConfigError, StartError) as exc:
        node.log_problem("config_reload_failed", str(exc))
        return
    node.offer_config(offer, "file")


async def _serve(prepared: Prepared, config_path: Path, endpoints_file: Path | None) -> int:
    node = BrokerNode(
        prepared.broker,
        prepared.network,
        signature=prepared.signature,
        view_signature=prepared.view_signature,
        trusted_keys=prepared.trusted,
        data_dir=prepared.data_dir,
        event_log_dir=prepared.event_log_dir,
        reload=(lambda: reload_offer(prepared)) if prepared.broker.config_source else None,
        curve=prepared.curve,
        serve_curve=serves_curve(prepared),
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
        base = config_path.resolve().parent
        ssl_context = None
        if settings.tls_cert:  # HTTPS (docs/management.md "TLS"); validation required it
            try:
                ssl_context = tls_context(
                    _resolve(base, settings.tls_cert),
                    _resolve(base, settings.tls_key) if settings.tls_key else None,
                )
            except TlsError as exc:
                click.echo(f"{_PROG}: cannot serve management over TLS: {exc}", err=True)
                node.stop()
                return 1
        # normpath: these paths appear in the page and in the advice it gives, without "..".
        server = ManagementServer(
            node,
            settings,
            trend_summary=(
                Path(os.path.normpath(_resolve(base, settings.trend_summary)))
                if settings.trend_summary
                else None
            ),
            event_log_dir=(
                Path(os.path.normpath(_resolve(base, prepared.broker.event_log_dir)))
                if prepared.broker.event_log_dir
                else None
            ),
            ssl_context=ssl_context,
        )
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
        log_event(
            logging.getLogger(LOGGER_NAME),
            logging.INFO,
            "management_ready",
            {"url": document["management"] + "/", "metrics": document["management"] + "/metrics"},
            broker=prepared.broker.identity,
        )
    loop = asyncio.get_running_loop()
    grace_s = prepared.broker.shutdown_grace_ms / 1000
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Graceful: new work refused, in-flight requests finish within the grace (a second
        # signal stops at once); docs/operations.md "Stopping a broker".
        loop.add_signal_handler(signum, node.drain, grace_s)
    if prepared.broker.config_source:
        loop.add_signal_handler(signal.SIGHUP, _reload, node, prepared)
    if prepared.last_good is not None:
        _warn_saved_mismatch(prepared)
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
            await server.close()
        node.stop()
    return 0


@click.command(name=_PROG)
@config_option("The broker's own config file (any format: .yaml .json .xml .zfl).")
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
    raise_open_files()
    sys.exit(asyncio.run(_serve(prepared, config_path, endpoints_file)))


def raise_open_files() -> None:
    """Let the broker hold as many connections as the system allows it (docs/operations.md
    "Limits"): the soft limit on open files goes up to the hard one. Each client, worker and
    peer connection is one file; max_unnegotiated bounds those that never negotiate."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


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
