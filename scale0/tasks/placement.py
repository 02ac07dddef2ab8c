"""Placement: which node runs a vespid task, from its requirements and the nodes' capabilities.

Rules (docs/tasks.md §4; tests/tasks/test_placement.py asserts each):

P1  A node fits when it is connected, its free memory (capability minus what running tasks
    reserved) is at least ``memory`` and its free cores at least ``cores``.
P2  ``usage_require_<project>`` (truthy) is a hard filter: only nodes whose capabilities carry
    ``usage_prefer_<project>`` (truthy) may run the task.
P3  A repository marked ``"local": true`` is a hard filter: the node must already hold it. A
    node holds repository NAME when one of its repositories has ``type`` equal to the task's
    ``request`` (when given) or a path whose last part is NAME (when not). Repositories without
    ``local`` are fetched by the task itself; nodes holding them are merely preferred.
P4  Among the fitting nodes the best is, in order: most ``usage_prefer_*`` matches (weighted by
    the node's value), not ``usage_ephemeral``, most repositories held, most free memory after
    placement, then the name (so placement is deterministic).
P5  The task reserves ``memory`` and ``max(cores, min(cores_max, free cores))`` cores on that
    node until it completes or its node is lost.
P6  A task no node fits stays PENDING and says why: one line per node, and "no node could ever
    run it" when even an idle node of the family's largest capabilities would not fit.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from scale0.tasks.model import NodeRecord

__all__ = [
    "MAX_CORES",
    "MAX_MEMORY_MB",
    "NodeLoad",
    "Placed",
    "Requirements",
    "SpecError",
    "Unplaced",
    "parse_capabilities",
    "parse_node_repositories",
    "parse_requirements",
    "place",
    "verdicts",
]

MAX_MEMORY_MB: Final = 1 << 40
MAX_CORES: Final = 1 << 16
REQUIRE_PREFIX: Final = "usage_require_"
PREFER_PREFIX: Final = "usage_prefer_"


class SpecError(ValueError):
    """A task or node description that is wrong; ``field`` names where."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def _count(raw: Mapping[str, Any], key: str, where: str, default: int, maximum: int) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise SpecError(f"{where}.{key}", f"must be a whole number, not {value!r}")
    if not 0 <= value <= maximum:
        raise SpecError(f"{where}.{key}", f"must be 0..{maximum}, not {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class RepositoryNeed:
    """One entry of a task's ``repositories``."""

    name: str
    request: str | None
    local: bool


@dataclass(frozen=True, slots=True)
class Requirements:
    """A vespid task's ``requirements`` and ``repositories``, checked."""

    memory: int = 0
    cores: int = 1
    cores_max: int | None = None
    require: frozenset[str] = frozenset()
    prefer: frozenset[str] = frozenset()
    repositories: tuple[RepositoryNeed, ...] = ()


def parse_requirements(raw: object, repositories: object = None) -> Requirements:
    """Check a task's ``requirements`` and ``repositories`` objects (SpecError names the field)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError("requirements", "must be an object")
    memory = _count(raw, "memory", "requirements", 0, MAX_MEMORY_MB)
    cores = _count(raw, "cores", "requirements", 1, MAX_CORES)
    cores_max: int | None = None
    if raw.get("cores_max") is not None:
        cores_max = _count(raw, "cores_max", "requirements", cores, MAX_CORES)
        if cores_max < cores:
            raise SpecError("requirements.cores_max", f"{cores_max} is less than cores {cores}")
    require: set[str] = set()
    prefer: set[str] = set()
    for key, value in raw.items():
        if not isinstance(key, str):
            raise SpecError("requirements", f"key {key!r} is not a string")
        if key in {"memory", "cores", "cores_max"}:
            continue
        if key.startswith(REQUIRE_PREFIX) and len(key) > len(REQUIRE_PREFIX):
            target = require
        elif key.startswith(PREFER_PREFIX) and len(key) > len(PREFER_PREFIX):
            target = prefer
        else:
            raise SpecError(f"requirements.{key}", "unknown requirement")
        if not isinstance(value, bool | int | float):
            raise SpecError(f"requirements.{key}", f"must be true/false or a number, not {value!r}")
        if value:
            target.add(key.split("_", 2)[2])
    return Requirements(
        memory, cores, cores_max, frozenset(require), frozenset(prefer), _needs(repositories)
    )


def _needs(raw: object) -> tuple[RepositoryNeed, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise SpecError("repositories", "must be an object")
    needs = []
    for name, spec in sorted(raw.items()):
        where = f"repositories.{name}"
        if not isinstance(spec, dict):
            raise SpecError(where, "must be an object")
        request = spec.get("request")
        if request is not None and (not isinstance(request, str) or not request):
            raise SpecError(f"{where}.request", "must be a non-empty string")
        local = spec.get("local", False)
        if not isinstance(local, bool):
            raise SpecError(f"{where}.local", "must be true or false")
        unknown = set(spec) - {"request", "local"}
        if unknown:
            raise SpecError(f"{where}.{sorted(unknown)[0]}", "unknown key")
        needs.append(RepositoryNeed(name, request, local))
    return tuple(needs)


def parse_capabilities(raw: object) -> tuple[int, int, dict[str, float], bool]:
    """A node's ``capabilities``: (memory MB, cores, {project: preference weight}, ephemeral)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError("capabilities", "must be an object")
    memory = _count(raw, "memory", "capabilities", 0, MAX_MEMORY_MB)
    cores = _count(raw, "cores", "capabilities", 0, MAX_CORES)
    ephemeral = raw.get("usage_ephemeral", False)
    if not isinstance(ephemeral, bool):
        raise SpecError("capabilities.usage_ephemeral", "must be true or false")
    prefer: dict[str, float] = {}
    for key, value in raw.items():
        if key in {"memory", "cores", "usage_ephemeral"}:
            continue
        if not (isinstance(key, str) and key.startswith(PREFER_PREFIX) and len(key) > 13):
            raise SpecError(f"capabilities.{key}", "unknown capability")
        if not isinstance(value, bool | int | float):
            raise SpecError(f"capabilities.{key}", f"must be true/false or a number: {value!r}")
        if value:
            prefer[key[len(PREFER_PREFIX) :]] = float(value)
    return memory, cores, prefer, ephemeral


def parse_node_repositories(raw: object) -> dict[str, dict[str, Any]]:
    """A node's ``repositories``: {path: {type, persist}}."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError("repositories", "must be an object")
    checked: dict[str, dict[str, Any]] = {}
    for path, spec in raw.items():
        where = f"repositories.{path}"
        if not isinstance(spec, dict):
            raise SpecError(where, "must be an object")
        kind = spec.get("type")
        if kind is not None and not isinstance(kind, str):
            raise SpecError(f"{where}.type", "must be a string")
        persist = spec.get("persist", False)
        if not isinstance(persist, bool):
            raise SpecError(f"{where}.persist", "must be true or false")
        checked[str(path)] = {"type": kind, "persist": persist}
    return checked


def holds(node: NodeRecord, need: RepositoryNeed) -> bool:
    """P3: does ``node`` hold the repository ``need`` names?"""
    for path, spec in node.repositories.items():
        if need.request is not None:
            if spec.get("type") == need.request:
                return True
        elif posixpath.basename(path.rstrip("/")) == need.name:
            return True
    return False


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A node and what its running tasks reserve; ``alive`` is false for a disconnected node."""

    record: NodeRecord
    used_memory: int = 0
    used_cores: int = 0
    alive: bool = True

    @property
    def free_memory(self) -> int:
        return self.record.memory - self.used_memory

    @property
    def free_cores(self) -> int:
        return self.record.cores - self.used_cores


@dataclass(frozen=True, slots=True)
class Placed:
    node: str
    memory: int
    cores: int


@dataclass(frozen=True, slots=True)
class Unplaced:
    reason: str
    never: bool


def _unfit(load: NodeLoad, req: Requirements, idle: bool) -> str | None:
    """Why ``load`` cannot take the task now (idle: as if nothing ran there), None if it can."""
    node = load.record
    free_memory = node.memory if idle else load.free_memory
    free_cores = node.cores if idle else load.free_cores
    missing = sorted(project for project in req.require if node.prefer.get(project, 0) <= 0)
    if missing:
        return f"lacks usage_prefer_{missing[0]} (required by usage_require_{missing[0]})"
    for need in req.repositories:
        if need.local and not holds(node, need):
            what = f"of type {need.request!r}" if need.request else "by that name"
            return f"does not hold local repository {need.name!r} ({what})"
    if free_memory < req.memory:
        return f"needs {req.memory} MB memory, {free_memory} free of {node.memory}"
    if free_cores < req.cores:
        return f"needs {req.cores} cores, {free_cores} free of {node.cores}"
    return None


def verdicts(req: Requirements, nodes: Sequence[NodeLoad]) -> list[tuple[str, str | None, bool]]:
    """P6 per node, by name: (node, why it cannot take the task now or None if it can, whether
    it could when idle). The reasons are those of :func:`place`'s explanation."""
    result: list[tuple[str, str | None, bool]] = []
    for load in sorted(nodes, key=lambda item: item.record.name):
        if not load.alive:
            result.append((load.record.name, "not connected", False))
            continue
        result.append(
            (load.record.name, _unfit(load, req, idle=False), _unfit(load, req, idle=True) is None)
        )
    return result


def place(req: Requirements, nodes: Sequence[NodeLoad]) -> Placed | Unplaced:
    """P1-P6: the node to run a task with ``req``, or why there is none."""
    fitting: list[tuple[tuple[float, int, int, int, str], NodeLoad]] = []
    reasons: list[str] = []
    for load in sorted(nodes, key=lambda item: item.record.name):
        node = load.record
        if not load.alive:
            reasons.append(f"node {node.name}: not connected")
            continue
        why = _unfit(load, req, idle=False)
        if why is not None:
            reasons.append(f"node {node.name}: {why}")
            continue
        preference = sum(node.prefer.get(project, 0.0) for project in req.prefer)
        held = sum(1 for need in req.repositories if holds(node, need))
        key = (
            -preference,
            1 if node.ephemeral else 0,
            -held,
            -(load.free_memory - req.memory),
            node.name,
        )
        fitting.append((key, load))
    if fitting:
        fitting.sort(key=lambda item: item[0])
        best = fitting[0][1]
        cores = req.cores
        if req.cores_max is not None:
            cores = max(req.cores, min(req.cores_max, best.free_cores))
        return Placed(best.record.name, req.memory, cores)
    never = all(_unfit(load, req, idle=True) is not None for load in nodes)
    if not nodes:
        return Unplaced("no node is connected", never=False)
    head = "no node could ever run it" if never else "no node has room now"
    return Unplaced(f"{head}: " + "; ".join(reasons), never=never)
