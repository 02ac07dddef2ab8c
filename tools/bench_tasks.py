"""Benchmark: zerotask tasks per second from submit to result, through a real family.

Run it as ``tools/bench-tasks`` (it makes .venv first). One ``scale0-broker``, one
``scale0-coordinator`` (SQLite, or PostgreSQL with ``--store postgresql``: a throwaway server
as in the tests), three ``scale0-node`` processes serving a no-op method, and ``--clients``
client threads, each submitting tasks and collecting their results with TaskClient. It prints
tasks/s end to end and the coordinator's CPU seconds per task (from /proc). Durable commits:
SQLite runs with ``synchronous=FULL``. Numbers drift on shared machines; compare runs made in
one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale0.tasks.client import TaskClient
from scale0.testing import running_broker
from tests.tasks.postgres import running_postgres
from tests.tasks.processes import coordinator, node, running, wait_until

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def bench(store: str, tasks: int, clients: int) -> dict[str, float | str]:
    with tempfile.TemporaryDirectory(prefix="scale0-bench-tasks-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "broker").mkdir()
        options: dict[str, object] = {}
        server_cm = None
        if store == "postgresql":
            server_cm = running_postgres()
            server = server_cm.__enter__()
            options["database"] = server.database()
        try:
            with running_broker(tmp / "broker") as broker:
                frontend = broker.endpoints["frontend"]
                coord = coordinator(tmp, broker.endpoints["backend"], **options)
                nodes = [
                    node(
                        tmp,
                        f"n{i}",
                        frontend,
                        capabilities={"memory": 1000, "cores": 2},
                        slots=8,
                        poll_wait_ms=200,
                    )
                    for i in range(3)
                ]
                with running(coord, *nodes), TaskClient(frontend) as probe:
                    probe.connect("probe")
                    probe.result(probe.submit("noop", None))  # everything is up
                    wait_until(
                        lambda: probe.command("task-list")["counts"]["nodes"] == 3, 30, "3 nodes"
                    )
                    per_client = tasks // clients
                    errors: list[BaseException] = []

                    def work(index: int) -> None:
                        try:
                            with TaskClient(frontend) as client:
                                client.connect(f"bench{index}")
                                ids = [client.submit("noop", None) for _ in range(per_client)]
                                for task in ids:
                                    client.result(task, wait_s=120)
                        except BaseException as exc:
                            errors.append(exc)

                    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
                    cpu_before = cpu_seconds(coord.pid)
                    started = time.perf_counter()
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                    elapsed = time.perf_counter() - started
                    cpu = cpu_seconds(coord.pid) - cpu_before
                    if errors:
                        raise errors[0]
                    done = per_client * clients
                    return {
                        "store": store,
                        "tasks": done,
                        "clients": clients,
                        "tasks_per_s": done / elapsed,
                        "coordinator_cpu_ms_per_task": 1000 * cpu / done,
                    }
        finally:
            if server_cm is not None:
                server_cm.__exit__(None, None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--store", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"]
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [bench(store, args.tasks, args.clients) for store in args.store]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'store':<11} {'tasks':>6} {'clients':>7} {'tasks/s':>9} {'coord CPU ms/task':>18}")
    for row in rows:
        print(
            f"{row['store']:<11} {row['tasks']:>6} {row['clients']:>7} "
            f"{row['tasks_per_s']:>9.0f} {row['coordinator_cpu_ms_per_task']:>18.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
