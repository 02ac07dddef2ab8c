"""Load and dump configs: file bytes in any format -> validated frozen dataclass, and back.

This is the only way a config enters Scale0: parse (formats), build (schema), check (validate).
A config with any problem raises ConfigError listing them all; nothing half-loaded escapes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, overload

from scale0.config.errors import ConfigError, Problem
from scale0.config.formats import MAX_CONFIG_BYTES, Format, Kind, format_of, parse, render
from scale0.config.model import BrokerConfig, Config, NetworkConfig
from scale0.config.schema import from_tree, line_for, raw_path, to_tree
from scale0.config.validate import check_broker, check_network

_CLASSES: dict[Kind, type[NetworkConfig] | type[BrokerConfig]] = {
    "network": NetworkConfig,
    "broker": BrokerConfig,
}


def kind_of(config: Config) -> Kind:
    return "network" if isinstance(config, NetworkConfig) else "broker"


@overload
def loads(
    data: bytes, fmt: Format, *, kind: Literal["network"], source: str | None = None
) -> NetworkConfig: ...
@overload
def loads(
    data: bytes, fmt: Format, *, kind: Literal["broker"], source: str | None = None
) -> BrokerConfig: ...
@overload
def loads(data: bytes, fmt: Format, *, kind: None = None, source: str | None = None) -> Config: ...
def loads(
    data: bytes, fmt: Format, *, kind: Kind | None = None, source: str | None = None
) -> Config:
    """Parse, build and validate one document; ``kind`` None means tell it from the content."""
    parsed = parse(data, fmt, source=source)
    detected = parsed.kind or _guess_kind(parsed.tree)
    if kind is not None and parsed.kind is not None and parsed.kind != kind:
        raise ConfigError.single(
            f"this is a {parsed.kind} config, a {kind} config was expected", file=source
        )
    kind = kind or detected
    cls = _CLASSES[kind]
    try:
        config = from_tree(cls, parsed.tree, typed=parsed.typed, lines=parsed.lines)
    except ConfigError as exc:
        raise exc.located(source) from None
    findings = check_network(config) if isinstance(config, NetworkConfig) else check_broker(config)
    if findings:
        raise ConfigError(
            Problem(
                message,
                path=path,
                file=source,
                line=line_for(parsed.lines, raw_path(cls, path, typed=parsed.typed)),
            )
            for path, message in findings
        )
    return config


def _guess_kind(tree: object) -> Kind:
    # A network config always has `brokers`; a broker's own file always has `identity`.
    if isinstance(tree, dict) and "brokers" in tree:
        return "network"
    return "broker" if isinstance(tree, dict) and "identity" in tree else "network"


@overload
def load(path: str | os.PathLike[str], *, kind: Literal["network"]) -> NetworkConfig: ...
@overload
def load(path: str | os.PathLike[str], *, kind: Literal["broker"]) -> BrokerConfig: ...
@overload
def load(path: str | os.PathLike[str], *, kind: None = None) -> Config: ...
def load(path: str | os.PathLike[str], *, kind: Kind | None = None) -> Config:
    """Load a config file; its format comes from the extension."""
    source = str(path)
    fmt = format_of(source)
    data = read_bounded(Path(path))
    return loads(data, fmt, kind=kind, source=source)


def read_bounded(path: Path) -> bytes:
    """Read a config file, refusing an oversized one before reading it all."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError.single(f"cannot read: {exc.strerror}", file=str(path)) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError.single(f"file is over the {MAX_CONFIG_BYTES}-byte limit", file=str(path))
    return data


def dumps(config: Config, fmt: Format) -> bytes:
    typed = fmt in ("json", "yaml")
    return render(to_tree(config, typed=typed), fmt, kind=kind_of(config))


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Write a file so readers see the old or the new content, never a mix (temp, fsync, rename)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
