"""scale0-worker: serve one Python function as one or more services behind a broker.

``scale0-worker ENDPOINT MODULE:FUNCTION [--service NAME ...] [--capacity N]``. The function is
imported (the current directory is on the import path, as with ``python -m``) and served under
each ``--service`` name, or under its own ``__name__`` when none is given; it follows the handler
rules of scale0.net.worker (sync, async, or a generator that streams). SIGINT and SIGTERM stop
the worker cleanly (DISCONNECT is sent). It logs one JSON line on stderr at start
(``worker_starting``: endpoint, services, capacity, PID). Exit codes: 0 after a signal, 2 usage
error (including a handler that cannot be imported).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from types import FrameType

import click

from scale0.cli.options import log_level_option
from scale0.crypto.curve import curve_key_problem, load_curve_secret_key
from scale0.crypto.keys import CryptoError
from scale0.net.logs import LOGGER_NAME, configure, log_event
from scale0.net.security import load_trusted_key
from scale0.net.worker import Handler, Worker
from scale0.session.recent import RECENT_ENTRIES

__all__ = ["load_handler", "main"]


def load_handler(reference: str) -> Handler:
    """Import ``module:function`` (the function part may be dotted: ``module:Class.method``)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise click.BadParameter(f"{reference!r} is not MODULE:FUNCTION", param_hint="HANDLER")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="HANDLER"
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise click.BadParameter(
                f"{module_name!r} has no attribute {attribute!r}", param_hint="HANDLER"
            ) from None
    if not callable(target):
        raise click.BadParameter(f"{reference!r} is not callable", param_hint="HANDLER")
    return target


@click.command(name="scale0-worker")
@click.argument("endpoint")
@click.argument("handler", metavar="MODULE:FUNCTION")
@click.option(
    "--service",
    "services",
    multiple=True,
    help="Service name to serve (repeatable); defaults to the function's name.",
)
@click.option(
    "--capacity",
    type=click.IntRange(1, 65535),
    default=1,
    show_default=True,
    help="Requests served at once (threads for a sync handler).",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0.001),
    default=1.0,
    show_default=True,
    help="Seconds between heartbeats (the broker may raise it).",
)
@click.option("--worker-id", default=None, help="Id to ask the broker for (default: assigned).")
@click.option(
    "--curve-key",
    type=click.Path(dir_okay=False),
    default=None,
    help="This worker's CURVE key file (NAME.curve.key, mode 0600), for a family that serves "
    "CURVE (or is turning it on).",
)
@click.option(
    "--server-key",
    default=None,
    help="The CURVE public key (Z85) of the broker at ENDPOINT, if it serves CURVE; the "
    "others' come with the config. Needs --curve-key.",
)
@click.option(
    "--trusted-key",
    default=None,
    envvar="SCALE0_TRUSTED_KEY",
    help="The family's config-signing public key (a .pub file, as in a broker's trusted_keys, "
    "or its 'ed25519 <base64>' text): every config is checked against it before any backend "
    "or CURVE key in it is used, and one that fails is refused (docs/protocol.md §2.5). "
    "Env: SCALE0_TRUSTED_KEY.",
)
@click.option(
    "--recent-requests",
    type=click.IntRange(min=0),
    default=RECENT_ENTRIES,
    show_default=True,
    help="Answered requests remembered by their client's ids, so a resent one is not run "
    "again after a failover (0: none; scale0.net.worker W7).",
)
@log_level_option()
def main(
    endpoint: str,
    handler: str,
    services: tuple[str, ...],
    capacity: int,
    heartbeat_interval: float,
    worker_id: str | None,
    curve_key: str | None,
    server_key: str | None,
    trusted_key: str | None,
    recent_requests: int,
    log_level: str,
) -> None:
    """Serve MODULE:FUNCTION behind the broker backend at ENDPOINT until SIGINT or SIGTERM.

    ENDPOINT is a seed: the worker learns the family's other backends from the config and
    moves to one of them when its broker dies, shuts down, refuses (503) or redirects (301).
    """
    function = load_handler(handler)
    names = services or (getattr(function, "__name__", handler.rpartition(":")[2]),)
    curve = None
    if server_key is not None and curve_key is None:
        raise click.UsageError("--server-key needs --curve-key (this worker's own key pair)")
    if server_key is not None:
        problem = curve_key_problem(server_key)
        if problem is not None:
            raise click.BadParameter(problem, param_hint="--server-key")
    if curve_key is not None:
        try:
            curve = load_curve_secret_key(curve_key)
        except CryptoError as exc:
            raise click.BadParameter(str(exc), param_hint="--curve-key") from None
    trusted = None
    if trusted_key is not None:
        try:
            trusted = load_trusted_key(trusted_key)
        except CryptoError as exc:
            raise click.BadParameter(str(exc), param_hint="--trusted-key") from None
    configure(log_level)
    worker = Worker(
        endpoint,
        dict.fromkeys(names, function),
        capacity=capacity,
        heartbeat_interval=heartbeat_interval,
        worker_id=worker_id,
        curve=curve,
        server_key=server_key,
        trusted_key=trusted,
        recent_requests=recent_requests,
    )

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        worker.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # One line at start, so whoever started it sees what it serves where (and how to stop it).
    log_event(
        logging.getLogger(LOGGER_NAME),
        logging.INFO,
        "worker_starting",
        {
            "endpoint": endpoint,
            "services": list(names),
            "handler": handler,
            "capacity": capacity,
            "pid": os.getpid(),
            "stop": "Ctrl-C or SIGTERM",
        },
    )
    worker.run()
