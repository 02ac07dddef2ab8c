"""Benchmark: requests through one Scale0 broker, beside baselines and peers in the same run.

Run it as ``tools/bench`` (it makes .venv first). For each payload size and worker count it runs
these setups, each with the client, the workers and the middle process in separate processes:

- ``direct``: the client's DEALER connects straight to the workers' ROUTERs (no middle at all);
- ``proxy``: ``zmq.proxy`` (ROUTER/DEALER, in C) between them: the ceiling. It cannot route by
  service and gives no LRU guarantee (its DEALER deals round-robin, about window / workers
  requests queued at each worker);
- ``c-lru``: the C strict-LRU Majordomo broker (tools/mdp_lru.c, built here with gcc against
  pyzmq's libzmq): the floor every broker is a ratio to;
- ``c-lru-loop``: the very same C routing (tools/mdp_lru.h) as a CPython extension in a Python
  process whose Tornado IOLoop (on asyncio, as Scale0's) watches both sockets' ZMQ_FDs and calls
  one C function per wake-up (tools/mdp_lru_loop.c and .py): the floor of any C lane inside
  Scale0's loop; ``c-lru-asyncio`` the same in asyncio's loop without Tornado;
  ``c-lru-thread`` the same routing in a C thread of its own waiting in zmq_poll, beside an
  idle Tornado loop (a lane outside the Python loop). Only when named
  (``--cases c-lru c-lru-loop c-lru-asyncio c-lru-thread scale0-mdp``);
- ``majortomo``: majortomo's Majordomo broker (PyPI, pinned in setup.cfg), logging at WARNING;
- ``scale0``: a real ``scale0-broker`` process between them, speaking S0P/1, with
  ``lane: false`` (its Tornado loop reads the sockets: the broker before phase 3b);
- ``scale0-mdp``: the same broker on the same Majordomo drivers as ``c-lru`` and ``majortomo``
  (same-driver: its ratio to the floor is the one to quote);
- ``scale0-lane``, ``scale0-mdp-lane``: ``scale0`` and ``scale0-mdp`` with ``lane: true``,
  the default broker (the C lane owns the frontend and backend sockets and takes requests and
  replies itself, docs/architecture.md "Phase 3b"). Only when named;
- ``family``: two brokers of one family, the client at the first and every worker at the
  second, so every request is forwarded (FORWARD/FORWARDREPLY); CPU is both brokers';
- ``family-both``: two brokers with ``--workers`` workers each, the client at the first: it
  serves what its workers can take and forwards the rest while the second has a free slot;
  with ``--base-tree``, ``base-family-both`` is the same with both brokers from that tree;
- ``eventlog``: the ``scale0`` case with the broker writing its event log (``event_log_dir``,
  docs/trend.md) to a temporary directory; ``scale0`` runs with it off, so the row's
  ``x scale0`` is what the log costs in throughput (the issue's target: under 10 %);
- ``solo`` / ``solo-curve``, ``family`` / ``family-curve``: a family of one broker, and the
  family case, without and with CURVE on every socket (clients and workers with key pairs of
  their own, ZAP on): what CURVE costs, as a ratio within the run (docs/performance.md
  "CURVE"). Not in the default list: ``--cases solo solo-curve family family-curve``;
- ``base`` (with ``--base-tree DIR``): the same broker run from another source tree, e.g. the
  commit before a change (``git archive HEAD~1 scale0 | tar -x -C DIR``), so a change is timed
  against its own "before" in the same invocation; ``base-mdp`` is that broker on the
  Majordomo drivers (beside ``scale0-mdp``), and ``base-solo``, ``base-solo-curve``,
  ``base-family``, ``base-family-curve`` those cases' brokers from that tree (when named).

Drivers: ``proxy``, ``c-lru`` (and its loop cases) and ``majortomo`` are driven by the same
Majordomo client (tools/mdp.py, ``--mdp`` picks its framing; default majortomo's MDP/0.2, the
only one majortomo speaks) and, behind the brokers, the same Majordomo worker processes;
behind zmq.proxy, which speaks no Majordomo to workers, DEALER workers answer in MDP reply
framing. The Scale0
cases ``scale0``, ``family`` and ``base`` run S0P/1 clients and workers (with ``--capacity``):
their ratio to ``c-lru`` is not same-driver, and the output says so; ``scale0-mdp`` is.
Every request carries a fresh request id (no reply is served from a broker's reply cache).

``tools/bench trend [--events N]`` is a separate case (see ``trend_main``): the event log
writer's cost on the caller's thread and its drain rate, then events per second through the
trending job on ``local[*]`` for a generated log (1 million events; ``--events 10000000`` for
the issue's 10 M case).

It prints throughput, round-trip p50/p99, the middle process's CPU time per request (read
from /proc; "main+other" splits it into the main thread and the rest, i.e. libzmq's I/O
thread), the broker's loop wake-ups per request (Scale0: its ``net_wakeups`` / ``requests``
counters from the stats it logs when it stops; c-lru and its loop cases: their ``stats``
line), and the ratios of throughput against ``proxy`` and of throughput and CPU per request
against ``c-lru``, and "drivers µs/req": the CPU of the client process and the worker
processes per request (on a machine with few cores they compete with the broker for it). Only
ratios within one invocation are meaningful: absolute numbers drift on shared machines. Workers
and clients speak raw frames so the numbers measure the broker, not Scale0's client library.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale0.testing import curve_options, running_broker, running_brokers
from tools.mdp import DIALECTS, Dialect, Worker, reply_header, request_header
from tools.mdp_brokers import (
    BrokerUnavailable,
    RunningBroker,
    build_c_broker,
    build_c_loop_module,
    running_c_broker,
    running_c_loop_broker,
    running_majortomo,
)

CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVICE = b"echo"


def cpu_seconds(pid: int, task: int | None = None) -> float:
    """User + system CPU time so far of a process, or of one of its threads (``task``)."""
    path = f"/proc/{pid}/task/{task}/stat" if task is not None else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# ---- workers (each in its own process) ----------------------------------------------------------


def s0p_worker(endpoint: str, capacity: int, ready: Any) -> None:
    """A raw S0P/1 echo worker: CHECKCONFIG, READY, then REPLY to each REQUEST with its body.

    ``capacity`` is what it announces in READY (docs/protocol.md §4.2): how many requests the
    broker may give it at once. It still answers them one by one, in order."""
    s0p_curve_worker(endpoint, capacity, None, ready)


def s0p_tagged_worker(endpoint: str, capacity: int, tag: bytes, ready: Any) -> None:
    """:func:`s0p_worker` that adds ``tag`` as a last body frame to every reply, so the client
    can tell which broker's worker ran each request (``family-both``: local or forwarded)."""
    s0p_curve_worker(endpoint, capacity, None, ready, tag)


