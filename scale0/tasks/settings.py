"""The coordinator's and the node's config files (YAML or JSON): checked, errors name the field.

docs/tasks.md §9 lists every key. Unknown keys are errors (a typo must not silently fall back
to a default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scale0.config.errors import ConfigError
from scale0.config.loader import load
from scale0.config.model import Admin
from scale0.tasks.messages import ID_PATTERN, Settings
from scale0.tasks.placement import SpecError, parse_capabilities, parse_node_repositories
from scale0.tasks.zerotask import MAX_WAIT_MS

__all__ = ["ConfigFileError", "CoordinatorConfig", "NodeConfig", "load_coordinator", "load_node"]


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    endpoint: str
    data_dir: Path
    database: str | None = None
    admins: tuple[Admin, ...] | None = None
    submit_roles: tuple[str, ...] = ("admin",)
    zerotask_service: str = "zerotask"
    vespid_service: str = "vespid"
    capacity: int = 4096
    heartbeat_interval_s: float = 0.1
    tick_s: float = 0.25
    settings: Settings = field(default_factory=Settings)
    #: The status page and /metrics (docs/tasks.md §11.2): None is off, 0 picks a free port.
    http_port: int | None = None
    http_address: str = "127.0.0.1"
    #: Where the coordinator writes its event log (docs/trend.md): every task transition.
    event_log_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class NodeConfig:
    name: str
    endpoint: str
    path: Path
    zerotask_service: str = "zerotask"
    vespid_service: str = "vespid"
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    repositories: Mapping[str, Any] = field(default_factory=dict)
    methods: Mapping[str, str] = field(default_factory=dict)
    slots: int = 4
    poll_wait_ms: int = 500
    max_wall_s: float = 3600.0
    max_memory_mb: int | None = None
    max_log_mb: float = 64.0
    python: str | None = None
    timeout_s: float = 5.0


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: not YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: must be a mapping of keys to values")
    return data


class _Fields:
    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self.used: set[str] = set()

    def fail(self, key: str, message: str) -> ConfigFileError:
        return ConfigFileError(f"{self.path}: {key}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.fail(key, "is required")
            return default
        value = self.data[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(key, f"must be {_kind_name(kind)}, not {value!r}")
        if not isinstance(value, kind):
            raise self.fail(key, f"must be {_kind_name(kind)}, not {value!r}")
        return value

    def positive(self, key: str, default: float) -> float:
        value = float(self.get(key, (int, float), default))
        if value <= 0:
            raise self.fail(key, f"must be > 0, not {value!r}")
        return value

    def endpoint(self) -> str:
        value = str(self.get("endpoint", str))
        if not value.startswith(("tcp://", "ipc://", "inproc://")):
            raise self.fail(
                "endpoint", f"must be a ZeroMQ endpoint like tcp://host:port: {value!r}"
            )
        return value

    def relative_path(self, key: str, default: Any = ...) -> Path:
        value = Path(str(self.get(key, str, default)))
        return value if value.is_absolute() else (self.path.parent / value)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(unknown[0], "unknown key")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {
            "str": "a string",
            "int": "a whole number",
            "float": "a number",
            "dict": "a mapping",
            "bool": "true/false",
        }.get(k.__name__, k.__name__)
        for k in kinds
    )


def _admins(fields: _Fields) -> tuple[Admin, ...] | None:
    """``admins_from``: the network config whose admins may create tasks (A1)."""
    if fields.data.get("admins_from") is None:
        fields.used.add("admins_from")
        return None
    source = fields.relative_path("admins_from")
    try:
        network = load(source, kind="network")
    except (ConfigError, OSError) as exc:
        raise fields.fail("admins_from", f"cannot load {source}: {exc}") from None
    return network.admins


def _roles(fields: _Fields) -> tuple[str, ...]:
    roles = fields.get("submit_roles", list, ["admin"])
    if not roles or not all(role in {"admin", "read"} for role in roles):
        raise fields.fail("submit_roles", f"must be a non-empty list of admin/read, not {roles!r}")
    return tuple(roles)


def _http_port(fields: _Fields) -> int | None:
    port: int | None = fields.get("http_port", int, None)
    if port is not None and not 0 <= port <= 65535:
        raise fields.fail("http_port", f"must be 0-65535 (0 picks a free port), not {port!r}")
    return port


def load_coordinator(path: Path) -> CoordinatorConfig:
    """Read and check a scale0-coordinator config file."""
    fields = _Fields(path, _read(path))
    config = CoordinatorConfig(
        endpoint=fields.endpoint(),
        data_dir=fields.relative_path("data_dir"),
        database=fields.get("database", str, None),
        admins=_admins(fields),
        submit_roles=_roles(fields),
        zerotask_service=fields.get("zerotask_service", str, "zerotask"),
        vespid_service=fields.get("vespid_service", str, "vespid"),
        capacity=int(fields.positive("capacity", 4096)),
        heartbeat_interval_s=fields.positive("heartbeat_interval_s", 0.1),
        tick_s=fields.positive("tick_s", 0.25),
        settings=Settings(
            node_timeout_s=fields.positive("node_timeout_s", 10.0),
            resend_s=fields.positive("resend_s", 5.0),
            node_status_interval_s=fields.positive("node_status_interval_s", 30.0),
        ),
        http_port=_http_port(fields),
        http_address=fields.get("http_address", str, "127.0.0.1"),
        event_log_dir=(
            fields.relative_path("event_log_dir") if "event_log_dir" in fields.data else None
        ),
    )
    fields.done()
    return config


def load_node(path: Path) -> NodeConfig:
    """Read and check a scale0-node config file."""
    fields = _Fields(path, _read(path))
    name = fields.get("name", str)
    if ID_PATTERN.fullmatch(name) is None:
        raise fields.fail("name", f"{name!r} is not a valid node id")
    capabilities = fields.get("capabilities", dict, {})
    repositories = fields.get("repositories", dict, {})
    try:
        parse_capabilities(capabilities)
        parse_node_repositories(repositories)
    except SpecError as exc:
        raise fields.fail(exc.field, str(exc).split(": ", 1)[1]) from None
    methods = fields.get("methods", dict, {})
    for method, target in methods.items():
        if not isinstance(target, str) or ":" not in target:
            raise fields.fail(f"methods.{method}", f"must be 'module:function', not {target!r}")
    poll_wait_ms = int(fields.positive("poll_wait_ms", 500))
    if poll_wait_ms > MAX_WAIT_MS:
        raise fields.fail("poll_wait_ms", f"must be at most {MAX_WAIT_MS}")
    memory = fields.get("max_memory_mb", int, None)
    if memory is not None and memory <= 0:
        raise fields.fail("max_memory_mb", "must be > 0")
    config = NodeConfig(
        name=name,
        endpoint=fields.endpoint(),
        path=fields.relative_path("path"),
        zerotask_service=fields.get("zerotask_service", str, "zerotask"),
        vespid_service=fields.get("vespid_service", str, "vespid"),
        capabilities=capabilities,
        repositories=repositories,
        methods=methods,
        slots=int(fields.positive("slots", 4)),
        poll_wait_ms=poll_wait_ms,
        max_wall_s=fields.positive("max_wall_s", 3600.0),
        max_memory_mb=memory,
        max_log_mb=fields.positive("max_log_mb", 64.0),
        python=fields.get("python", str, None),
        timeout_s=fields.positive("timeout_s", 5.0),
    )
    fields.done()
    return config
