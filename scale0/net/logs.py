"""Structured logs of broker processes: one JSON object per line, through stdlib ``logging``.

A line is ``{"ts": <unix seconds>, "level": "info", "event": "broker_ready", "broker": "solo",
...fields}``. Code logs with :func:`log_event` (or the core's ``Log`` effects, which the node
turns into the same call); :func:`configure` installs the formatter on stderr once per process.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, Final, TextIO

__all__ = [
    "LEVELS",
    "LOGGER_NAME",
    "JsonFormatter",
    "configure",
    "level_number",
    "log_event",
]

#: The logger every Scale0 process logs through (handlers are installed by :func:`configure`).
LOGGER_NAME: Final = "scale0"

#: Config / ``Log`` effect level names -> stdlib levels. Unknown names log as warnings.
LEVELS: Final[Mapping[str, int]] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# Keys of the line itself; a field with one of these names is written with a trailing "_".
_RESERVED: Final = frozenset({"ts", "level", "event", "broker", "traceback"})
_EVENT_ATTR: Final = "s0_event"
_FIELDS_ATTR: Final = "s0_fields"
_BROKER_ATTR: Final = "s0_broker"


def level_number(name: str) -> int:
    """The stdlib level of a config or ``Log`` level name (unknown names are warnings)."""
    return LEVELS.get(name, logging.WARNING)


def _json_default(value: object) -> object:
    # Routing ids, tickets and the like are bytes: show them as hex rather than failing the line.
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


class JsonFormatter(logging.Formatter):
    """Formats records as single-line JSON objects (see the module docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "event": getattr(record, _EVENT_ATTR, None) or record.getMessage(),
        }
        broker = getattr(record, _BROKER_ATTR, None)
        if broker is not None:
            line["broker"] = broker
        fields = getattr(record, _FIELDS_ATTR, None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                name = str(key)
                line[f"{name}_" if name in _RESERVED else name] = value
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        try:
            return json.dumps(line, default=_json_default, ensure_ascii=False)
        except (TypeError, ValueError) as exc:  # e.g. a circular structure in fields
            fallback: dict[str, Any] = {k: line[k] for k in ("ts", "level", "event") if k in line}
            fallback["log_error"] = str(exc)
            return json.dumps(fallback, default=str)


def log_event(
    logger: logging.Logger,
    level: int,
    event: str,
    fields: Mapping[str, Any] | None = None,
    *,
    broker: str | None = None,
    exc_info: bool = False,
) -> None:
    """Log one structured line; cheap when ``level`` is disabled (nothing is formatted)."""
    if not logger.isEnabledFor(level):
        return
    logger.log(
        level,
        event,
        exc_info=exc_info,
        extra={_EVENT_ATTR: event, _FIELDS_ATTR: fields or {}, _BROKER_ATTR: broker},
    )


def configure(level: str, *, stream: TextIO | None = None) -> logging.Logger:
    """Send the ``scale0`` logger's records, ``level`` and up, to ``stream`` (stderr) as JSON.

    Idempotent: a second call replaces the handler it installed instead of adding another.
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level_number(level))
    for handler in list(logger.handlers):
        if getattr(handler, "s0_json", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.s0_json = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
    return logger