def s0p_curve_worker(
    endpoint: str,
    capacity: int,
    curve: tuple[str, str, str] | None,
    ready: Any,
    tag: bytes | None = None,
) -> None:
    """:func:`s0p_worker` over CURVE: ``curve`` is (public key, secret key, broker's key)."""
    tail = [tag] if tag is not None else []
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    set_curve(sock, curve)
    sock.connect(endpoint)
    sock.send_multipart([b"", b"S0W1", b"CHECKCONFIG", b'{"config_type":"json"}'])
    opts = json.loads(sock.recv_multipart()[3])
    ready_opts = {
        "services": [SERVICE.decode()],
        "heartbeat": False,
        "hbeatinterval_ms": 1000,
        "time": time.time(),
        "config_version": opts["config_version"],
        "capacity": capacity,
    }
    sock.send_multipart([b"", b"S0W1", b"READY", json.dumps(ready_opts).encode()])
    ready.set()
    while True:
        frames = sock.recv_multipart()
        if frames[2] == b"REQUEST":
            sock.send_multipart([b"", b"S0W1", b"REPLY", frames[3], b"200", *frames[5:], *tail])
        elif frames[2] in (b"DISCONNECT", b"DISCONNECTERROR"):
            break


def mdp_worker(endpoint: str, dialect_key: str, ready: Any) -> None:
    """A Majordomo echo worker (tools/mdp.py): READY, then each REQUEST answered with its body,
    heartbeating as RFC 7 says. The same worker serves every Majordomo broker of the run."""
    ctx = zmq.Context()
    worker = Worker(endpoint, SERVICE, DIALECTS[dialect_key], context=ctx)
    ready.set()
    while True:
        request = worker.recv(10.0)
        if request is not None:
            worker.reply(request, request.body)


def proxy_echo_worker(endpoint: str, dialect_key: str, ready: Any) -> None:
    """zmq.proxy's worker: a DEALER on its backend, answering the MDP client in the dialect's
    reply framing. zmq.proxy speaks no Majordomo to workers (it routes nothing by service), so
    this worker gets the client's request as it was sent, behind the client's routing id."""
    dialect = DIALECTS[dialect_key]
    skip = len(request_header(dialect, SERVICE))
    head = reply_header(dialect, SERVICE)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    ready.set()
    while True:
        frames = sock.recv_multipart()
        sock.send_multipart([frames[0], *head, *frames[1 + skip :]])


def echo_worker(endpoint: str, socket_type: int, bind: bool, ready: Any) -> None:
    """Baseline worker: echoes every message to its sender. A ROUTER the client connects to
    (direct), or a DEALER on zmq.proxy's backend (proxy)."""
    ctx = zmq.Context()
    sock = ctx.socket(socket_type)
    sock.linger = 0
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    ready.set()
    while True:
        sock.send_multipart(sock.recv_multipart())


def proxy_main(frontend: str, backend: str, ready: Any) -> None:
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    back = ctx.socket(zmq.DEALER)
    front.bind(frontend)
    back.bind(backend)
    ready.set()
    zmq.proxy(front, back)


# ---- the client (this process) ------------------------------------------------------------------


def set_curve(sock: zmq.Socket[bytes], curve: tuple[str, str, str] | None) -> None:
    """CURVE client options before connect: (our public key, our secret key, server key)."""
    if curve is not None:
        public, secret, server = curve
        sock.curve_publickey = public.encode()
        sock.curve_secretkey = secret.encode()
        sock.curve_serverkey = server.encode()


