"""The one task model behind both task protocols: states, events, the transition table, records.

Rules (docs/tasks.md §2 is the prose; tests/tasks/test_model.py asserts each):

T1  A task is created WAITING when it names a parent that is not complete, PENDING otherwise.
    A parent that completed with ``error``, ``fatal`` or ``terminated`` makes a new child
    COMPLETE with success ``terminated`` at once (T3).
T2  WAITING --PARENT_OK--> PENDING when the parent completes with ``ok`` or ``warning``.
T3  WAITING --PARENT_FAILED--> COMPLETE (success ``terminated``) when the parent completes worse.
T4  PENDING --ASSIGN--> RUNNING: the attempt number goes up by one and the task is held by one
    node (a vespid task is placed by the coordinator; a zerotask task goes to the first node
    that asks for it with ``node_task_request``).
T5  RUNNING --STATUS--> RUNNING: a status report of the current attempt is stored.
T6  RUNNING --FINISH--> COMPLETE: the result (or error) of the current attempt is stored.
T7  RUNNING --NODE_LOST--> PENDING: the holder missed its heartbeats, disconnected or did not
    come back after a coordinator restart; the next ASSIGN is a new attempt (a re-run).
T8  WAITING, PENDING or RUNNING --CANCEL--> COMPLETE (success ``terminated``); a running
    attempt is told to stop.
T9  COMPLETE is final: every event on it is refused.
T10 Any (state, event) pair not in TRANSITIONS is refused and changes nothing.

Fencing and severity:

F1  A report (STATUS or FINISH) names the task, the attempt and the node. It is accepted only
    when the task is RUNNING, the attempt is the current one and the node is the holder.
F2  A FINISH that repeats the one that completed the task (same attempt, same node) is
    acknowledged and changes nothing (a resend after a lost reply or a coordinator restart).
F3  Every other report is refused and recorded (the task's ``refused`` count and the store's
    refusal log): a stale attempt can never complete a task a second time.
S1  ``success`` only ever rises in severity (ok < warning < error < fatal < terminated).
S2  ``ok`` is only ever set by FINISH: a running task shows null or something worse than ok.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Final

__all__ = [
    "TERMINAL_FAILURES",
    "TRANSITIONS",
    "Event",
    "NodeRecord",
    "Protocol",
    "Severity",
    "TaskRecord",
    "TaskState",
    "raise_severity",
    "severity_from",
    "step",
    "trend_state",
]


class TaskState(Enum):
    """Where a task is in its life (docs/tasks.md §2)."""

    WAITING = "waiting"
    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"


class Event(Enum):
    """What may happen to a task, and who causes it (docs/tasks.md §2)."""

    PARENT_OK = "parent_ok"  # coordinator, when the parent completes ok or warning
    PARENT_FAILED = "parent_failed"  # coordinator, when the parent completes worse
    ASSIGN = "assign"  # coordinator placement (vespid) or node_task_request (zerotask)
    STATUS = "status"  # node: task_status
    FINISH = "finish"  # node: node_task_finished, node_task_failed, task-complete
    NODE_LOST = "node_lost"  # coordinator: heartbeats missed, disconnect, restart
    CANCEL = "cancel"  # client or operator


#: The whole state machine (T2-T8); everything absent is refused (T9, T10).
TRANSITIONS: Final[dict[tuple[TaskState, Event], TaskState]] = {
    (TaskState.WAITING, Event.PARENT_OK): TaskState.PENDING,
    (TaskState.WAITING, Event.PARENT_FAILED): TaskState.COMPLETE,
    (TaskState.WAITING, Event.CANCEL): TaskState.COMPLETE,
    (TaskState.PENDING, Event.ASSIGN): TaskState.RUNNING,
    (TaskState.PENDING, Event.CANCEL): TaskState.COMPLETE,
    (TaskState.RUNNING, Event.STATUS): TaskState.RUNNING,
    (TaskState.RUNNING, Event.FINISH): TaskState.COMPLETE,
    (TaskState.RUNNING, Event.NODE_LOST): TaskState.PENDING,
    (TaskState.RUNNING, Event.CANCEL): TaskState.COMPLETE,
}


def trend_state(task: TaskRecord) -> str:
    """A task's state as the event log names it (docs/trend.md, kind ``task``): ``queued``
    (waiting or pending), ``running``, or, once complete, ``done`` (success ok or warning) or
    ``failed`` (error, fatal, terminated)."""
    if task.state is TaskState.RUNNING:
        return "running"
    if task.state is not TaskState.COMPLETE:
        return "queued"
    return "done" if task.success in (None, Severity.OK, Severity.WARNING) else "failed"


def step(state: TaskState, event: Event) -> TaskState | None:
    """The state after ``event`` in ``state``, or None when the event is refused (T9, T10)."""
    return TRANSITIONS.get((state, event))


class Severity(IntEnum):
    """vespid ``success`` values, ordered by severity (S1)."""

    OK = 0
    WARNING = 1
    ERROR = 2
    FATAL = 3
    TERMINATED = 4

    @property
    def label(self) -> str:
        return self.name.lower()


#: A parent that completed with one of these terminates its waiting children (T3).
TERMINAL_FAILURES: Final = frozenset({Severity.ERROR, Severity.FATAL, Severity.TERMINATED})

_SEVERITY_BY_LABEL: Final = {severity.label: severity for severity in Severity}


def severity_from(label: object) -> Severity | None:
    """The Severity named ``label`` ("ok", "warning"...), None for anything else."""
    if isinstance(label, str):
        return _SEVERITY_BY_LABEL.get(label)
    return None


def raise_severity(current: Severity | None, reported: Severity) -> Severity:
    """S1: the more severe of the two."""
    return reported if current is None or reported > current else current


class Protocol(Enum):
    """Which protocol created a task (it decides how the task reaches a node)."""

    ZEROTASK = "zerotask"
    VESPID = "vespid"


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task as stored: everything both protocols show about it."""

    name: str
    protocol: Protocol
    state: TaskState
    time_create: float
    owner: str | None = None
    # zerotask
    method: str | None = None
    params: Any = None
    # vespid
    name_pretty: str | None = None
    parent: str | None = None
    executable_pyscript: str | None = None
    requirements: dict[str, Any] = field(default_factory=dict)
    repositories: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    # life
    attempt: int = 0
    node: str | None = None
    reserved_memory: int = 0
    reserved_cores: int = 0
    time_start: float | None = None
    time_finish: float | None = None
    time_assign: float | None = None
    success: Severity | None = None
    status: Any = None
    status_kwargs: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    error: dict[str, Any] | None = None
    explain: str | None = None
    finished_attempt: int = 0
    finished_node: str | None = None
    reruns: int = 0
    refused: int = 0

    def to_json(self) -> dict[str, Any]:
        """The stored form (plain JSON types): the fields that differ from their defaults
        (:meth:`from_json` restores the others), so a short task stores a short text. Shallow:
        the nested values (params, result...) are the record's own, which nothing changes in
        place (records are replaced whole)."""
        data: dict[str, Any] = {}
        for name, default in _TASK_DEFAULTS:
            value = getattr(self, name)
            if value is not default and value != default:
                data[name] = value
        data["protocol"] = self.protocol.value
        data["state"] = self.state.value
        if self.success is not None:
            data["success"] = self.success.label
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRecord:
        """Inverse of :meth:`to_json` (the store's own data: trusted, but checked by type)."""
        values = dict(data)
        values["protocol"] = Protocol(values["protocol"])
        values["state"] = TaskState(values["state"])
        values["success"] = severity_from(values.get("success"))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in names})


#: (name, default) of every TaskRecord field; no default (the required ones): always stored.
_TASK_DEFAULTS: Final = tuple(
    (
        f.name,
        f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
    )
    for f in dataclasses.fields(TaskRecord)
)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node as stored: what it said about itself in node_connect / node-set."""

    name: str
    memory: int = 0
    cores: int = 0
    prefer: dict[str, float] = field(default_factory=dict)
    ephemeral: bool = False
    repositories: dict[str, dict[str, Any]] = field(default_factory=dict)
    methods: tuple[str, ...] = ()
    connected: bool = True
    zerotask: bool = False
    time_connect: float = 0.0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["methods"] = list(self.methods)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeRecord:
        values = dict(data)
        values["methods"] = tuple(values.get("methods", ()))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in names})
