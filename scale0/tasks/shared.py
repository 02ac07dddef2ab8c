"""The Book of one of several coordinators sharing a PostgreSQL store (pure, like the Book).

Each coordinator keeps the whole state in memory and decides from it (scale0.tasks.book); the
store (scale0.tasks.pgstore, G1-G5) refuses a transaction whose decisions were taken on rows
that another coordinator changed meanwhile. This class adds what that needs to the Book:

M1  :meth:`SharedBook.absorb` takes in what the other coordinators committed (tasks, nodes,
    clients, node heartbeats) without recording it as a change, keeping every index in step.
    A vespid attempt another coordinator placed is sent to its node from here too, and a
    running attempt another coordinator ended (cancel, failed parent) is cancelled on its node:
    a node's polls reach whichever coordinator its broker picked. Nodes de-duplicate by
    (task, attempt), and :meth:`SharedBook.poll` drops a queued task-run whose attempt is no
    longer the task's running one, so a late copy never starts a finished attempt again.
M2  :meth:`SharedBook.checkpoint` before a group of decisions and :meth:`SharedBook.rollback`
    after the store refused it (Conflict): the rows the group changed are put back as the
    store now has them, and what the group did to the node outboxes, announcements and
    counters is undone, so the group can be decided again as if it had never run.
M3  Decisions that read a row without changing it name it, so the store checks (and bumps)
    its version too: a placement that reserves memory or cores touches the node (two
    coordinators cannot both fill the same free room), and creating a child touches its
    unfinished parent (the parent cannot complete unseen, leaving the child waiting forever).
M4  :meth:`SharedBook.tick` also re-queues tasks still running on a node that another
    coordinator marked lost (the loss and an assignment raced), and places pending vespid
    tasks, since room freed by another coordinator's decisions is seen here only through M1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scale0.tasks.book import Book
from scale0.tasks.messages import Changes, Settings, Snapshot, task_run
from scale0.tasks.model import NodeRecord, Protocol, TaskRecord, TaskState

__all__ = ["Checkpoint", "SharedBook"]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a group of decisions may change besides the rows it commits (M2)."""

    outbox: dict[str, list[dict[str, Any]]]
    announced: dict[str, set[str]]
    first_announced: dict[str, float]
    room: dict[str, int | None]
    status_sent: dict[str, float]
    completed: set[str]
    refusals_total: int