def run_client(
    endpoints: list[str],
    *,
    curve: tuple[str, str, str] | None = None,
    negotiate: bool = False,
    dialect: Dialect | None = None,
    requests: int,
    window: int,
    payload: bytes,
    middle_pid: int | None,
    also: tuple[int, ...] = (),
    drivers: tuple[int, ...] = (),
    split: dict[bytes, str] | None = None,
) -> dict[str, float]:
    """``middle_pid``: the process whose CPU is measured (main thread apart); ``also``: more
    processes whose CPU counts towards the total (the second broker of the family case).
    ``split``: the workers tag their replies (:func:`s0p_tagged_worker`); p50/p99 are also
    given per tag, under the name it maps to (``p99_<name>_us``).

    The client speaks S0P/1 (REQUEST, the request id frame, the body), or with ``dialect`` the
    Majordomo client of tools/mdp.py, its body the same two frames: request id, payload."""
    if dialect is None:
        head = [b"", b"S0C1", b"REQUEST", SERVICE]
        id_at = 4  # S0P/1 REPLY: "", S0C1, REPLY, service, request_id, status, body
    else:
        head = request_header(dialect, SERVICE)
        id_at = len(reply_header(dialect, SERVICE))  # the first body frame
    drive = functools.partial(_drive, head=head, id_at=id_at)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    set_curve(sock, curve)
    for endpoint in endpoints:
        sock.connect(endpoint)
    try:
        if negotiate:
            sock.send_multipart([b"", b"S0C1", b"CHECKCONFIG", b'{"config_type":"json"}'])
            if not sock.poll(10_000):
                raise RuntimeError("no CONFIG from the broker within 10 s")
            sock.recv_multipart()
        warmup = min(1000, requests)
        # Request ids never repeat within a run: the timed phase starts where the warm-up ended,
        # so no timed request is answered from the broker's reply cache (docs/performance.md).
        drive(sock, warmup, window, payload, [], first_id=0)
        rtts: list[float] = []
        tagged: dict[bytes, list[float]] | None = {tag: [] for tag in split} if split else None
        cpu_before = cpu_seconds(middle_pid) if middle_pid else 0.0
        cpu_before += sum(cpu_seconds(pid) for pid in also)
        # The middle's main thread (tid = pid) apart from the rest (libzmq's I/O thread).
        main_before = cpu_seconds(middle_pid, middle_pid) if middle_pid else 0.0
        # The drivers: this client process and the worker processes.
        drivers_before = time.process_time() + sum(cpu_seconds(pid) for pid in drivers)
        started = time.perf_counter()
        drive(sock, requests, window, payload, rtts, first_id=warmup, tagged=tagged)
        elapsed = time.perf_counter() - started
        cpu = (cpu_seconds(middle_pid) if middle_pid else 0.0) - cpu_before
        cpu += sum(cpu_seconds(pid) for pid in also)
        main = (cpu_seconds(middle_pid, middle_pid) - main_before) if middle_pid else 0.0
        driving = time.process_time() + sum(cpu_seconds(pid) for pid in drivers)
        driving -= drivers_before
    finally:
        sock.close()
        ctx.term()
    result = {
        "throughput": requests / elapsed,
        "p50_us": _percentile(rtts, 0.5),
        "p99_us": _percentile(rtts, 0.99),
        "cpu_us_per_request": cpu / requests * 1e6,
        "main_thread_us_per_request": main / requests * 1e6,
        "drivers_us_per_request": driving / requests * 1e6,
    }
    for tag, times in (tagged or {}).items():
        if times and split:
            result[f"p50_{split[tag]}_us"] = _percentile(times, 0.5)
            result[f"p99_{split[tag]}_us"] = _percentile(times, 0.99)
    return result


def _percentile(times: list[float], q: float) -> float:
    """The ``q`` quantile of round trips in seconds, in µs (``times`` is sorted in place)."""
    times.sort()
    return times[min(len(times) - 1, int(len(times) * q))] * 1e6


def _drive(
    sock: zmq.Socket[bytes],
    total: int,
    window: int,
    payload: bytes,
    rtts: list[float],
    *,
    first_id: int,
    head: list[bytes],
    id_at: int,
    tagged: dict[bytes, list[float]] | None = None,
) -> None:
    """Keep ``window`` requests outstanding until ``total`` are answered; record round trips.

    A request is ``head`` + [request id, payload]; the reply's request id is frame ``id_at``.
    Request ids are ``first_id``, ``first_id + 1``, …: each one fresh."""
    sent_at: dict[bytes, float] = {}
    sent = answered = 0
    clock = time.perf_counter
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while answered < total:
        while sent < total and sent - answered < window:
            request_id = (first_id + sent).to_bytes(8, "big")
            sent_at[request_id] = clock()
            sock.send_multipart([*head, request_id, payload])
            sent += 1
        if not poller.poll(10_000):
            raise RuntimeError(f"no reply within 10 s ({answered}/{total} answered)")
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            started = sent_at.pop(frames[id_at], None)
            if started is not None:
                rtts.append(clock() - started)
                if tagged is not None:
                    tagged[frames[-1]].append(rtts[-1])
                answered += 1


# ---- setups -------------------------------------------------------------------------------------


def start(target: Callable[..., None], *args: Any) -> multiprocessing.process.BaseProcess:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=target, args=(*args, ready), daemon=True)
    process.start()
    if not ready.wait(30):
        process.kill()
        raise RuntimeError(f"{target.__name__} did not start")
    return process


def free_endpoint() -> str:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.close(0)
    return f"tcp://127.0.0.1:{port}"


def case_direct(workers: int, capacity: int, **client: Any) -> dict[str, float]:
    endpoints = [free_endpoint() for _ in range(workers)]
    procs = [start(echo_worker, e, zmq.ROUTER, True) for e in endpoints]
    try:
        time.sleep(0.2)  # let the client's connects finish before timing
        return run_client(
            endpoints, middle_pid=None, drivers=tuple(p.pid or 0 for p in procs), **client
        )
    finally:
        for p in procs:
            p.kill()


def case_proxy(workers: int, capacity: int, *, dialect_key: str, **client: Any) -> dict[str, float]:
    """zmq.proxy with the Majordomo client: the ceiling (no LRU guarantee, no routing by service:
    its DEALER deals requests round-robin, about window / workers queued at each worker)."""
    front, back = free_endpoint(), free_endpoint()
    proxy = start(proxy_main, front, back)
    procs = [start(proxy_echo_worker, back, dialect_key) for _ in range(workers)]
    try:
        time.sleep(0.2)
        return run_client(
            [front],
            dialect=DIALECTS[dialect_key],
            middle_pid=proxy.pid,
            drivers=tuple(p.pid or 0 for p in procs),
            **client,
        )
    finally:
        for p in [*procs, proxy]:
            p.kill()


def case_c_lru(
    workers: int, capacity: int, *, binary: Path, dialect_key: str, **client: Any
) -> dict[str, float]:
    """The C strict-LRU Majordomo broker (tools/mdp_lru.c): the floor. MDP workers hold one
    request at a time by definition, so ``capacity`` does not apply."""
    with tempfile.TemporaryDirectory() as tmp, running_c_broker(binary, Path(tmp)) as broker:
        return _c_floor(broker, workers, dialect_key, client)


