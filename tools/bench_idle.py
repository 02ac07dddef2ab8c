"""``tools/bench idle``: what liveness costs a broker with many idle clients and workers.

Issue 14's target: a broker with 2 000 idle connected workers and 2 000 idle clients spends
under 5 % of one core on liveness. One real ``scale0-broker`` (the network config's
defaults: a heartbeat every ``default_heartbeat_interval_ms`` = 1 s, liveness 3) and driver
processes that each hold a share of the connections as raw DEALERs: every one negotiates
(CHECKCONFIG), the workers say READY (heartbeat on), and then each sends a HEARTBEAT every
interval, as the protocol asks (docs/protocol.md §3.6, §4.2), and reads what the broker sends
(the broker's HEARTBEATs to workers, its answers to clients). Nothing else happens.

The broker's CPU is read from /proc over a window that starts once every connection is
registered (``status`` says so) and is quoted as a share of one core, beside the drivers' own
CPU, which on a small machine competes with the broker for the same cores. It also checks
that no connection was lost during the window (a broker too slow to keep up would expire them).

    tools/bench idle                              # 2 000 workers, 2 000 clients, 30 s
    tools/bench idle --workers 500 --clients 500 --seconds 10
    tools/bench idle --base-tree /tmp/base --repeat 2     # against a change's "before", alternating
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale0.testing import running_broker

CLK_TCK = os.sysconf("SC_CLK_TCK")
INTERVAL_S = 1.0  # the network config's default_heartbeat_interval_ms


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def driver(
    frontend: str,
    backend: str,
    workers: int,
    clients: int,
    ready_event: Any,
    stop: Any,
    lost: Any,
    late: Any,
) -> None:
    """Hold ``workers`` + ``clients`` idle connections, heartbeating each every interval;
    count in ``lost`` every connection the broker forgot (FORCENEGOTIATE or an error)."""
    ctx = zmq.Context()
    socks: list[tuple[zmq.Socket[bytes], bytes]] = []
    for n in range(workers + clients):
        worker = n < workers
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(backend if worker else frontend)
        socks.append((sock, b"S0W1" if worker else b"S0C1"))
    poller = zmq.Poller()
    for sock, _ in socks:
        poller.register(sock, zmq.POLLIN)
    version = 0
    for sock, signature in socks:
        sock.send_multipart([b"", signature, b"CHECKCONFIG", b'{"config_type":"json"}'])
    answered = 0
    deadline = time.monotonic() + 60
    while answered < len(socks) and time.monotonic() < deadline:
        for sock, _ in dict(poller.poll(1000)).items():
            while sock.poll(0):
                frames = sock.recv_multipart()
                if frames[2] in (b"CONFIG", b"CONFIGACK"):
                    version = json.loads(frames[3]).get("config_version", version)
                    answered += 1

    def ready(sock: zmq.Socket[bytes], signature: bytes) -> None:
        options = {
            "services": ["idle"],
            "heartbeat": True,
            "hbeatinterval_ms": int(INTERVAL_S * 1000),
            "time": time.time(),
            "config_version": version,
        }
        sock.send_multipart([b"", signature, b"READY", json.dumps(options).encode()])

    for sock, signature in socks[:workers]:
        ready(sock, signature)
    ready_event.set()
    signature_of = dict(socks)
    next_beat = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_beat:
            beat = json.dumps({"time": time.time(), "config_version": version}).encode()
            for sock, signature in socks:
                sock.send_multipart([b"", signature, b"HEARTBEAT", beat])
            with late.get_lock():  # how late the round's last HEARTBEAT left: a starved driver
                late.value = max(late.value, time.monotonic() - next_beat)
            next_beat = now + INTERVAL_S * 0.8  # well inside the interval, as a client does
        for sock, _ in dict(poller.poll(100)).items():
            while sock.poll(0):
                command = sock.recv_multipart()[2]
                signature = signature_of[sock]
                if command in (b"FORCENEGOTIATE", b"DISCONNECTERROR"):
                    # Forgotten (a driver starved past liveness on a loaded machine, or a
                    # broker too slow): counted, and negotiated again as a client would, so
                    # the load stays what it was.
                    with lost.get_lock():
                        lost.value += 1
                    sock.send_multipart([b"", signature, b"CHECKCONFIG", b'{"config_type":"json"}'])
                elif command in (b"CONFIG", b"CONFIGACK") and signature == b"S0W1":
                    ready(sock, signature)


def measure(args: argparse.Namespace, command: list[str] | None) -> dict[str, float]:
    """One broker (``command``: from another tree; None: this one) under the idle load."""
    spawn = multiprocessing.get_context("spawn")
    # "info" adds only start/stop lines; broker_stopped carries the counters read below.
    overrides = {"log_level": "info"}
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_broker(Path(tmp), broker_overrides=overrides, command=command) as broker,
    ):
        born = time.monotonic()
        frontend, backend = broker.endpoints["frontend"], broker.endpoints["backend"]
        stop = spawn.Event()
        lost = spawn.Value("i", 0)
        late = spawn.Value("d", 0.0)
        procs = []
        for d in range(args.drivers):
            w = args.workers // args.drivers + (d < args.workers % args.drivers)
            c = args.clients // args.drivers + (d < args.clients % args.drivers)
            ready = spawn.Event()
            p = spawn.Process(
                target=driver,
                args=(frontend, backend, w, c, ready, stop, lost, late),
            )
            p.start()
            procs.append((p, ready))
        try:
            for _, ready in procs:
                if not ready.wait(120):
                    raise RuntimeError("a driver did not register its connections in 120 s")
            time.sleep(3 * INTERVAL_S)  # settle: every worker's READY handled, timers armed
            lost_before = lost.value
            late.value = 0.0
            broker_before = cpu_seconds(broker.pid)
            drivers_before = sum(cpu_seconds(p.pid or 0) for p, _ in procs)
            started = time.monotonic()
            time.sleep(args.seconds)
            elapsed = time.monotonic() - started
            broker_cpu = cpu_seconds(broker.pid) - broker_before
            drivers_cpu = sum(cpu_seconds(p.pid or 0) for p, _ in procs) - drivers_before
            lost_in_window = lost.value - lost_before
            worst_late = late.value
            broker_life_cpu = cpu_seconds(broker.pid)
        finally:
            stop.set()
            for p, _ in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
        broker.stop()
        life = time.monotonic() - born
        stats: dict[str, Any] = {}
        for line in broker.logs():
            if line.get("event") == "broker_stopped" and isinstance(line.get("stats"), dict):
                stats = line["stats"]
    messages = stats.get("net_received", 0) + stats.get("net_sent", 0)
    return {
        # Over the broker's life (negotiation included): what one message in or out costs it,
        # which a connection forgotten and negotiated again does not distort as the share does.
        "us_per_message": broker_life_cpu / messages * 1e6 if messages else float("nan"),
        "wakeups_per_s": stats.get("net_wakeups", 0) / life,
        "ticks_per_s": stats.get("net_ticks", 0) / life,
        "broker": broker_cpu / elapsed,
        "drivers": drivers_cpu / elapsed,
        "lost": lost_in_window,
        "late_s": worst_late,
        "elapsed": elapsed,
        "load": os.getloadavg()[0],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench idle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--drivers", type=int, default=4, help="driver processes")
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="also measure the broker of this source tree (a change's before), alternating",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each broker")
    args = parser.parse_args(argv)
    trees: list[tuple[str, list[str] | None]] = []
    if args.base_tree is not None:
        tree = args.base_tree.resolve()
        if not (tree / "scale0" / "net" / "node.py").is_file():
            parser.error(f"--base-tree {tree}: no scale0/net/node.py there")
        code = (
            f"import sys; sys.path.insert(0, {str(tree)!r})\n"
            "from scale0.cli.broker import main\nmain()"
        )
        trees.append(("base", [sys.executable, "-c", code]))
    trees.append(("scale0", None))
    print(
        f"{args.workers} idle workers, {args.clients} idle clients, heartbeat every "
        f"{INTERVAL_S:g} s, {args.seconds:.0f} s window, {os.cpu_count()} cores"
    )
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for _ in range(args.repeat):
        for name, command in trees:
            result = measure(args, command)
            results[name].append(result)
            print(
                f"{name:>6}: broker CPU {result['broker'] * 100:.2f} % of one core, drivers' "
                f"{result['drivers'] * 100:.1f} %, {result['us_per_message']:.1f} µs per "
                f"message, connections forgotten {result['lost']:.0f} (drivers' latest "
                f"HEARTBEAT round {result['late_s']:.1f} s behind), "
                f"broker wake-ups {result['wakeups_per_s']:.0f}/s (timer "
                f"{result['ticks_per_s']:.0f}/s) (load {result['load']:.1f})",
                flush=True,
            )
    mine = results["scale0"]
    share = sorted(r["broker"] for r in mine)[(len(mine) - 1) // 2]
    if "base" in results:
        base = sorted(r["broker"] for r in results["base"])[(len(mine) - 1) // 2]
        base_us = sorted(r["us_per_message"] for r in results["base"])[(len(mine) - 1) // 2]
        mine_us = sorted(r["us_per_message"] for r in mine)[(len(mine) - 1) // 2]
        print(
            f"µs per message, median run: base {base_us:.1f}, scale0 {mine_us:.1f} "
            f"(x {mine_us / base_us:.2f} of base)"
        )
        print(
            f"broker CPU, median run: base {base * 100:.2f} %, scale0 {share * 100:.2f} % "
            f"(x {share / base:.2f} of base)"
        )
    print(f"broker CPU: {share * 100:.2f} % of one core (target: under 5 %)")
    lost = sum(r["lost"] for r in mine)
    print(f"connections the broker forgot during the windows: {lost:.0f} (should be 0)")
    return 0 if share < 0.05 and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
