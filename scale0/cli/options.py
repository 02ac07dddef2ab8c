"""The click options several Scale0 commands share, written once: --config and --log-level."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

LOG_LEVELS = ("debug", "info", "warning", "error")


def config_option(help_text: str) -> Callable[[F], F]:
    """``--config FILE`` (required, a file), passed to the command as ``config_path``."""
    return click.option(
        "--config",
        "config_path",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help=help_text,
    )


def log_level_option() -> Callable[[F], F]:
    """``--log-level`` (debug, info, warning, error; default info)."""
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS),
        default="info",
        show_default=True,
        help="The lowest level of log event written to stderr.",
    )