def case_c_lru_loop(
    workers: int,
    capacity: int,
    *,
    module: Path,
    dialect_key: str,
    loop: str = "tornado",
    **client: Any,
) -> dict[str, float]:
    """The same C routing as c-lru (tools/mdp_lru.h) inside a Python process's event loop
    (``loop``: Tornado's IOLoop, as Scale0 runs, or asyncio's alone), one C call per wake-up
    (tools/mdp_lru_loop.py): the floor of any C lane inside Scale0's loop."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_c_loop_broker(module, Path(tmp), loop=loop) as broker,
    ):
        return _c_floor(broker, workers, dialect_key, client)


def case_c_lru_asyncio(workers: int, capacity: int, **client: Any) -> dict[str, float]:
    """``c-lru-loop`` in asyncio's own loop, without Tornado."""
    return case_c_lru_loop(workers, capacity, loop="asyncio", **client)


def case_c_lru_thread(workers: int, capacity: int, **client: Any) -> dict[str, float]:
    """The same C routing in a C thread of its own (zmq_poll, as c-lru) inside a Python
    process whose Tornado loop is idle beside it: a lane outside the Python loop."""
    return case_c_lru_loop(workers, capacity, loop="thread", **client)


def _c_floor(
    broker: RunningBroker, workers: int, dialect_key: str, client: dict[str, Any]
) -> dict[str, float]:
    """The MDP workers and client against a running C-routing broker; its wake-ups per
    request from its ``stats`` line."""
    procs = [start(mdp_worker, broker.backend, dialect_key) for _ in range(workers)]
    try:
        time.sleep(0.2)
        result = run_client(
            [broker.frontend],
            dialect=DIALECTS[dialect_key],
            middle_pid=broker.pid,
            drivers=tuple(p.pid or 0 for p in procs),
            **client,
        )
    finally:
        for p in procs:
            p.kill()
    broker.stop()
    stats = broker.stats()
    if stats.get("requests"):
        result["wakeups_per_request"] = stats["wakeups"] / stats["requests"]
    if "again" in stats:  # the loop hosts: wake-ups that asked the loop for another (--json)
        result["wakeups_again"] = stats["again"]
    return result


def case_majortomo(
    workers: int, capacity: int, *, dialect_key: str, **client: Any
) -> dict[str, float]:
    """majortomo's broker (PyPI, pinned), logging at WARNING, with the same MDP drivers."""
    with tempfile.TemporaryDirectory() as tmp, running_majortomo(Path(tmp)) as broker:
        procs = [start(mdp_worker, broker.backend, dialect_key) for _ in range(workers)]
        try:
            time.sleep(0.2)
            return run_client(
                [broker.frontend],
                dialect=DIALECTS[dialect_key],
                middle_pid=broker.pid,
                drivers=tuple(p.pid or 0 for p in procs),
                **client,
            )
        finally:
            for p in procs:
                p.kill()


def case_scale0(
    workers: int,
    capacity: int,
    *,
    command: list[str] | None = None,
    event_log: bool = False,
    dialect_key: str | None = None,
    lane: bool = False,
    **client: Any,
) -> dict[str, float]:
    """A real ``scale0-broker``: S0P/1 client and workers (``capacity`` in their READY), or with
    ``dialect_key`` the same Majordomo client and worker processes as c-lru and majortomo
    (capacity 1 by MDP's definition: the ratio to the floor is then same-driver). ``lane``:
    with ``lane: true`` (the C lane owns the frontend and backend sockets, the default since
    phase 3b); else this tree's broker runs with ``lane: false`` (the loop reads them)."""
    # "info" only adds start/stop lines: broker_stopped carries the stats read below.
    overrides: dict[str, Any] = {
        "log_level": "info",
        "event_log_dir": "events" if event_log else None,
    }
    if lane or command is None:  # this tree's says which; another tree's is its default (or
        overrides["lane"] = lane  # from before the lane: it would refuse the key) unless asked
    # (None leaves the key out of the file: a tree from before event_log_dir reads it as well)
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_broker(
            Path(tmp),
            broker_overrides=overrides,
            max_queued_requests=100_000,
            max_requests_per_client=100_000,
            command=command,
        ) as broker,
    ):
        backend = broker.endpoints["backend"]
        if dialect_key is None:
            procs = [start(s0p_worker, backend, capacity) for _ in range(workers)]
        else:
            procs = [start(mdp_worker, backend, dialect_key) for _ in range(workers)]
        try:
            time.sleep(0.2)
            result = run_client(
                [broker.endpoints["frontend"]],
                negotiate=dialect_key is None,
                dialect=DIALECTS[dialect_key] if dialect_key is not None else None,
                middle_pid=broker.pid,
                drivers=tuple(p.pid or 0 for p in procs),
                **client,
            )
        finally:
            for p in procs:
                p.kill()
        broker.stop()
        for line in broker.logs():
            stats = line.get("stats") if line.get("event") == "broker_stopped" else None
            if isinstance(stats, dict) and stats.get("requests") and "net_wakeups" in stats:
                result["wakeups_per_request"] = stats["net_wakeups"] / stats["requests"]
        if event_log:  # the log was really written: one request line per answer
            result["request_records"] = sum(
                path.read_bytes().count(b'"kind":"request"')
                for path in (Path(tmp) / "events").rglob("*.jsonl")
            )
        return result


def case_eventlog(workers: int, capacity: int, **client: Any) -> dict[str, float]:
    """``scale0`` with the event log on (docs/trend.md "In the broker")."""
    return case_scale0(workers, capacity, event_log=True, **client)


