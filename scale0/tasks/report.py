"""The coordinator's numbers for operators: tasks by state, totals, queue depth, per-node load.

One pure function over the :class:`~scale0.tasks.book.Book`, so ``/metrics`` and the status
page (scale0/mgmt/taskpage.py) show the same numbers. The totals are counted from the stored
tasks (a task is never deleted), so they survive a coordinator restart and never go down.
"""

from __future__ import annotations

from typing import Any

from scale0.tasks.book import Book
from scale0.tasks.model import TERMINAL_FAILURES, Protocol, Severity, TaskState

__all__ = ["report"]


def report(book: Book) -> dict[str, Any]:
    """Everything /metrics and the page show, as plain JSON values."""
    states = {state.value: 0 for state in TaskState}
    completed = {severity.label: 0 for severity in Severity}
    queue = {protocol.value: 0 for protocol in Protocol}
    running: dict[str, int] = {}
    failed = reruns = 0
    for task in book.tasks.values():
        states[task.state.value] += 1
        reruns += task.reruns
        if task.state is TaskState.PENDING:
            queue[task.protocol.value] += 1
        elif task.state is TaskState.RUNNING and task.node is not None:
            running[task.node] = running.get(task.node, 0) + 1
        elif task.state is TaskState.COMPLETE and task.success is not None:
            completed[task.success.label] += 1
            failed += task.success in TERMINAL_FAILURES
    nodes = [
        {
            "node": load.record.name,
            "connected": load.alive,
            "running": running.get(load.record.name, 0),
            "memory": load.record.memory,
            "memory_reserved": load.used_memory,
            "cores": load.record.cores,
            "cores_reserved": load.used_cores,
        }
        for load in sorted(book.loads(), key=lambda item: item.record.name)
    ]
    return {
        "tasks": states,
        "created": len(book.tasks),
        "completed": completed,
        "failed": failed,
        "reruns": reruns,
        "refused": book.refusals_total,
        "queue": queue,
        "nodes_connected": sum(1 for node in nodes if node["connected"]),
        "nodes": nodes,
    }
