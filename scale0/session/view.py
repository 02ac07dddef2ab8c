"""The config view a broker hands a client or worker (protocol.md §3.2), typed by the schema.

A CONFIG carries the client view of the network config in the format the client asked for. JSON
gives numbers, booleans and lists; XML and ZFL give every scalar as a string and every list as a
container of named items. :func:`parse_config_document` converts the text formats with the
network config's own schema (``scale0.config.schema.typed_fields`` over
:class:`~scale0.config.model.NetworkConfig`), so ``ClientConfig.document`` holds the same typed
tree whichever format was negotiated. A value the schema cannot convert is kept as it came, with
a warning; a document that does not parse is ``{}`` (logged), never an exception.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scale0.config.errors import ConfigError
from scale0.config.formats import CONFIG_TYPE_FORMATS, parse
from scale0.config.model import NetworkConfig
from scale0.config.schema import typed_fields
from scale0.wire.frames import ConfigType

__all__ = ["ClientConfig", "parse_config_document"]

log = logging.getLogger("scale0.client")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The broker's answer to CHECKCONFIG: the client view of the network config (§3.2)."""

    version: int
    client_id: str
    config_type: ConfigType
    sha256: str | None = None
    document: Mapping[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str | None:
        """The family name, if the view carries it."""
        value = self.document.get("family")
        return value if isinstance(value, str) else None

    @property
    def brokers(self) -> list[Any]:
        """The family's brokers as the view lists them (empty if it does not)."""
        value = self.document.get("brokers")
        if isinstance(value, Mapping):  # a text view the schema could not convert
            value = value.get("broker", [])
        if isinstance(value, Mapping):
            return [value]
        return list(value) if isinstance(value, list) else []

    def number(self, key: str) -> float | None:
        """A numeric key of the view; None when absent or not a finite number."""
        value = self.document.get(key)
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return float(value) if math.isfinite(value) else None
        if isinstance(value, str):  # kept as text only when the schema could not convert it
            with contextlib.suppress(ValueError):
                number = float(value)
                return number if math.isfinite(number) else None
        return None


def parse_config_document(config_type: ConfigType, document: bytes) -> dict[str, Any]:
    """The CONFIG document as a typed plain tree; ``{}`` (logged) when it does not parse."""
    try:
        if config_type is ConfigType.JSON:
            tree: Any = json.loads(document)
        else:
            tree = parse(document, CONFIG_TYPE_FORMATS[config_type]).tree
    except (ValueError, ConfigError) as exc:
        log.warning("config document (%s) does not parse: %s", config_type.value, exc)
        return {}
    # (formats.parse has already taken XML's root element off: a one-key view stays whole)
    if not isinstance(tree, Mapping):
        return {}
    if config_type is ConfigType.JSON:
        return dict(tree)
    typed, problems = typed_fields(NetworkConfig, tree)
    for problem in problems:
        log.warning(
            "config view (%s): %s: %s; kept as text",
            config_type.value,
            problem.path,
            problem.message,
        )
    return typed