def case_scale0_mdp(
    workers: int, capacity: int, *, dialect_key: str, **client: Any
) -> dict[str, float]:
    """``scale0`` on the same Majordomo drivers as c-lru and majortomo (same-driver)."""
    return case_scale0(workers, capacity, dialect_key=dialect_key, **client)


def case_scale0_lane(workers: int, capacity: int, **client: Any) -> dict[str, float]:
    """``scale0`` with ``lane: true``: requests and replies cross the lane's pipes."""
    return case_scale0(workers, capacity, lane=True, **client)


def case_scale0_mdp_lane(
    workers: int, capacity: int, *, dialect_key: str, **client: Any
) -> dict[str, float]:
    """``scale0-mdp`` with ``lane: true``."""
    return case_scale0(workers, capacity, dialect_key=dialect_key, lane=True, **client)


def case_family(
    workers: int,
    capacity: int,
    *,
    curve: bool = False,
    tree: Path | None = None,
    **client: Any,
) -> dict[str, float]:
    """Two brokers of one family: the client at b1, every worker at b2 (docs/protocol.md §5.4).

    CPU is both brokers' together; "main" is b1's main thread. ``tree``: the brokers import
    scale0 from that source tree (``base-family``: a change's before).
    """
    with (
        _brokers_from(tree),
        tempfile.TemporaryDirectory() as tmp,
        running_brokers(
            Path(tmp),
            2,
            broker_overrides=[{"log_level": "info", "event_log_dir": None}] * 2,
            max_queued_requests=100_000,
            curve=curve,
            max_requests_per_client=100_000,
        ) as (b1, b2),
    ):
        keys = _keys(b2, "worker")
        procs = [
            start(s0p_curve_worker, b2.endpoints["backend"], capacity, keys) for _ in range(workers)
        ]
        try:
            time.sleep(1.5)  # b1 learns b2's table from b2's next HEARTBEAT (pull)
            return run_client(
                [b1.endpoints["frontend"]],
                curve=_keys(b1, "client"),
                negotiate=True,
                middle_pid=b1.pid,
                also=(b2.pid,),
                drivers=tuple(p.pid or 0 for p in procs),
                **client,
            )
        finally:
            for p in procs:
                p.kill()


@contextlib.contextmanager
def _brokers_from(tree: Path | None) -> Iterator[None]:
    """Brokers started inside import scale0 from ``tree`` (None: this one). They are the
    installed script, so PYTHONPATH picks their tree; restored on the way out."""
    saved = os.environ.get("PYTHONPATH")
    if tree is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), saved]))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def case_family_both(
    workers: int, capacity: int, *, tree: Path | None = None, **client: Any
) -> dict[str, float]:
    """Two brokers, ``workers`` workers at each, the client at b1: b1 serves what its own
    workers can take, forwards to b2 while b2's table (or b2's answers, F9) show a free slot,
    and holds the rest until one of the two frees. CPU is both brokers'. ``tree``: the brokers
    import scale0 from that source tree (``base-family-both``: a change's before)."""
    with (
        _brokers_from(tree),
        tempfile.TemporaryDirectory() as tmp,
        running_brokers(
            Path(tmp),
            2,
            broker_overrides=[{"log_level": "info", "event_log_dir": None}] * 2,
            max_queued_requests=100_000,
        ) as (b1, b2),
    ):
        procs = [
            start(s0p_tagged_worker, broker.endpoints["backend"], capacity, tag)
            for broker, tag in ((b1, b"b1"), (b2, b"b2"))
            for _ in range(workers)
        ]
        try:
            time.sleep(1.5)  # b1 learns b2's table from b2's next HEARTBEAT (pull)
            result = run_client(
                [b1.endpoints["frontend"]],
                negotiate=True,
                middle_pid=b1.pid,
                also=(b2.pid,),
                drivers=tuple(p.pid or 0 for p in procs),
                split={b"b1": "local", b"b2": "forwarded"},
                **client,
            )
        finally:
            for p in procs:
                p.kill()
        b1.stop()
        for line in b1.logs():
            stats = line.get("stats") if line.get("event") == "broker_stopped" else None
            if isinstance(stats, dict) and stats.get("requests"):
                # How much of the work b2's workers took (warm-up included).
                result["forwarded_share"] = stats["forwarded"] / stats["requests"]
        return result


def _keys(broker: Any, who: str) -> tuple[str, str, str] | None:
    """(public, secret, the broker's key) of ``who`` in a CURVE family, None without CURVE."""
    options = curve_options(broker, who)
    if not options:
        return None
    return options["curve"].public, options["curve"].secret, options["server_key"]


def case_solo(
    workers: int,
    capacity: int,
    *,
    curve: bool = False,
    tree: Path | None = None,
    **client: Any,
) -> dict[str, float]:
    """A family of one broker (its own config source), with CURVE on every socket or not: the
    pair whose ratio is what CURVE costs one broker (docs/performance.md "CURVE"). ``tree``:
    the broker imports scale0 from that source tree (``base-solo``: a change's before)."""
    with (
        _brokers_from(tree),
        tempfile.TemporaryDirectory() as tmp,
        running_brokers(
            Path(tmp),
            1,
            broker_overrides=[{"log_level": "info", "event_log_dir": None}],
            max_queued_requests=100_000,
            curve=curve,
        ) as (b1,),
    ):
        keys = _keys(b1, "worker")
        procs = [
            start(s0p_curve_worker, b1.endpoints["backend"], capacity, keys) for _ in range(workers)
        ]
        try:
            time.sleep(0.2)
            return run_client(
                [b1.endpoints["frontend"]],
                curve=_keys(b1, "client"),
                negotiate=True,
                middle_pid=b1.pid,
                drivers=tuple(p.pid or 0 for p in procs),
                **client,
            )
        finally:
            for p in procs:
                p.kill()


