"""The coordinator's decisions: every task, node and client, and each operation on them (pure).

:class:`Book` holds the state in memory, applies the state machine of :mod:`scale0.tasks.model`
and the placement of :mod:`scale0.tasks.placement`, and records what each operation changed
(:meth:`Book.take_changes`) so the process writes it to the store in one transaction before it
answers. Time (``now``) and new ids are passed in; nothing here reads a clock or a socket.

Node traffic (docs/tasks.md §8): what the coordinator "publishes" to a node waits in that node's
outbox and leaves with the node's next ``zerotask.broker.node_poll``.

Rules beyond model.py's T/F/S and placement.py's P:

B1  Ids (client, node, task) match ID_PATTERN; anything else is INVALID_ID.
B2  An id in use is ID_TAKEN, except a create identical to the stored one from the same owner,
    which is answered as a success (a resend whose first reply was lost).
B3  A node not heard from (any call naming it) for ``node_timeout_s`` is lost: its running
    tasks go back to PENDING (T7). After a restart every stored node has ``node_timeout_s``
    from the restart to be heard from again.
B4  A node's poll lists the attempts it holds (running or with an unacknowledged report). A
    task the coordinator has RUNNING on that node, assigned more than ``resend_s`` ago and not
    in that list, is sent again (task-run, or broker_new_task for zerotask).
B5  vespid tasks are placed by the coordinator (P1-P6) whenever a task, a node or free room
    appears; zerotask tasks are announced to every zerotask node whose method list (from
    node_status) is empty or names the method, and go to the first that asks.
B6  A node's poll announces tasks announced to no node yet first; a task already announced
    to another node is announced to this one only once it has stayed pending for
    ANNOUNCE_SPREAD_S after its first announcement (nobody took it). A poll that gives
    ``room`` (how many more zerotask calls the node would start now) gets at most that many
    announcements, and a parked poll with room 0 is not woken for announcements. So a busy
    family announces each task about once, and an idle node still gets what a busy one holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

from scale0.tasks.auth import Authorizer
from scale0.tasks.errors import ErrorCode, Refused
from scale0.tasks.messages import (
    ID_PATTERN,
    POLL_BATCH,
    Changes,
    Settings,
    Snapshot,
    assignment,
    check_id,
    create_fields,
    new_task_message,
    notification,
    parse_attempts,
    task_run,
)
from scale0.tasks.model import (
    TERMINAL_FAILURES,
    Event,
    NodeRecord,
    Protocol,
    Severity,
    TaskRecord,
    TaskState,
    raise_severity,
    severity_from,
    step,
)
from scale0.tasks.placement import (
    NodeLoad,
    Placed,
    SpecError,
    parse_capabilities,
    parse_node_repositories,
    parse_requirements,
    place,
)

__all__ = [
    "ANNOUNCE_SPREAD_S",
    "ID_PATTERN",
    "Book",
    "Changes",
    "Settings",
    "Snapshot",
    "check_id",
]

#: B6: how long a task announced to one node waits before it is announced to the others.
ANNOUNCE_SPREAD_S: Final = 0.1


class Book:
    """All tasks, nodes and clients; every operation of both protocols (see module rules)."""

    def __init__(
        self,
        new_id: Callable[[], str],
        settings: Settings | None = None,
        snapshot: Snapshot | None = None,
        now: float = 0.0,
    ) -> None:
        self.settings = settings or Settings()
        #: Who may create tasks (scale0.tasks.auth, A1); None: anyone (A4).
        self.authorizer: Authorizer | None = None
        self._new_id = new_id
        self.tasks: dict[str, TaskRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.clients: dict[str, float] = {}
        self.refusals_total = 0
        self._seen: dict[str, float] = {}
        self._status_sent: dict[str, float] = {}
        self._on_node: dict[str, set[str]] = {}
        self._children: dict[str, set[str]] = {}
        self._pending_vespid: dict[str, None] = {}
        self._pending_zerotask: dict[str, None] = {}
        self._announced: dict[str, set[str]] = {}
        self._first_announced: dict[str, float] = {}  # B6: pending task -> first announced
        self._room: dict[str, int | None] = {}  # B6: each node's room at its last poll
        self._outbox: dict[str, list[dict[str, Any]]] = {}
        self._completed: set[str] = set()
        self._changes = Changes()
        if snapshot is not None:
            self._restore(snapshot, now)

    # ---- bookkeeping ----

    def _restore(self, snapshot: Snapshot, now: float) -> None:
        for node in snapshot.nodes:
            self.nodes[node.name] = node
            if node.connected:
                self._seen[node.name] = now  # B3: a grace of node_timeout_s to come back
        for task in snapshot.tasks:
            self.tasks[task.name] = task
            self._index(task, None)
        self.clients = dict(snapshot.clients)
        self.refusals_total = snapshot.refusals

    def _index(self, task: TaskRecord, old: TaskRecord | None) -> None:
        """Keep the derived indexes (per node, children, pending queues) in step with ``task``."""
        name = task.name
        if old is None and task.parent is not None:
            self._children.setdefault(task.parent, set()).add(name)
        if old is not None and old.node is not None and old.state is TaskState.RUNNING:
            self._on_node.get(old.node, set()).discard(name)
        if task.state is TaskState.RUNNING and task.node is not None:
            self._on_node.setdefault(task.node, set()).add(name)
        queue = self._pending_vespid if task.protocol is Protocol.VESPID else self._pending_zerotask
        if task.state is TaskState.PENDING:
            queue[name] = None
        else:
            queue.pop(name, None)
        if task.state is not TaskState.PENDING and name in self._first_announced:
            del self._first_announced[name]
            for announced in self._announced.values():
                announced.discard(name)

    def _put(self, task: TaskRecord) -> TaskRecord:
        old = self.tasks.get(task.name)
        if task.state is TaskState.COMPLETE and (old is None or old.state is not task.state):
            self._completed.add(task.name)
        self.tasks[task.name] = task
        self._index(task, old)
        self._changes.tasks[task.name] = task
        if old is None or old.state is not task.state:
            self._changes.transitions.append((old, task))
        return task

    def _put_node(self, node: NodeRecord) -> None:
        self.nodes[node.name] = node
        self._changes.nodes[node.name] = node

    def _send(self, node: str, message: dict[str, Any]) -> None:
        self._outbox.setdefault(node, []).append(message)

    def take_changes(self) -> Changes:
        """What changed since the last call (the process commits it before replying)."""
        changes, self._changes = self._changes, Changes()
        return changes

    def woken(self, now: float, parked: Iterable[str] | None = None) -> set[str]:
        """What parked waits to wake: ``node:NAME`` for nodes with something waiting for them,
        ``task:NAME`` for tasks completed since the last call. ``parked``: the only nodes
        that wait now (None: every node), so announcements are looked for only for those."""
        ready = {f"node:{name}" for name, box in self._outbox.items() if box}
        if self._pending_zerotask:
            candidates = self.nodes if parked is None else [n for n in parked if n in self.nodes]
            for name in candidates:
                node = self.nodes[name]
                if (
                    node.zerotask
                    and self._room.get(name) != 0
                    and self._alive(name)
                    and self._announce_list(name, 1, now)
                ):
                    ready.add(f"node:{name}")
        ready.update(f"task:{name}" for name in self._completed)
        self._completed.clear()
        return ready

    def _alive(self, node: str) -> bool:
        record = self.nodes.get(node)
        return record is not None and record.connected and node in self._seen

    def task(self, name: object) -> TaskRecord:
        """The task named ``name`` or Refused(UNKNOWN_TASK)."""
        task = self.tasks.get(name) if isinstance(name, str) else None
        if task is None:
            raise Refused(ErrorCode.UNKNOWN_TASK, f"no task {name!r}")
        return task

    def _transition(self, task: TaskRecord, event: Event, **values: Any) -> TaskRecord:
        target = step(task.state, event)
        if target is None:
            raise Refused(
                ErrorCode.STALE_ATTEMPT,
                f"task {task.name!r} is {task.state.value}: {event.value} refused",
            )
        return self._put(replace(task, state=target, **values))

    # ---- clients ----

    def authorize(
        self, auth_id: object, password: object, what: str, roles: Iterable[str] | None = None
    ) -> str | None:
        """A1: the auth_id allowed to do ``what`` (an admin with one of ``roles``, default the
        submit roles); None when the coordinator is open (A4)."""
        if self.authorizer is None:
            return None
        return self.authorizer.check(auth_id, password, what, roles)

    def client_connect(self, client_id: object, now: float) -> str:
        if client_id is None:
            client_id = self._fresh_id(self.clients)
        client_id = check_id(client_id, "client_id")
        if client_id in self.clients:
            raise Refused(ErrorCode.ID_TAKEN, f"client_id {client_id!r} is taken")
        self.clients[client_id] = now
        self._changes.clients[client_id] = now
        return client_id

    def client_disconnect(self, client_id: object) -> None:
        client_id = self.client(client_id)
        del self.clients[client_id]
        self._changes.clients[client_id] = None

    def client(self, client_id: object) -> str:
        if not isinstance(client_id, str) or client_id not in self.clients:
            raise Refused(ErrorCode.UNKNOWN_CLIENT, f"no connected client {client_id!r}")
        return client_id

    def owned_task(self, client_id: object, task_id: object) -> TaskRecord:
        owner = self.client(client_id)
        task = self.task(task_id)
        if task.owner != owner or task.protocol is not Protocol.ZEROTASK:
            raise Refused(ErrorCode.UNKNOWN_TASK, f"client {owner!r} has no task {task_id!r}")
        return task

    def _fresh_id(self, taken: Mapping[str, object]) -> str:
        for _ in range(100):
            candidate = self._new_id()
            if candidate not in taken:
                return candidate
        raise Refused(ErrorCode.INTERNAL_ERROR, "could not generate a free id")

    # ---- creating tasks ----

    def create_zerotask(
        self, client_id: object, method: object, params: object, task_id: object, now: float
    ) -> str:
        owner = self.client(client_id)
        if not isinstance(method, str) or not method:
            raise Refused(ErrorCode.INVALID_PARAMS, "method must be a non-empty string")
        if task_id is None:
            task_id = self._fresh_id(self.tasks)
        name = check_id(task_id, "task_id")
        task = TaskRecord(
            name, Protocol.ZEROTASK, TaskState.PENDING, now, owner, method=method, params=params
        )
        existing = self.tasks.get(name)
        if existing is not None:
            same = (existing.owner, existing.method, existing.params) == (owner, method, params)
            if same and existing.protocol is Protocol.ZEROTASK:
                return name  # B2: a resend
            raise Refused(ErrorCode.ID_TAKEN, f"task_id {name!r} is taken")
        self._put(task)
        return name

    def create_vespid(self, spec: Mapping[str, Any], owner: str | None, now: float) -> str:
        """task-create: validate every field before any change (SpecError -> INVALID_TASK)."""
        name = check_id(spec.get("name"), "name")
        try:
            parse_requirements(spec.get("requirements"), spec.get("repositories"))
            for key in ("name_pretty", "parent", "executable_pyscript"):
                if spec.get(key) is not None and not isinstance(spec[key], str):
                    raise SpecError(key, "must be a string")
            if not isinstance(spec.get("executable_pyscript"), str) or not spec.get(
                "executable_pyscript"
            ):
                raise SpecError("executable_pyscript", "is required")
            environment = spec.get("environment") or {}
            if not isinstance(environment, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in environment.items()
            ):
                raise SpecError("environment", "must be an object of strings")
        except SpecError as exc:
            raise Refused(ErrorCode.INVALID_TASK, str(exc), {"field": exc.field}) from None
        parent_name = spec.get("parent")
        parent = None
        if parent_name is not None:
            parent = self.tasks.get(parent_name)
            if parent is None:
                raise Refused(ErrorCode.INVALID_TASK, f"parent {parent_name!r} does not exist")
        task = TaskRecord(
            name,
            Protocol.VESPID,
            TaskState.PENDING,
            now,
            owner,
            name_pretty=spec.get("name_pretty"),
            parent=parent_name,
            executable_pyscript=spec["executable_pyscript"],
            requirements=dict(spec.get("requirements") or {}),
            repositories=dict(spec.get("repositories") or {}),
            environment=dict(environment),
        )
        existing = self.tasks.get(name)
        if existing is not None:
            if create_fields(existing) == create_fields(task) and existing.owner == owner:
                return name  # B2
            raise Refused(ErrorCode.ID_TAKEN, f"task name {name!r} is taken")
        if parent is not None and parent.state is not TaskState.COMPLETE:
            task = replace(task, state=TaskState.WAITING, explain=f"waits for parent {parent.name}")
        self._put(task)
        failed_parent = parent is not None and parent.state is TaskState.COMPLETE
        if parent is not None and failed_parent and parent.success in TERMINAL_FAILURES:
            self._put(replace(task, state=TaskState.WAITING))
            self._terminate(self.tasks[name], f"parent {parent.name} failed", now)
            return name
        self.schedule(now)
        return name

    # ---- nodes ----

    def node_connect(self, node_id: object, now: float) -> str:
        if node_id is None:
            node_id = self._fresh_id(self.nodes)
        name = check_id(node_id, "node_id")
        if self._alive(name) and self.nodes[name].zerotask:
            raise Refused(ErrorCode.ID_TAKEN, f"node_id {name!r} is taken")
        old = self.nodes.get(name)
        if old is not None and self._on_node.get(name):
            self._lose(name, now, "it connected again")
        base = old or NodeRecord(name)
        self._put_node(replace(base, connected=True, zerotask=True, time_connect=now))
        self._seen[name] = now
        self._announced[name] = set()
        self._send(name, notification("zerotask.node.broker_node_status", []))
        self._status_sent[name] = now
        return name

    def node(self, node_id: object, now: float) -> NodeRecord:
        """The connected node ``node_id`` (heard from now) or Refused(UNKNOWN_NODE)."""
        if not isinstance(node_id, str) or not self._alive(node_id):
            raise Refused(ErrorCode.UNKNOWN_NODE, f"no connected node {node_id!r}")
        self._seen[node_id] = now
        return self.nodes[node_id]

    def heard(self, node_id: object, now: float) -> None:
        """A report names ``node_id``: a connected node is alive now; others change nothing."""
        if isinstance(node_id, str) and self._alive(node_id):
            self._seen[node_id] = now

    def node_disconnect(self, node_id: object, now: float) -> None:
        node = self.node(node_id, now)
        self._lose(node.name, now, "it disconnected")

    def node_set(self, spec: Mapping[str, Any], now: float) -> str:
        """vespid node-set: create or update a node's capabilities (validated first)."""
        name = check_id(spec.get("name"), "name")
        try:
            memory, cores, prefer, ephemeral = parse_capabilities(spec.get("capabilities"))
            repositories = parse_node_repositories(spec.get("repositories"))
            active = spec.get("activetasks") or []
            if not isinstance(active, list):
                raise SpecError("activetasks", "must be a list")
        except SpecError as exc:
            raise Refused(ErrorCode.INVALID_PARAMS, str(exc), {"field": exc.field}) from None
        old = self.nodes.get(name)
        base = old or NodeRecord(name, time_connect=now)
        if old is not None and not self._alive(name):
            base = replace(base, time_connect=now)
        self._put_node(
            replace(
                base,
                memory=memory,
                cores=cores,
                prefer=prefer,
                ephemeral=ephemeral,
                repositories=repositories,
                connected=True,
            )
        )
        self._seen[name] = now
        self.schedule(now)
        return name

    def node_status(self, node_id: object, methods: object, now: float) -> None:
        node = self.node(node_id, now)
        if methods is not None:
            if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
                raise Refused(ErrorCode.INVALID_PARAMS, "methods must be a list of strings")
            if tuple(methods) != node.methods:
                self._put_node(replace(node, methods=tuple(methods)))

    def _lose(self, node: str, now: float, why: str) -> None:
        """T7 for every task running on ``node``; the node is marked disconnected."""
        for name in sorted(self._on_node.get(node, set())):
            task = self.tasks[name]
            self._transition(
                task,
                Event.NODE_LOST,
                node=None,
                reserved_memory=0,
                reserved_cores=0,
                reruns=task.reruns + 1,
                explain=f"attempt {task.attempt} lost: node {node} {why}",
            )
        self._seen.pop(node, None)
        self._outbox.pop(node, None)
        self._announced.pop(node, None)
        self._room.pop(node, None)
        record = self.nodes.get(node)
        if record is not None and (record.connected or record.zerotask):
            self._put_node(replace(record, connected=False, zerotask=False))
        self.schedule(now)

    def tick(self, now: float) -> None:
        """B3 (lose silent nodes) and the periodic broker_node_status; then placement."""
        timeout = self.settings.node_timeout_s
        for name, seen in sorted(self._seen.items()):
            if now - seen > timeout:
                self._lose(name, now, f"was silent for more than {timeout:g} s")
        interval = self.settings.node_status_interval_s
        for name, node in self.nodes.items():
            due = now - self._status_sent.get(name, 0.0) >= interval
            if node.zerotask and due and self._alive(name):
                self._send(name, notification("zerotask.node.broker_node_status", []))
                self._status_sent[name] = now

    # ---- placement and delivery ----

    def loads(self) -> list[NodeLoad]:
        result = []
        for name, node in self.nodes.items():
            used_memory = used_cores = 0
            for task_name in self._on_node.get(name, ()):
                task = self.tasks[task_name]
                used_memory += task.reserved_memory
                used_cores += task.reserved_cores
            result.append(NodeLoad(node, used_memory, used_cores, self._alive(name)))
        return result

    def schedule(self, now: float) -> None:
        """B5/P1-P6: place every pending vespid task that fits, oldest first."""
        if not self._pending_vespid:
            return
        loads = {load.record.name: load for load in self.loads()}
        for name in list(self._pending_vespid):
            task = self.tasks[name]
            req = parse_requirements(task.requirements, task.repositories)
            decision = place(req, list(loads.values()))
            if isinstance(decision, Placed):
                load = loads[decision.node]
                loads[decision.node] = replace(
                    load,
                    used_memory=load.used_memory + decision.memory,
                    used_cores=load.used_cores + decision.cores,
                )
                self._assign(task, decision.node, now, decision.memory, decision.cores)
                self._send(decision.node, self.task_run(self.tasks[name]))
            elif task.explain != decision.reason:
                self._put(replace(task, explain=decision.reason))

    def _assign(self, task: TaskRecord, node: str, now: float, memory: int, cores: int) -> None:
        self._transition(
            task,
            Event.ASSIGN,
            attempt=task.attempt + 1,
            node=node,
            reserved_memory=memory,
            reserved_cores=cores,
            time_start=now if task.time_start is None else task.time_start,
            time_assign=now,
            explain=None,
        )

    def task_run(self, task: TaskRecord) -> dict[str, Any]:
        """The vespid task-run command for ``task``'s current attempt."""
        return task_run(task)

    def _announce_list(self, node: str, limit: int, now: float) -> list[str]:
        """B5/B6: up to ``limit`` pending tasks to announce to ``node``, fresh ones first."""
        if limit <= 0:
            return []
        record = self.nodes[node]
        announced = self._announced.setdefault(node, set())
        first = self._first_announced
        names: list[str] = []
        later: list[str] = []
        for name in self._pending_zerotask:
            if name in announced:
                continue
            if record.methods and self.tasks[name].method not in record.methods:
                continue
            since = first.get(name)
            if since is None:
                names.append(name)
                if len(names) >= limit:
                    return names
            elif now - since >= ANNOUNCE_SPREAD_S and len(later) < limit:
                later.append(name)
        return (names + later)[:limit]

    def poll(
        self, node_id: object, active: object, now: float, room: object = None
    ) -> list[dict[str, Any]]:
        """node_poll: what waits for this node (outbox, announcements (B6: at most ``room``),
        B4 resends)."""
        node = self.node(node_id, now)
        held = parse_attempts(active)
        if room is not None and (not isinstance(room, int) or isinstance(room, bool) or room < 0):
            raise Refused(ErrorCode.INVALID_PARAMS, "room must be a non-negative int")
        self._room[node.name] = room
        messages = self._outbox.pop(node.name, [])
        for name in sorted(self._on_node.get(node.name, ())):
            task = self.tasks[name]
            if (name, task.attempt) in held or task.time_assign is None:
                continue
            if now - task.time_assign >= self.settings.resend_s:
                self._put(replace(task, time_assign=now))
                if task.protocol is Protocol.VESPID:
                    messages.append(self.task_run(task))
                else:
                    messages.append(new_task_message(task))
        if node.zerotask:
            limit = max(0, POLL_BATCH - len(messages))
            if room is not None:
                limit = min(limit, room)
            for name in self._announce_list(node.name, limit, now):
                self._announced[node.name].add(name)
                self._first_announced.setdefault(name, now)
                messages.append(new_task_message(self.tasks[name]))
        if len(messages) > POLL_BATCH:
            self._outbox[node.name] = messages[POLL_BATCH:]
            messages = messages[:POLL_BATCH]
        return messages

    def node_task_request(self, task_id: object, node_id: object, now: float) -> dict[str, Any]:
        """zerotask: the first node to ask gets the task; the holder asking again gets it again."""
        task = self.task(task_id)
        if task.protocol is not Protocol.ZEROTASK:
            raise Refused(ErrorCode.UNKNOWN_TASK, f"task {task.name!r} is not a zerotask task")
        holder = None
        if node_id is not None:
            holder = self.node(node_id, now).name
        if task.state is TaskState.RUNNING and holder is not None and task.node == holder:
            return assignment(task)
        if task.state is not TaskState.PENDING:
            return {}
        self._assign(task, holder or "anonymous", now, 0, 0)
        return assignment(self.tasks[task.name])

    # ---- reports from nodes (F1-F3, S1, S2) ----

    def _fence(
        self, task: TaskRecord, node: object, attempt: object, what: str, now: float, final: bool
    ) -> bool:
        """F1-F3: True when the report is current; False for an F2 duplicate; else Refused."""
        node_ok = node is None or node == task.node
        attempt_ok = attempt is None or attempt == task.attempt
        if task.state is TaskState.RUNNING and node_ok and attempt_ok:
            return True
        if (
            final
            and task.state is TaskState.COMPLETE
            and task.finished_attempt > 0
            and (attempt is None or attempt == task.finished_attempt)
            and (node is None or node == task.finished_node)
        ):
            return False
        self.refusals_total += 1
        self._changes.refusals.append(
            {"time": now, "task": task.name, "attempt": attempt, "node": node, "what": what}
        )
        self._put(replace(task, refused=task.refused + 1))
        raise Refused(
            ErrorCode.STALE_ATTEMPT,
            f"{what} for task {task.name!r} refused: attempt {attempt!r} from node {node!r}, "
            f"task is {task.state.value} (attempt {task.attempt}, node {task.node!r})",
        )

    def report_status(
        self,
        task_id: object,
        node: object,
        attempt: object,
        status: object,
        kwargs: Mapping[str, Any],
        now: float,
    ) -> None:
        task = self.task(task_id)
        self._fence(task, node, attempt, "status", now, final=False)
        success = task.success
        reported = kwargs.get("success")
        if reported is not None:
            level = severity_from(reported)
            if level is None or level is Severity.OK:
                raise Refused(
                    ErrorCode.INVALID_PARAMS,
                    f"success in a status must be warning, error or fatal, not {reported!r}",
                )
            success = raise_severity(success, level)
        self._transition(
            task, Event.STATUS, status=status, status_kwargs=dict(kwargs), success=success
        )

    def finish(
        self,
        task_id: object,
        node: object,
        attempt: object,
        success: Severity,
        now: float,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """T6 for the current attempt; False for an F2 duplicate (nothing changed)."""
        task = self.task(task_id)
        if not self._fence(task, node, attempt, "result", now, final=True):
            return False
        holder = task.node
        self._transition(
            task,
            Event.FINISH,
            success=raise_severity(task.success, success),
            result=result,
            error=error,
            time_finish=now,
            finished_attempt=task.attempt,
            finished_node=holder,
            reserved_memory=0,
            reserved_cores=0,
        )
        self._children_of(task.name, now)
        self.schedule(now)
        return True

    def _children_of(self, parent_name: str, now: float) -> None:
        parent = self.tasks[parent_name]
        for name in sorted(self._children.get(parent_name, ())):
            child = self.tasks[name]
            if child.state is not TaskState.WAITING:
                continue
            if parent.success in TERMINAL_FAILURES:
                self._terminate(child, f"parent {parent_name} failed", now)
            else:
                self._transition(child, Event.PARENT_OK, explain=None)

    def _terminate(
        self, task: TaskRecord, why: str, now: float, event: Event = Event.PARENT_FAILED
    ) -> None:
        holder = task.node if task.state is TaskState.RUNNING else None
        self._transition(
            task,
            event,
            success=raise_severity(task.success, Severity.TERMINATED),
            time_finish=now,
            node=None,
            reserved_memory=0,
            reserved_cores=0,
            explain=why,
            error={"code": int(ErrorCode.TASK_FAILED), "message": why},
        )
        if holder is not None:
            self._send(
                holder, {"command": "task-cancel", "name": task.name, "attempt": task.attempt}
            )
        self._children_of(task.name, now)

    def cancel(self, task_id: object, now: float) -> TaskRecord:
        """T8 (client or operator)."""
        task = self.task(task_id)
        if task.state is TaskState.COMPLETE:
            raise Refused(ErrorCode.STALE_ATTEMPT, f"task {task.name!r} is already complete")
        self._terminate(task, "cancelled", now, Event.CANCEL)
        self.schedule(now)
        return self.tasks[task.name]

    # ---- reading ----

    def explain(self, task: TaskRecord) -> str:
        """Why a task is where it is (docs/tasks.md §4, P6)."""
        if task.state is TaskState.PENDING and task.protocol is Protocol.ZEROTASK:
            nodes = sorted(n for n, r in self.nodes.items() if r.zerotask and self._alive(n))
            if not nodes:
                return "no zerotask node is connected"
            return f"announced to {', '.join(nodes)}; no node has asked for it yet"
        if task.explain:
            return task.explain
        if task.state is TaskState.RUNNING:
            return f"attempt {task.attempt} runs on node {task.node}"
        return str(task.state.value)

    def counts(self) -> dict[str, int]:
        """Tasks per state, re-runs and refusals (for /metrics and reports)."""
        counts = {state.value: 0 for state in TaskState}
        reruns = 0
        for task in self.tasks.values():
            counts[task.state.value] += 1
            reruns += task.reruns
        counts["reruns"] = reruns
        counts["refused"] = self.refusals_total
        counts["nodes"] = sum(1 for name in self.nodes if self._alive(name))
        return counts
