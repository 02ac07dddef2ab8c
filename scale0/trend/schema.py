"""The event record schema (version 1): its fields, kinds and a validator; docs/trend.md mirrors it.

One record is one JSON object on one line. Every record carries ``v`` (the schema version),
``ts_ms``, ``kind`` and ``broker``; the other fields are present only for the kinds that use
them. The field table here is the one source of truth: the writer orders fields by it, the Spark
job builds its explicit schema from it, and a test checks docs/trend.md lists every field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

SCHEMA_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str  # "string" | "long" | "int" | "double" | "array<string>" (Spark's spelling)
    doc: str


FIELDS: Final[tuple[Field, ...]] = (
    Field("v", "int", "Schema version of this record (1). Always present."),
    Field("ts_ms", "long", "When it happened, ms since the Unix epoch, UTC (a request: its end)."),
    Field("kind", "string", "What happened: one of the kinds below. Always present."),
    Field("broker", "string", "Identity of the broker (or coordinator) that wrote it."),
    Field("service", "string", "Service name (request)."),
    Field("worker", "string", "Worker id (request, worker_join/leave, heartbeat_gap)."),
    Field("client", "string", "Client id, hex of its routing id (request)."),
    Field("forwarded_from", "string", "Broker that forwarded the request here, else absent."),
    Field("received_ms", "long", "When the request arrived, ms since the epoch (request)."),
    Field("latency_ms", "double", "Arrival to reply, in ms (request)."),
    Field("bytes_in", "long", "Request body bytes (request)."),
    Field("bytes_out", "long", "Reply body bytes (request)."),
    Field("status", "int", "Reply status: 200 ok, 4xx/5xx failures (request)."),
    Field("attempts", "int", "Dispatches to workers; >1 after a lost worker (request)."),
    Field("services", "array<string>", "Services the worker announced (worker_join)."),
    Field("peer", "string", "The other broker (peer_up, peer_down, heartbeat_gap of a peer)."),
    Field(
        "gap_ms",
        "long",
        "Silence that ended at ts_ms (heartbeat_gap) or led to it (worker_leave, peer_down): "
        "the subject counts as down from ts_ms - gap_ms.",
    ),
    Field("reason", "string", "Why (worker_leave, peer_down, config_refused, state_change)."),
    Field("state", "string", "New state (state_change, task)."),
    Field("prev_state", "string", "Previous state (state_change, task)."),
    Field("config_version", "long", "Network config version (config_applied/refused)."),
    Field("sha256", "string", "sha256 of the canonical config (config_applied/refused)."),
    Field("user", "string", "Who sent the management command (mgmt_command)."),
    Field("command", "string", "The management command (mgmt_command)."),
    Field("result", "string", "Its outcome: ok, denied, error... (mgmt_command)."),
    Field("task_id", "string", "Task id (task)."),
)

FIELD_NAMES: Final = tuple(f.name for f in FIELDS)
REQUIRED: Final = ("v", "ts_ms", "kind", "broker")

# kind -> (doc, fields it must carry beyond REQUIRED). Kinds not listed are a newer schema's.
KINDS: Final[Mapping[str, tuple[str, tuple[str, ...]]]] = {
    "request": (
        "A finished request: answered, failed or expired, at this broker.",
        ("service", "received_ms", "latency_ms", "bytes_in", "bytes_out", "status", "attempts"),
    ),
    "worker_join": ("A worker registered (READY).", ("worker",)),
    "worker_leave": (
        "A worker left: reason disconnect, expired (heartbeats stopped) or shutdown.",
        ("worker", "reason"),
    ),
    "heartbeat_gap": (
        "Heartbeats from a worker (or a peer) resumed after more than the liveness interval.",
        ("gap_ms",),
    ),
    "peer_up": ("A peer broker became reachable (HELLO / heartbeats resumed).", ("peer",)),
    "peer_down": ("A peer broker was declared dead or cut off.", ("peer",)),
    "broker_start": ("This broker started serving.", ()),
    "broker_stop": ("This broker stopped cleanly.", ()),
    "state_change": ("This broker changed state (e.g. enabled -> disabled).", ("state",)),
    "config_applied": ("A network config version was applied.", ("config_version",)),
    "config_refused": ("A network config version was refused.", ("config_version", "reason")),
    "mgmt_command": ("A management command ran.", ("user", "command", "result")),
    "task": ("A task changed state (queued, running, done, failed).", ("task_id", "state")),
}

_PY_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "string": (str,),
    "long": (int,),
    "int": (int,),
    "double": (int, float),
    "array<string>": (list,),
}
_TYPES: Final = {f.name: f.type for f in FIELDS}


def validate_record(record: Mapping[str, object]) -> list[str]:
    """Problems with one decoded record under schema version 1, each naming the field; [] if none.

    A record whose ``v`` is higher is not judged (its reader must say it is newer)."""
    problems: list[str] = []
    version = record.get("v")
    if type(version) is not int:
        return ["v: missing or not an integer"]
    if version > SCHEMA_VERSION:
        return []
    for name in REQUIRED:
        if record.get(name) is None:
            problems.append(f"{name}: missing")
    for name, value in record.items():
        kind_of = _TYPES.get(name)
        if kind_of is None:
            problems.append(f"{name}: not a field of schema version {SCHEMA_VERSION}")
        elif value is not None and (
            type(value) is bool or not isinstance(value, _PY_TYPES[kind_of])
        ):
            problems.append(f"{name}: expected {kind_of}, got {type(value).__name__}")
        elif (
            kind_of == "array<string>"
            and isinstance(value, list)
            and not all(isinstance(item, str) for item in value)
        ):
            problems.append(f"{name}: expected a list of strings")
    kind = record.get("kind")
    if isinstance(kind, str):
        spec = KINDS.get(kind)
        if spec is None:
            problems.append(f"kind: unknown kind {kind!r}")
        else:
            problems.extend(
                f"{name}: missing for kind {kind}" for name in spec[1] if record.get(name) is None
            )
    return problems


def is_error(status: int) -> bool:
    """A request failed when its status is 400 or more (docs/protocol.md status codes)."""
    return status >= 400