def case_solo_curve(workers: int, capacity: int, **client: Any) -> dict[str, float]:
    return case_solo(workers, capacity, curve=True, **client)


def case_family_curve(workers: int, capacity: int, **client: Any) -> dict[str, float]:
    """``family`` with CURVE on every socket of both brokers (and the forwarding link)."""
    return case_family(workers, capacity, curve=True, **client)


#: The family cases that also run from ``--base-tree`` (as ``base-<name>``) when named.
TREE_CASES = ("solo", "solo-curve", "family", "family-curve")


def base_case(tree: Path, dialect_key: str | None = None) -> Callable[..., dict[str, float]]:
    """The scale0 case (with ``dialect_key``: scale0-mdp) with the broker imported from
    ``tree`` (a checkout's top directory)."""
    code = (
        f"import sys; sys.path.insert(0, {str(tree)!r})\nfrom scale0.cli.broker import main\nmain()"
    )

    def case_base(workers: int, capacity: int, **client: Any) -> dict[str, float]:
        command = [sys.executable, "-c", code]
        return case_scale0(workers, capacity, command=command, dialect_key=dialect_key, **client)

    return case_base


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run of median throughput (the lower middle one of an even count), with how many."""
    ordered = sorted(runs, key=lambda r: r["throughput"])
    return {**ordered[(len(ordered) - 1) // 2], "runs": len(runs)}


CASES = {
    "direct": case_direct,
    "proxy": case_proxy,
    "c-lru": case_c_lru,
    "c-lru-loop": case_c_lru_loop,
    "c-lru-asyncio": case_c_lru_asyncio,
    "c-lru-thread": case_c_lru_thread,
    "majortomo": case_majortomo,
    "scale0": case_scale0,
    "eventlog": case_eventlog,
    "scale0-mdp": case_scale0_mdp,
    "scale0-lane": case_scale0_lane,
    "scale0-mdp-lane": case_scale0_mdp_lane,
    "family": case_family,
    "family-both": case_family_both,
    "solo": case_solo,
    "solo-curve": case_solo_curve,
    "family-curve": case_family_curve,
}
#: The C routing's hosts in a Python process (tools/mdp_lru_loop.py).
LOOP_CASES = ("c-lru-loop", "c-lru-asyncio", "c-lru-thread")
#: Cases run only when named (--cases): CURVE's cost and its plain twin; the C routing in a
#: Python process.
OPTIONAL_CASES = (
    "solo",
    "solo-curve",
    "family-curve",
    "scale0-lane",
    "scale0-mdp-lane",
    *LOOP_CASES,
)
#: The cases driven by the Majordomo client (and, but for proxy, the Majordomo workers).
MDP_CASES = ("proxy", "c-lru", *LOOP_CASES, "majortomo", "scale0-mdp", "scale0-mdp-lane")


# ---- trend: the event log writer and the Spark job (tools/bench trend) --------------------------


def bench_writer(directory: Path, records: int) -> dict[str, float]:
    """Caller-side ns per ``EventLogWriter.request`` next to an empty call of the same
    signature (the loop's own cost), and how fast the writer thread drains to disk."""
    from scale0.trend.eventlog import EventLogWriter  # noqa: PLC0415 (only this case needs it)

    def nothing(*args: object) -> bool:
        return True

    clock = time.perf_counter
    started = clock()
    for i in range(records):
        nothing(i, "echo", "w1", "c0ffee", None, i, 1.5, 100, 200, 200, 1)
    empty_s = clock() - started
    writer = EventLogWriter(directory, "bench", capacity=records + 1, fsync=False)
    started = clock()
    for i in range(records):
        writer.request(i, "echo", "w1", "c0ffee", None, i, 1.5, 100, 200, 200, 1)
    caller_s = clock() - started
    drain_started = clock()
    writer.start()
    writer.close(timeout_s=600)
    drain_s = clock() - drain_started
    stats = writer.stats()
    if stats["written"] != records:
        raise RuntimeError(f"writer bench: wrote {stats['written']} of {records}")
    return {
        "records": records,
        "caller_ns": caller_s / records * 1e9,
        "empty_call_ns": empty_s / records * 1e9,
        "drain_records_per_s": records / drain_s,
    }


def trend_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/bench trend",
        description="Events per second through scale0-trend on a generated log, and the "
        "event log writer's cost per record.",
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="records to generate")
    parser.add_argument("--days", type=float, default=1.0, help="span of the generated log")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--writer-records", type=int, default=500_000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from scale0.trend.job import run, spark_session  # noqa: PLC0415 (needs pyspark)
    from scale0.trend.synth import Plan, generate  # noqa: PLC0415

    result: dict[str, Any] = {"events": args.events, "master": args.master}
    with tempfile.TemporaryDirectory(prefix="scale0-bench-trend-") as tmp:
        result["writer"] = bench_writer(Path(tmp) / "writer", args.writer_records)
        src = Path(tmp) / "events"
        started = time.perf_counter()
        plan = Plan(seed=1, days=args.days, rate=args.events / (args.days * 86_400))
        totals = generate(src, plan)
        result["generate_s"] = time.perf_counter() - started
        result["records"] = totals.records
        result["bytes"] = sum(p.stat().st_size for p in src.rglob("*.jsonl"))
        started = time.perf_counter()
        spark = spark_session(args.master, driver_memory=args.driver_memory)
        result["session_s"] = time.perf_counter() - started

        def progress(message: str) -> None:
            print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr)

        try:
            started = time.perf_counter()
            run(spark, str(src), Path(tmp) / "out", progress=progress)
            result["job_s"] = time.perf_counter() - started
            started = time.perf_counter()
            again = run(spark, str(src), Path(tmp) / "out")
            result["rerun_s"] = time.perf_counter() - started
            if again.files_new:
                raise RuntimeError("the rerun read files again")
        finally:
            spark.stop()
    result["events_per_s"] = result["records"] / result["job_s"]
    if args.json:
        print(json.dumps(result))
        return 0
    w = result["writer"]
    print(
        f"event log writer, {w['records']} records: {w['caller_ns']:.0f} ns per request() on the "
        f"caller's thread (an empty call with the same arguments: {w['empty_call_ns']:.0f} ns); "
        f"writer thread drains {w['drain_records_per_s']:.0f} records/s"
    )
    print(
        f"generated {result['records']} records ({result['bytes'] / 1e6:.0f} MB) in "
        f"{result['generate_s']:.1f} s; Spark session ({args.master}) {result['session_s']:.1f} s"
    )
    print(
        f"scale0-trend: {result['job_s']:.1f} s, {result['events_per_s']:.0f} events/s; "
        f"re-run with no new files {result['rerun_s']:.1f} s"
    )
    return 0


