"""A coordinator-shaped process for the store crash tests: Book + store, one ack line per commit.

``python -m tests.tasks.store_driver KIND DB COUNT`` restores the Book from the store, then
drives COUNT zerotask and COUNT vespid tasks to completion (with node losses and stale reports
on the way). After each commit it prints one JSON line saying what is now durable; the test
SIGKILLs it at random points and checks the store against those lines.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

from scale0.tasks.book import Book, Settings
from scale0.tasks.errors import Refused
from scale0.tasks.model import Protocol, Severity, TaskState
from tests.tasks.stores import open_store


def main(kind: str, db: str, count: int) -> None:
    store = open_store(kind, db)
    counter = itertools.count()
    book = Book(
        lambda: f"g{next(counter)}", Settings(node_timeout_s=1e9), store.load(), time.time()
    )

    def commit(**ack: object) -> None:
        store.commit(book.take_changes())
        print(json.dumps(ack), flush=True)

    if "c" not in book.clients:
        book.client_connect("c", time.time())
        commit(op="client")
    for node in ("n1", "n2"):
        if node not in book.nodes or not book.nodes[node].connected:
            book.node_set({"name": node, "capabilities": {"memory": 100, "cores": 2}}, time.time())
            commit(op="node", name=node)
        if not book.nodes[node].zerotask:
            book.node_connect(node, time.time())
            commit(op="node", name=node)
    for i in range(count):
        for name, make in (
            (f"z{i}", lambda n, i=i: book.create_zerotask("c", "square", i, n, time.time())),
            (
                f"v{i}",
                lambda n: book.create_vespid(
                    {"name": n, "executable_pyscript": "x", "requirements": {"memory": 30}},
                    None,
                    time.time(),
                ),
            ),
        ):
            if name not in book.tasks:
                make(name)
                commit(op="created", name=name)
    step = 0
    while any(t.state is not TaskState.COMPLETE for t in book.tasks.values()):
        step += 1
        for name in sorted(book.tasks):
            task = book.tasks[name]  # fresh: an earlier step may have changed it
            now = time.time()
            if task.state is TaskState.PENDING and task.protocol is Protocol.ZEROTASK:
                book.node_task_request(task.name, "n1" if step % 2 else "n2", now)
                commit(op="assigned", name=task.name, attempt=book.tasks[task.name].attempt)
            elif (
                task.state is TaskState.RUNNING
                and task.attempt == 1
                and int(task.name[1:]) % 4 == 1
            ):
                holder = task.node
                assert holder is not None
                book.node_disconnect(holder, now)  # a lost node: its tasks are re-queued
                commit(op="lost", name=holder)
                book.node_set({"name": holder, "capabilities": {"memory": 100, "cores": 2}}, now)
                book.node_connect(holder, now)
                commit(op="node", name=holder)
                try:
                    book.finish(task.name, holder, 1, Severity.OK, now, result="stale")
                except Refused:
                    commit(op="refused", name=task.name)
            elif task.state is TaskState.RUNNING:
                index = int(task.name[1:])
                if task.protocol is Protocol.ZEROTASK and index % 7 == 3:
                    error = {"code": 7, "message": f"no {index}"}
                    book.finish(
                        task.name, task.node, task.attempt, Severity.ERROR, now, error=error
                    )
                    commit(op="finished", name=task.name, error=error)
                else:
                    result = index * index if task.protocol is Protocol.ZEROTASK else None
                    book.finish(task.name, task.node, task.attempt, Severity.OK, now, result=result)
                    commit(op="finished", name=task.name, result=result)
    store.close()
    print(json.dumps({"op": "done"}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
