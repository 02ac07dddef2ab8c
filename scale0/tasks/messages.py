"""Shared shapes of the coordinator: ids, settings, change sets, snapshots, messages to nodes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scale0.tasks.errors import ErrorCode, Refused
from scale0.tasks.model import NodeRecord, TaskRecord

__all__ = [
    "ID_PATTERN",
    "POLL_BATCH",
    "TASK_CREATE_FIELDS",
    "Changes",
    "Settings",
    "Snapshot",
    "assignment",
    "check_id",
    "create_fields",
    "iter_create_fields",
    "new_task_message",
    "notification",
    "parse_attempts",
    "task_run",
]

ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
#: Messages handed to one node per poll at most (the rest wait for the next poll).
POLL_BATCH: Final = 200

TASK_CREATE_FIELDS: Final = (
    "name",
    "name_pretty",
    "parent",
    "executable_pyscript",
    "requirements",
    "repositories",
    "environment",
)


def check_id(value: object, what: str) -> str:
    """B1: ``value`` as an id, or Refused(INVALID_ID) naming ``what``."""
    if not isinstance(value, str) or ID_PATTERN.fullmatch(value) is None:
        raise Refused(
            ErrorCode.INVALID_ID,
            f"{what} {value!r} is not valid: 1-128 of A-Z a-z 0-9 . _ : @ + - "
            "starting with a letter or digit",
        )
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    """The coordinator's tunables (docs/tasks.md §9)."""

    node_timeout_s: float = 10.0
    resend_s: float = 5.0
    node_status_interval_s: float = 30.0


@dataclass(slots=True)
class Changes:
    """What one operation changed: the store writes it in one transaction."""

    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord | None] = field(default_factory=dict)
    clients: dict[str, float | None] = field(default_factory=dict)
    refusals: list[dict[str, Any]] = field(default_factory=list)
    #: Every change of a task's state, in order: (the record before, or None: new; after).
    transitions: list[tuple[TaskRecord | None, TaskRecord]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tasks or self.nodes or self.clients or self.refusals)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a store holds, as loaded at start."""

    tasks: tuple[TaskRecord, ...] = ()
    nodes: tuple[NodeRecord, ...] = ()
    clients: Mapping[str, float] = field(default_factory=dict)
    refusals: int = 0


def task_run(task: TaskRecord) -> dict[str, Any]:
    """The vespid task-run command for ``task``'s current attempt."""
    path = f"{task.name}/{task.attempt}"
    return {
        "command": "task-run",
        "name": task.name,
        "executable_pyscript": task.executable_pyscript,
        "path": path,
        "log": f"{path}/task.log",
        "attempt": task.attempt,
        "environment": task.environment,
    }


def create_fields(task: TaskRecord) -> tuple[Any, ...]:
    return (
        task.name,
        task.name_pretty,
        task.parent,
        task.executable_pyscript,
        task.requirements,
        task.repositories,
        task.environment,
    )


def notification(method: str, params: list[Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def new_task_message(task: TaskRecord) -> dict[str, Any]:
    return notification("zerotask.node.broker_new_task", [task.method, task.name])


def assignment(task: TaskRecord) -> dict[str, Any]:
    return {"method": task.method, "params": task.params, "id": task.name, "attempt": task.attempt}


def parse_attempts(active: object) -> set[tuple[str, int]]:
    """A node's ``active`` list: [[task, attempt], ...] (malformed entries are Refused)."""
    if active is None:
        return set()
    if not isinstance(active, list):
        raise Refused(ErrorCode.INVALID_PARAMS, "active must be a list of [task, attempt]")
    held: set[tuple[str, int]] = set()
    for entry in active:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], int)
            or isinstance(entry[1], bool)
        ):
            raise Refused(
                ErrorCode.INVALID_PARAMS, f"active entry {entry!r} is not [task, attempt]"
            )
        held.add((entry[0], entry[1]))
    return held


def iter_create_fields(task: TaskRecord) -> Iterable[tuple[str, Any]]:
    """The task-create fields of ``task``, in the protocol's order."""
    return zip(TASK_CREATE_FIELDS, create_fields(task), strict=True)