DRIVERS = {
    "direct": "S0P",
    "proxy": "MDP",
    "c-lru": "MDP",
    "c-lru-loop": "MDP",
    "c-lru-asyncio": "MDP",
    "c-lru-thread": "MDP",
    "majortomo": "MDP",
    "scale0": "S0P",
    "eventlog": "S0P",
    "scale0-mdp": "MDP",
    "scale0-lane": "S0P",
    "scale0-mdp-lane": "MDP",
    "family": "S0P",
    "family-both": "S0P",
    "base-family-both": "S0P",
    "solo": "S0P",
    "solo-curve": "S0P",
    "family-curve": "S0P",
    "base": "S0P",
    "base-mdp": "MDP",
    **{f"base-{name}": "S0P" for name in TREE_CASES},
}


def notes(args: argparse.Namespace, names: list[str], skipped: dict[str, str]) -> list[str]:
    """What the table's reader must know to read it: drivers, guarantees, the machine."""
    dialect = DIALECTS[args.mdp]
    lines = [
        f"window {args.window}, {args.requests} timed requests per case, a fresh request id for "
        "every request (ratios only compare within this run)"
    ]
    if args.repeat > 1:
        lines.append(f"each case: the median (by req/s) of {args.repeat} interleaved runs")
    mdp = [n for n in names if n in MDP_CASES]
    brokers = [n for n in mdp if n != "proxy"]
    if mdp:
        behind = (
            f"; behind {' and '.join(brokers)} the same tools/mdp.py worker processes "
            if brokers
            else ""
        )
        lines.append(
            f"MDP driver ({', '.join(mdp)}): one tools/mdp.py client speaking {dialect.name}"
            + (behind + "(capacity 1 by MDP's definition)" if brokers else "")
        )
    if "proxy" in names:
        lines.append(
            "proxy: zmq.proxy cannot route by service and gives no LRU guarantee (its DEALER "
            "queues about window / workers requests at each worker); its workers answer in MDP "
            "reply framing: the ceiling, not a peer"
        )
    if "c-lru" in names:
        lines.append(
            "c-lru: tools/mdp_lru.c, strict LRU (a worker gets its next request only after it "
            "replied, ready workers FIFO), zero-copy forwarding: the floor every ratio is taken to"
        )
    loops = [n for n in names if n in LOOP_CASES]
    if loops:
        lines.append(
            f"{', '.join(loops)}: c-lru's routing (tools/mdp_lru.h) in a Python process, one C "
            "call per wake-up of its loop (c-lru-loop: Tornado's IOLoop, as Scale0 runs; "
            "c-lru-asyncio: asyncio's alone): the floor of a C lane inside a Python loop; "
            "c-lru-thread: in a C thread of its own beside an idle Tornado loop"
        )
    s0p = [n for n in names if DRIVERS.get(n) == "S0P" and n != "direct"]
    if s0p:
        lines.append(
            f"S0P driver ({', '.join(s0p)}): S0P/1 clients and workers (capacity "
            f"{args.capacity}): their ratio to c-lru is NOT same-driver (scale0-mdp is)"
        )
    for name, reason in skipped.items():
        lines.append(f"{name}: not run: {reason}")
    cores = os.cpu_count() or 0
    load = os.getloadavg()[0]
    lines.append(
        f"machine: {cores} cores, load {load:.1f} at the start; the client, the workers and the "
        "broker share them, so a broker that needs less CPU leaves more to its drivers: req/s "
        f"can be at most {cores} s / (µs CPU/req + drivers µs/req), less under other load"
    )
    return lines