class SharedBook(Book):
    """A Book for one of several coordinators on one PostgreSQL store (M1-M4)."""

    def __init__(
        self,
        new_id: Callable[[], str],
        settings: Settings | None = None,
        snapshot: Snapshot | None = None,
        now: float = 0.0,
    ) -> None:
        super().__init__(new_id, settings, snapshot, now)
        self.touched_tasks: set[str] = set()
        self.touched_nodes: set[str] = set()

    def take_touched(self) -> tuple[set[str], set[str]]:
        """M3: the rows read by the decisions since the last call (tasks, nodes)."""
        touched = (self.touched_tasks, self.touched_nodes)
        self.touched_tasks, self.touched_nodes = set(), set()
        return touched

    def last_heard(self) -> Mapping[str, float]:
        """When each connected node was last heard from here (shared through the store)."""
        return self._seen

    # ---- M3 ----

    def _assign(self, task: TaskRecord, node: str, now: float, memory: int, cores: int) -> None:
        super()._assign(task, node, now, memory, cores)
        if memory or cores:
            self.touched_nodes.add(node)

    def create_vespid(self, spec: Mapping[str, Any], owner: str | None, now: float) -> str:
        name = super().create_vespid(spec, owner, now)
        parent_name = spec.get("parent")
        parent = self.tasks.get(parent_name) if isinstance(parent_name, str) else None
        if parent is not None and parent.state is not TaskState.COMPLETE:
            self.touched_tasks.add(parent.name)
        return name

    # ---- M4 ----

    def tick(self, now: float) -> None:
        super().tick(now)
        for name, running in sorted(self._on_node.items()):
            record = self.nodes.get(name)
            if running and record is not None and not record.connected:
                self._lose(name, now, "was lost")
        self.schedule(now)

    def poll(
        self, node_id: object, active: object, now: float, room: object = None
    ) -> list[dict[str, Any]]:
        if isinstance(node_id, str) and node_id in self._outbox:
            self._outbox[node_id] = [m for m in self._outbox[node_id] if self._current(node_id, m)]
        return super().poll(node_id, active, now, room)

    def _current(self, node: str, message: dict[str, Any]) -> bool:
        """M1: False for a task-run whose attempt is no longer running on ``node``."""
        if message.get("command") != "task-run":
            return True
        task = self.tasks.get(str(message.get("name")))
        return (
            task is not None
            and task.state is TaskState.RUNNING
            and task.node == node
            and task.attempt == message.get("attempt")
        )

    # ---- M1 ----

    def absorb(
        self,
        tasks: Mapping[str, TaskRecord | None],
        nodes: Mapping[str, NodeRecord | None],
        clients: Mapping[str, float | None],
        seen: Mapping[str, float],
        now: float,
        deliver: bool = True,
    ) -> None:
        """Take in rows as the store has them (None: there is none) without recording them."""
        for name, node in nodes.items():
            if node is None:
                self.nodes.pop(name, None)
                self._gone(name)
            else:
                self.nodes[name] = node
                if not node.connected:
                    self._gone(name)
                elif name not in self._seen:
                    self._seen[name] = seen.get(name, now)
        for name, task in tasks.items():
            if task is None:
                self._forget(name)
            else:
                self._absorb_task(task, deliver)
        for client_id, since in clients.items():
            if since is None:
                self.clients.pop(client_id, None)
            else:
                self.clients[client_id] = since
        for name, when in seen.items():
            if name in self._seen and when > self._seen[name]:
                self._seen[name] = when

    def _gone(self, node: str) -> None:
        self._seen.pop(node, None)
        self._outbox.pop(node, None)
        self._announced.pop(node, None)
        self._room.pop(node, None)

    def _absorb_task(self, task: TaskRecord, deliver: bool) -> None:
        name = task.name
        old = self.tasks.get(name)
        if old == task:
            return
        if task.state is TaskState.COMPLETE and (old is None or old.state is not task.state):
            self._completed.add(name)
        self.tasks[name] = task
        self._index(task, old)
        if not deliver:
            return
        running = task.state is TaskState.RUNNING
        if (
            running
            and task.node is not None
            and task.protocol is Protocol.VESPID
            and self._alive(task.node)
            and (old is None or old.state is not TaskState.RUNNING or old.attempt != task.attempt)
        ):
            self._send(task.node, task_run(task))
        if (
            old is not None
            and old.state is TaskState.RUNNING
            and old.node is not None
            and not (running and task.attempt == old.attempt)
            and task.finished_attempt != old.attempt
            and self._alive(old.node)
        ):
            self._send(old.node, {"command": "task-cancel", "name": name, "attempt": old.attempt})

    def _forget(self, name: str) -> None:
        """A task this Book created in a group the store refused (M2): it does not exist."""
        task = self.tasks.pop(name, None)
        if task is None:
            return
        self._pending_vespid.pop(name, None)
        self._pending_zerotask.pop(name, None)
        self._first_announced.pop(name, None)
        self._completed.discard(name)
        if task.parent is not None:
            self._children.get(task.parent, set()).discard(name)
        if task.node is not None:
            self._on_node.get(task.node, set()).discard(name)
        for announced in self._announced.values():
            announced.discard(name)

    # ---- M2 ----

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(
            {node: list(box) for node, box in self._outbox.items()},
            {node: set(names) for node, names in self._announced.items()},
            dict(self._first_announced),
            dict(self._room),
            dict(self._status_sent),
            set(self._completed),
            self.refusals_total,
        )

    def rollback(
        self,
        checkpoint: Checkpoint,
        tasks: Mapping[str, TaskRecord | None],
        nodes: Mapping[str, NodeRecord | None],
        clients: Mapping[str, float | None],
        now: float,
    ) -> None:
        """M2: undo a refused group: ``tasks``/``nodes``/``clients`` are the rows it changed,
        as the store has them now."""
        self._changes = Changes()
        self.touched_tasks, self.touched_nodes = set(), set()
        self.absorb(tasks, nodes, clients, {}, now, deliver=False)
        self._outbox = checkpoint.outbox
        self._announced = checkpoint.announced
        self._first_announced = {
            name: when
            for name, when in checkpoint.first_announced.items()
            if name in self._pending_zerotask
        }
        self._room = checkpoint.room
        self._status_sent = checkpoint.status_sent
        self._completed = checkpoint.completed | {
            name for name, task in tasks.items() if task and task.state is TaskState.COMPLETE
        }
        self.refusals_total = checkpoint.refusals_total
