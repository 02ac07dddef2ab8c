"""Benchmark: zerotask tasks per second from submit to result, through a real family.

Run it as ``tools/bench-tasks`` (it makes .venv first). One ``scale0-broker``, one
``scale0-coordinator`` (SQLite, or PostgreSQL with ``--store postgresql``: a throwaway server
as in the tests), three ``scale0-node`` processes serving a no-op method, and ``--clients``
client threads, each submitting tasks and collecting their results with TaskClient (one request
per task, ``--window`` of them in flight, or JSON-RPC batches with ``--batch``). It prints
tasks/s end to end and the coordinator's CPU seconds per task (from /proc). Durable commits:
SQLite runs with ``synchronous=FULL``. Numbers drift on shared machines; compare runs made in
one sitting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale0.tasks.client import TaskClient, TaskError
from scale0.tasks.errors import ErrorCode
from scale0.testing import running_broker
from tests.tasks.postgres import running_postgres
from tests.tasks.processes import coordinator, node, running, wait_until

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def phases(db: Path) -> tuple[float, float]:
    """Median milliseconds of a task from create to assignment, and from assignment to its
    result being stored (SQLite only: read from the coordinator's store)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = [json.loads(data) for (data,) in conn.execute("SELECT data FROM tasks")]
    rows = [r for r in rows if r.get("time_finish") and r.get("time_start")]
    if not rows:
        return 0.0, 0.0
    queued = statistics.median(r["time_start"] - r["time_create"] for r in rows)
    ran = statistics.median(r["time_finish"] - r["time_start"] for r in rows)
    return 1000 * queued, 1000 * ran


def _started(stderr: Path) -> bool:
    text = stderr.read_text(errors="replace") if stderr.exists() else ""
    return "coordinator_ready" in text or "coordinator_standby" in text


def _connected(probe: TaskClient) -> bool:
    try:
        probe.connect()
    except Exception as exc:
        print(f"waiting for the coordinators: {exc}", file=sys.stderr)
        return False
    return True


def collect(client: TaskClient, ids: list[str]) -> None:
    """Every result of ``ids``: a parked ``client_task_wait`` on the first one not known
    complete, then one JSON-RPC batch of ``client_task_result`` for all that are left; those
    answering not-finished stay for the next round."""
    left = list(ids)
    limit = time.monotonic() + 120
    while left:
        if time.monotonic() > limit:
            raise TimeoutError(f"{len(left)} results missing after 120 s")
        client.call("client_task_wait", [client.client_id, left[0], 5000])
        answers = client.call_batch(
            [("client_task_result", [client.client_id, task]) for task in left]
        )
        still = []
        for task, answer in zip(left, answers, strict=True):
            if isinstance(answer, TaskError):
                if answer.code != ErrorCode.NOT_FINISHED:
                    raise answer
                still.append(task)
        left = still


@contextlib.contextmanager
def profiling(where: Path | None, procs: dict[str, list[int]], tag: str) -> Any:
    """With ``where``: py-spy records every process (collapsed stacks, one file per process,
    idle threads left out) for as long as the block runs; stopped by PID."""
    spies: list[subprocess.Popen[bytes]] = []
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
        for kind, pids in procs.items():
            for index, pid in enumerate(pids):
                out = where / f"{tag}-{kind}{index}.txt"
                spy = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid)]
                spies.append(
                    subprocess.Popen(  # noqa: S603 (our own venv's py-spy, our own PIDs)
                        [*spy, "-r", "200", "-f", "raw", "-o", str(out)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            try:
                spy.wait(timeout=20)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()


def bench(
    store: str,
    tasks: int,
    clients: int,
    batch: int,
    slots: int,
    tree: Path | None = None,
    coordinators: int = 1,
    window: int = 1,
    profile: Path | None = None,
) -> dict[str, Any]:
    """One row; with ``tree`` the processes import scale0 from there (PYTHONPATH first)."""
    outer = os.environ.get("PYTHONPATH")
    if tree is not None:
        os.environ["PYTHONPATH"] = str(tree.resolve())
    try:
        row = bench_once(store, tasks, clients, batch, slots, coordinators, window, profile)
    finally:
        if tree is not None:
            if outer is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = outer
    row["tree"] = "this" if tree is None else str(tree)
    return row


def bench_once(
    store: str,
    tasks: int,
    clients: int,
    batch: int,
    slots: int,
    coordinators: int = 1,
    window: int = 1,
    profile: Path | None = None,
) -> dict[str, Any]:
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
                # PostgreSQL: several coordinators serve at once (docs/tasks.md §7.2), all
                # workers of the one broker, which spreads the requests between them.
                coords = [
                    coordinator(tmp, broker.endpoints["backend"], f"coordinator{i}", **options)
                    for i in range(coordinators)
                ]
                nodes = [
                    node(
                        tmp,
                        f"n{i}",
                        frontend,
                        capabilities={"memory": 1000, "cores": 2},
                        slots=slots,
                        poll_wait_ms=200,
                    )
                    for i in range(3)
                ]
                with running(*coords, *nodes), TaskClient(frontend) as probe:
                    # Every coordinator up first (a loaded machine may take longer to start one
                    # than a client waits for a service); an older tree's standby counts.
                    wait_until(lambda: all(_started(c.stderr) for c in coords), 120, "coordinators")
                    # A fresh id each time: a resend after a slow start is safe (K3). A loaded
                    # machine may answer "no service" until the coordinators' workers are READY.
                    wait_until(lambda: _connected(probe), 120, "a coordinator answers", 0.5)
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
                                if batch <= 1 and window > 1:  # one request per task each way
                                    ids = client.submit_each([("noop", None)] * per_client, window)
                                    client.results(ids, window, wait_s=120)
                                    return
                                if batch <= 1:  # one request per submit, one per result
                                    ids = [client.submit("noop", None) for _ in range(per_client)]
                                    for task in ids:
                                        client.result(task, wait_s=120)
                                    return
                                for first in range(0, per_client, batch):
                                    count = min(batch, per_client - first)
                                    ids = client.submit_many([("noop", None)] * count)
                                    collect(client, ids)
                        except BaseException as exc:
                            errors.append(exc)

                    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
                    procs = {"coordinator": [c.pid for c in coords], "broker": [broker.pid]}
                    procs["nodes"] = [n.pid for n in nodes]
                    procs["bench"] = [os.getpid()]
                    tag = f"{store}-b{batch}-w{window}-{os.environ.get('PYTHONPATH', 'this')[-8:]}"
                    with profiling(profile, procs, tag.replace("/", "_")):
                        before = {k: sum(cpu_seconds(p) for p in v) for k, v in procs.items()}
                        started = time.perf_counter()
                        for thread in threads:
                            thread.start()
                        for thread in threads:
                            thread.join()
                        elapsed = time.perf_counter() - started
                        cpu = {
                            k: sum(cpu_seconds(p) for p in v) - before[k] for k, v in procs.items()
                        }
                    if errors:
                        raise errors[0]
                    done = per_client * clients
                    db = tmp / "coordinator" / "tasks.db"  # data_dir, the same for all
                    queued, ran = phases(db) if store == "sqlite" else (0.0, 0.0)
                    return {
                        "store": store,
                        "coordinators": coordinators,
                        "tasks": done,
                        "clients": clients,
                        "batch": batch,
                        "window": window,
                        "slots": slots,
                        "tasks_per_s": done / elapsed,
                        "queued_ms": queued,
                        "ran_ms": ran,
                        **{f"{k}_cpu_ms_per_task": 1000 * v / done for k, v in cpu.items()},
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
    parser.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=[1],
        help="tasks per client request: 1 = submit, wait and fetch each task on its own; N = "
        "submit N in one JSON-RPC batch, then fetch their results in batches (several values: "
        "one row each, alternated --repeat times)",
    )
    parser.add_argument(
        "--window",
        type=int,
        nargs="+",
        default=[1],
        help="with --batch 1: requests each client keeps in flight (TaskClient.submit_each and "
        ".results: still one client_new_task and one client_task_wait per task); 1 = one at a "
        "time (several values: one row each)",
    )
    parser.add_argument("--slots", type=int, default=8, help="zerotask calls at once per node")
    parser.add_argument(
        "--coordinators",
        type=int,
        nargs="+",
        default=[1],
        help="PostgreSQL: coordinators serving at once (several values: one row each, "
        "alternated, and the ratio of each to the first; SQLite rows always have one)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy every process during the timed phase (pip install py-spy); collapsed "
        "stacks into this directory, one file per process and row",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="also run every row with the coordinator and nodes imported from this source tree "
        "(git archive <commit> scale0 | tar -x -C DIR), alternating with this one",
    )
    args = parser.parse_args()
    trees: list[Path | None] = [args.base_tree, None] if args.base_tree else [None]
    rows = [
        bench(store, args.tasks, args.clients, batch, args.slots, tree, count, window, args.profile)
        for _ in range(args.repeat)
        for store in args.store
        for batch in args.batch
        for count in (args.coordinators if store == "postgresql" else [1])
        for window in (args.window if batch <= 1 else [1])
        for tree in trees
    ]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{'tree':<14} {'store':<11} {'coord':>5} {'tasks':>6} {'clients':>7} {'batch':>5} "
        f"{'window':>6} {'tasks/s':>8}  CPU ms/task: coordinator(s) broker nodes bench(clients)"
    )
    for row in rows:
        print(
            f"{str(row['tree'])[-14:]:<14} {row['store']:<11} {row['coordinators']:>5} "
            f"{row['tasks']:>6} "
            f"{row['clients']:>7} {row['batch']:>5} {row['window']:>6} "
            f"{row['tasks_per_s']:>8.0f}  {row['coordinator_cpu_ms_per_task']:>23.2f} "
            f"{row['broker_cpu_ms_per_task']:>6.2f} {row['nodes_cpu_ms_per_task']:>5.2f} "
            f"{row['bench_cpu_ms_per_task']:>15.2f}   "
            + (
                f"median ms queued {row['queued_ms']:.1f}, ran {row['ran_ms']:.1f}"
                if row["store"] == "sqlite"
                else "(phases: SQLite only)"
            )
        )
    print_ratios(rows)
    return 0


def print_ratios(rows: list[dict[str, Any]]) -> None:
    """The mean rate of each coordinator count against the first one's, per store, batch and
    tree (rows of one invocation only)."""
    groups: dict[tuple[str, int, str], dict[int, list[float]]] = {}
    for row in rows:
        key = (row["store"], row["batch"], str(row["tree"]))
        groups.setdefault(key, {}).setdefault(row["coordinators"], []).append(row["tasks_per_s"])
    for (store, batch, tree), by_count in groups.items():
        if len(by_count) < 2:
            continue
        first, *others = list(by_count)
        base = statistics.mean(by_count[first])
        for count in others:
            mean = statistics.mean(by_count[count])
            print(
                f"{store} batch {batch} ({tree}): {count} coordinators {mean:.0f} tasks/s, "
                f"{first}: {base:.0f}; ratio {mean / base:.2f}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