def main() -> int:
    if sys.argv[1:2] == ["trend"]:
        return trend_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="timed requests per case")
    parser.add_argument("--window", type=int, default=100, help="requests outstanding")
    parser.add_argument("--payload", type=int, nargs="+", default=[1, 100, 1024])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--capacity",
        type=int,
        default=1,
        help="what each S0P/1 worker announces in READY (1: one request at a time, strict LRU)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=sorted(CASES),
        default=[name for name in CASES if name not in OPTIONAL_CASES],
        help="the setups to run (tools/bench.py's docstring says what each is); run only when "
        f"named: {', '.join(OPTIONAL_CASES)}. c-lru-loop: c-lru's C routing called once per "
        "wake-up by a Tornado IOLoop in a Python process (the floor of a C lane inside Scale0's "
        "loop); c-lru-asyncio: the same in asyncio's loop without Tornado; c-lru-thread: in a "
        "C thread of its own (zmq_poll) beside an idle Tornado loop",
    )
    parser.add_argument(
        "--mdp",
        choices=sorted(DIALECTS),
        default="majortomo",
        help="the Majordomo framing of the MDP driver (default: majortomo's MDP/0.2, the only "
        "one majortomo speaks; with 0.1 or 0.2 the majortomo case is not run)",
    )
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="also run case 'base': the broker from this source tree (it holds scale0/); "
        "'base-mdp' too when scale0-mdp runs (the same on the Majordomo drivers)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every case this many times, interleaved, and keep each case's median run "
        "(by throughput): steadier ratios on a loaded machine",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    cases: dict[str, Callable[..., dict[str, float]]] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="scale0-bench-") as tmp:
        for name in args.cases:
            case = CASES[name]
            if name in MDP_CASES:
                case = functools.partial(case, dialect_key=args.mdp)
            if name == "majortomo" and args.mdp != "majortomo":
                skipped[name] = f"majortomo speaks only its own MDP/0.2, not --mdp {args.mdp}"
                continue
            try:
                if name == "c-lru":
                    case = functools.partial(case, binary=build_c_broker(Path(tmp)))
                elif name in LOOP_CASES:
                    case = functools.partial(case, module=build_c_loop_module(Path(tmp)))
            except BrokerUnavailable as e:
                skipped[name] = str(e)
                continue
            cases[name] = case
        if args.base_tree is not None:
            if not (args.base_tree / "scale0" / "net" / "node.py").is_file():
                parser.error(f"--base-tree {args.base_tree}: no scale0/net/node.py there")
            if "scale0-mdp" not in cases or any(DRIVERS[n] == "S0P" for n in cases):
                cases["base"] = base_case(args.base_tree.resolve())
            if "family-both" in cases:
                tree = args.base_tree.resolve()
                cases["base-family-both"] = functools.partial(case_family_both, tree=tree)
            for name in TREE_CASES:  # CURVE's cost before the change, in the same run
                if name in cases:
                    tree = args.base_tree.resolve()
                    cases[f"base-{name}"] = functools.partial(CASES[name], tree=tree)
            if "scale0-mdp" in cases:  # the same broker's before, on the same MDP drivers
                cases["base-mdp"] = base_case(args.base_tree.resolve(), args.mdp)
        header = notes(args, list(cases), skipped)
        if not args.json:
            print("\n".join(header), flush=True)
        rows = []
        for workers in args.workers:
            for size in args.payload:
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
                for _ in range(max(1, args.repeat)):
                    for name, case in cases.items():
                        runs[name].append(
                            case(
                                workers,
                                args.capacity,
                                requests=args.requests,
                                window=args.window,
                                payload=b"x" * size,
                            )
                        )
                results = {name: median_run(done) for name, done in runs.items()}
                proxy, floor = results.get("proxy"), results.get("c-lru")
                plain = results.get("scale0")
                for name, r in results.items():
                    row = {"case": name, "driver": DRIVERS[name], "workers": workers}
                    row.update(payload=size, **r)
                    if proxy:
                        row["throughput_vs_proxy"] = r["throughput"] / proxy["throughput"]
                    if plain and name == "eventlog":
                        row["throughput_vs_scale0"] = r["throughput"] / plain["throughput"]
                    if floor:
                        row["throughput_vs_c_lru"] = r["throughput"] / floor["throughput"]
                        if name != "direct":
                            cpu = r["cpu_us_per_request"] / floor["cpu_us_per_request"]
                            row["cpu_vs_c_lru"] = cpu
                    rows.append(row)
    if args.json:
        print(
            json.dumps(
                {
                    "notes": header,
                    "window": args.window,
                    "requests": args.requests,
                    "mdp": args.mdp,
                    "rows": rows,
                }
            )
        )
        return 0
    print(table(rows))
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    def ratio(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.2f}" if key in row else "-"

    head = (
        f"{'case':13} {'driver':6} {'workers':>7} {'payload':>7} {'req/s':>9} {'p50 µs':>8} "
        f"{'p99 µs':>8} {'µs CPU/req':>10} {'main+other':>11} {'x proxy':>8} {'x c-lru':>8} "
        f"{'CPU x c-lru':>11} {'wakeups/req':>11} {'drivers µs/req':>14}"
    )
    lines = [head]
    for row in rows:
        cpu = f"{row['cpu_us_per_request']:.1f}" if row["case"] != "direct" else "-"
        split = "-"
        if row["case"] != "direct":
            main = row["main_thread_us_per_request"]
            split = f"{main:.0f}+{row['cpu_us_per_request'] - main:.0f}"
        wakeups = f"{row['wakeups_per_request']:.2f}" if "wakeups_per_request" in row else "-"
        lines.append(
            f"{row['case']:13} {row['driver']:6} {row['workers']:>7} {row['payload']:>7} "
            f"{row['throughput']:>9.0f} {row['p50_us']:>8.0f} {row['p99_us']:>8.0f} "
            f"{cpu:>10} {split:>11} {ratio(row, 'throughput_vs_proxy'):>8} "
            f"{ratio(row, 'throughput_vs_c_lru'):>8} {ratio(row, 'cpu_vs_c_lru'):>11} "
            f"{wakeups:>11} {row['drivers_us_per_request']:>14.1f}"
        )
    shares = [row for row in rows if "forwarded_share" in row]
    if shares:
        lines.append(
            "requests the first broker forwarded to the second (family-both), and the round"
            " trips of those its own workers ran (local) and of those forwarded, p50 / p99 µs:"
        )
        for row in shares:
            split = " ".join(
                f"{kind} {row[f'p50_{kind}_us']:.0f} / {row[f'p99_{kind}_us']:.0f}"
                for kind in ("local", "forwarded")
                if f"p50_{kind}_us" in row
            )
            lines.append(
                f"  {row['case']}, workers {row['workers']}: {row['forwarded_share']:.1%}; {split}"
            )
    costs = [row for row in rows if "throughput_vs_scale0" in row]
    if costs:
        lines.append("event log on / off (eventlog / scale0, same run):")
        for row in costs:
            lines.append(
                f"  workers {row['workers']}, payload {row['payload']}: throughput "
                f"x {row['throughput_vs_scale0']:.3f}, "
                f"{row.get('request_records', 0)} request records written"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
