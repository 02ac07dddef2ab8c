"""Network faults against a real 3-broker family in namespaces, and what they did (issue 15 #5).

:func:`run` builds a :class:`~scale0.chaos.lab.Lab` of three hosts ``b1 b2 b3``, writes a family
whose brokers bind their host's address (b1 and b2 config sources, each with its own network
file; b3 joins from b1), and starts in the namespaces: the three ``scale0-broker`` processes, an
``echo`` worker at b2 and at b3, a client at every broker (b1's requests can only be served
through the family), a management probe per broker, and a rogue config publisher in b3's
namespace that every broker subscribes to (unsigned, unknown-key and older configs, all the
time). Then, one after another, each fault of :data:`FAULTS` on b1's link:

``partition``     b1's link down at the hub: b1 and its client hear no one, both ways
``one_way_loss``  every frame towards b1 dropped; b1 is still heard by the others
``delay``         300 ms added to every frame from every host (600 ms round trips)
``flapping``      b1's link down and up every second

During each fault a new signed config version is published on each side: v+1 by b1 (SIGHUP
after its file changed), then v+2 by b2. After healing the harness waits until every broker
runs v+2 and the heartbeat tables agree, as read through management (``status``,
``list_peers``, ``list_services``): each broker's view of every other broker (up, its config
version, its services) matches what that broker says of itself.

Checked for every fault (a :class:`FaultReport`'s ``violations``): no request lost (every
request a client sent has exactly one outcome); every answered (acknowledged) request was run
by a worker and answered with its own body; every request finishes (answer or a named
Scale0 error) within its deadline plus :data:`DEADLINE_SLACK_S`; every broker converges; and,
from each broker's log, no broker ever applies a config that is older than the one it runs,
unsigned, or not one of ours.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import yaml

from scale0.chaos.lab import Lab, LabError, Spawned
from scale0.config.canonical import config_sha256
from scale0.config.loader import load
from scale0.testing import FAMILY_ADMINS, broker_command, pick_free_ports, write_family_configs

__all__ = ["DEADLINE_SLACK_S", "FAULTS", "FaultReport", "run", "summary_table"]

FAULTS: Final = ("partition", "one_way_loss", "delay", "flapping")
HOSTS: Final = ("b1", "b2", "b3")
#: The clients' per-request deadline (s) and the brokers' request_timeout_ms under it.
CLIENT_TIMEOUT_S: Final = 6.0
REQUEST_TIMEOUT_MS: Final = 4000
#: What a request may take beyond its deadline before it counts as late (scheduling on a
#: loaded 2-core machine, a 300 ms link both ways): a bound on hanging, not a speed target.
DEADLINE_SLACK_S: Final = 2.0
#: How long the family may take to converge after healing before the fault counts as failed.
CONVERGE_TIMEOUT_S: Final = 60.0
#: Start-up, and until every client is answered: generous for a machine under heavy load.
START_TIMEOUT_S: Final = 90.0
#: Every error a client may honestly report for a request (scale0.session.errors).
CLEAR_ERRORS: Final = (
    "ServiceUnavailable",
    "WorkerLost",
    "RequestTimeout",
    "ServiceNotFound",
    "BrokerRefused",
)
NETWORK: Final[dict[str, Any]] = {
    "default_heartbeat_interval_ms": 200,
    "liveness": 5,
    "request_timeout_ms": REQUEST_TIMEOUT_MS,
    "config_republish_s": 1.0,
}


@dataclass
class FaultReport:
    """What one fault did: the history of the requests sent while it lasted, and convergence."""

    fault: str
    started: float = 0.0  # wall clock: the fault begins (requests sent from here count)
    cut: float = 0.0  # when the harness began to fault the link (wall clock)
    cut_done: float = 0.0  # when the fault was in place
    healed: float = 0.0
    ended: float = 0.0  # converged (or gave up)
    sent: int = 0
    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    in_flight_at_cut: int = 0
    in_flight_answered: int = 0
    duplicates: int = 0
    max_latency_s: float = 0.0
    peers_lost: int = 0  # peer_lost lines in every broker's log while the fault's window lasted
    converge_s: float | None = None
    versions: dict[str, int] = field(default_factory=dict)
    target_version: int = 0
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "started": self.started,
            "cut": self.cut,
            "cut_done": self.cut_done,
            "healed": self.healed,
            "ended": self.ended,
            "sent": self.sent,
            "answered": self.answered,
            "errors": dict(self.errors),
            "in_flight_at_cut": self.in_flight_at_cut,
            "in_flight_answered": self.in_flight_answered,
            "duplicates": self.duplicates,
            "max_latency_s": round(self.max_latency_s, 3),
            "peers_lost": self.peers_lost,
            "converge_s": None if self.converge_s is None else round(self.converge_s, 3),
            "target_version": self.target_version,
            "versions": self.versions,
            "violations": self.violations,
        }


def summary_table(reports: Sequence[FaultReport]) -> str:
    """The per-fault history summary, one line per fault (what the test and the tool print)."""
    lines = [
        f"{'fault':<14}{'sent':>6}{'answered':>9}{'errors':>7}{'dup':>5}{'at cut':>7}"
        f"{'max s':>7}{'lost':>5}{'converge s':>11}  errors by kind / violations"
    ]
    for r in reports:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "-"
        converge = "never" if r.converge_s is None else f"{r.converge_s:.2f}"
        lines.append(
            f"{r.fault:<14}{r.sent:>6}{r.answered:>9}{sum(r.errors.values()):>7}"
            f"{r.duplicates:>5}{r.in_flight_at_cut:>7}{r.max_latency_s:>7.2f}{r.peers_lost:>5}"
            f"{converge:>11}"
            f"  {kinds}"
        )
        lines.extend(f"{'':<14}VIOLATION: {v}" for v in r.violations)
    return "\n".join(lines)


# ---- the processes ----


class Probe:
    """A management probe in one host's namespace (scale0.chaos.agent probe)."""

    def __init__(self, spawned: Spawned) -> None:
        self.spawned = spawned
        process = spawned.process
        assert process.stdin is not None and process.stdout is not None
        self._in: IO[bytes] = process.stdin
        self._out: IO[bytes] = process.stdout

    def ask(self, commands: Sequence[str]) -> dict[str, Any]:
        self._in.write(json.dumps(list(commands)).encode() + b"\n")
        self._in.flush()
        line = self._out.readline()
        if not line:
            raise LabError(f"probe {self.spawned.name} exited: {self.spawned.log_path}")
        answer = json.loads(line)
        assert isinstance(answer, dict)
        return answer


def _logs(path: Path) -> list[dict[str, Any]]:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    return lines


def _wait_endpoints(spawned: Spawned, path: Path, timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return dict(json.loads(path.read_text()))
        if spawned.process.poll() is not None:
            raise LabError(
                f"{spawned.name} exited with {spawned.process.returncode}:\n"
                + spawned.log_path.read_text(errors="replace")[-3000:]
            )
        time.sleep(0.05)
    raise LabError(f"{spawned.name} did not bind within {timeout_s} s")


@dataclass
class FamilyInLab:
    """The family, its clients, workers, probes and files, inside one lab."""

    lab: Lab
    directory: Path
    brokers: dict[str, Spawned]
    frontends: dict[str, str]
    probes: dict[str, Probe]
    clients: list[Spawned]
    workers: list[Spawned]
    version: int = 1
    signed: dict[int, str] = field(default_factory=dict)  # version -> the sha256 we signed

    def client_files(self) -> list[Path]:
        return sorted(self.directory.glob("client-*.jsonl"))

    def record_files(self) -> list[Path]:
        return sorted(self.directory.glob("worker-*.record"))

    def broker_log(self, host: str) -> Path:
        return self.brokers[host].log_path

    # ---- config ----

    def publish(self, host: str, version: int) -> None:
        """Write ``version`` into ``host``'s own network file and SIGHUP it (it signs it)."""
        path = self.directory / host / "network.yaml"
        tree = yaml.safe_load(path.read_text())
        tree["config_version"] = version
        path.write_text(yaml.safe_dump(tree))
        self.signed[version] = config_sha256(load(path, kind="network"))
        os.kill(self.brokers[host].pid, signal.SIGHUP)

    # ---- what the family says of itself ----

    def views(self) -> dict[str, dict[str, Any]]:
        return {
            host: probe.ask(["status", "list_peers", "list_services"])
            for host, probe in self.probes.items()
        }

    def converged(self, version: int) -> tuple[bool, str]:
        """Every broker runs ``version`` and every heartbeat table agrees; else what differs."""
        views = self.views()
        for host, view in views.items():
            if "error" in view:
                return False, f"{host}: {view['error']}"
        own: dict[str, dict[str, int]] = {}
        versions: dict[str, int] = {}
        for host, view in views.items():
            status = view["status"]
            versions[host] = status["config_version"]
            if status["state"] != "active":
                return False, f"{host} is {status['state']}"
            own[host] = {
                row["service"]: row["workers"]
                for row in view["list_services"]["services"]
                if row["workers"]
            }
        if any(v != version for v in versions.values()):
            return False, f"config versions {versions}, want {version}"
        for host, view in views.items():
            peers = {p["broker_id"]: p for p in view["list_peers"]["peers"]}
            for other in views:
                if other == host:
                    continue
                peer = peers.get(other)
                if peer is None or peer["status"] != "up" or not peer["linked"]:
                    return False, f"{host} sees {other} as {peer and peer['status']}"
                if peer["config_version"] != versions[other]:
                    return False, f"{host} thinks {other} runs v{peer['config_version']}"
                seen = {s: n for s, n in peer["services"].items() if n}
                if seen != own[other]:
                    return False, f"{host} holds {other}'s table {seen}, {other} says {own[other]}"
        return True, "converged"


def _start(lab: Lab, directory: Path) -> FamilyInLab:
    hosts = list(HOSTS)
    rogue_port = pick_free_ports(1)[0]
    rogue = f"tcp://{lab.address('b3')}:{rogue_port}"
    broker_files, network_file, _network = write_family_configs(
        directory,
        len(hosts),
        sources=(0, 1),
        hosts=[lab.address(h) for h in hosts],
        extra_config_subs=(rogue,),
        broker_overrides=[
            {"network_config": "network.yaml"},
            {"network_config": "network.yaml"},
            {},
        ],
        management=False,
        **NETWORK,
    )
    for host in ("b1", "b2"):  # each source has a file of its own, so each side can publish
        shutil.copy(network_file, directory / host / "network.yaml")
    python = sys.executable
    agent = [python, "-m", "scale0.chaos.agent"]
    lab.spawn(
        "rogue",
        lab.namespace("b3"),
        [
            *agent,
            "rogue",
            "--bind",
            rogue,
            "--network",
            str(network_file),
            "--key",
            str(directory / "keys/signing.key"),
        ],
    )
    brokers: dict[str, Spawned] = {}
    for host, broker_file in zip(hosts, broker_files, strict=True):
        endpoints = broker_file.parent / "endpoints.json"
        endpoints.unlink(missing_ok=True)
        brokers[host] = lab.spawn(
            f"broker-{host}",
            lab.namespace(host),
            [broker_command(), "--config", str(broker_file), "--endpoints-file", str(endpoints)],
        )
    bound = {
        host: _wait_endpoints(brokers[host], path.parent / "endpoints.json", START_TIMEOUT_S)
        for host, path in zip(hosts, broker_files, strict=True)
    }
    frontends = {host: bound[host]["frontend"] for host in hosts}
    probes = {
        host: Probe(
            lab.spawn(
                f"probe-{host}",
                lab.namespace(host),
                [
                    *agent,
                    "probe",
                    "--endpoint",
                    frontends[host],
                    "--auth-id",
                    "viewer",
                    "--password",
                    FAMILY_ADMINS["viewer"][0],
                ],
                pipes=True,
            )
        )
        for host in hosts
    }
    workers = [
        lab.spawn(
            f"worker-{host}",
            lab.namespace(host),
            [
                *agent,
                "worker",
                "--endpoint",
                bound[host]["backend"],
                "--record",
                str(directory / f"worker-{host}.record"),
            ],
        )
        for host in hosts
        if host != "b1"
    ]
    family = FamilyInLab(lab, directory, brokers, frontends, probes, [], workers)
    family.signed[1] = config_sha256(load(network_file, kind="network"))
    return family


def _start_clients(family: FamilyInLab, threads: int) -> None:
    agent = [sys.executable, "-m", "scale0.chaos.agent"]
    for host in HOSTS:
        family.clients.append(
            family.lab.spawn(
                f"client-{host}",
                family.lab.namespace(host),
                [
                    *agent,
                    "client",
                    "--endpoint",
                    family.frontends[host],
                    "--out",
                    str(family.directory / f"client-{host}.jsonl"),
                    "--name",
                    host,
                    "--threads",
                    str(threads),
                    "--timeout",
                    str(CLIENT_TIMEOUT_S),
                ],
            )
        )


def _load() -> str:
    """The machine's load, for failures that a starved machine explains (peers silent for
    seconds because their brokers did not run)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} on {os.cpu_count()} CPUs"


def _wait_clients(family: FamilyInLab, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until every client has answers (a loaded machine takes seconds to start Python)."""
    paths = [family.directory / f"client-{host}.jsonl" for host in HOSTS]
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if all(p.exists() and p.read_text().count('"ok"') >= 10 for p in paths):
            return
        time.sleep(0.2)
    raise LabError(
        f"the clients were not answered within {timeout_s} s ({_load()}): see {family.directory}"
    )


# ---- the faults ----


def _apply(lab: Lab, fault: str, fault_s: float, during: Callable[[], None]) -> tuple[float, float]:
    """Hold ``fault`` on b1's link for ``fault_s``, calling ``during`` a third of the way in;
    heal everything; return when the fault began to be applied and when it was in place."""
    cut = time.time()
    if fault == "partition":
        lab.cut("b1")
    elif fault == "one_way_loss":
        lab.loss("b1", to_host=1.0)
    elif fault == "delay":
        for host in HOSTS:
            lab.delay(host, from_host_ms=300)
    elif fault == "flapping":
        lab.cut("b1")  # down first: the loop below brings it up and down every second
    else:
        raise ValueError(f"unknown fault {fault!r}; faults: {', '.join(FAULTS)}")
    cut_done = time.time()
    began = time.monotonic()
    published = False
    down = fault == "flapping"
    while (elapsed := time.monotonic() - began) < fault_s:
        if fault == "flapping":
            want_down = int(elapsed) % 2 == 0
            if want_down != down:
                (lab.cut if want_down else lab.heal)("b1")
                down = want_down
        if not published and elapsed >= fault_s / 3:
            during()
            published = True
        time.sleep(0.05)
    if not published:
        during()
    lab.clear()
    return cut, cut_done


def _history(family: FamilyInLab) -> tuple[list[dict[str, Any]], Counter[str], list[str]]:
    """Every client record, the executions per body, and the records' own violations."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in family.client_files():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                problems.append(f"{path.name}: a torn line {line[:80]!r}")
    executions: Counter[str] = Counter()
    for path in family.record_files():
        executions.update(path.read_text().split())
    # Bodies are NAME-THREAD-N, N from 1 without gaps: a gap is a request with no outcome.
    seen: dict[tuple[str, str], list[int]] = {}
    for record in records:
        name, thread, number = record["body"].rsplit("-", 2)
        seen.setdefault((name, thread), []).append(int(number))
    for (name, thread), numbers in seen.items():
        numbers.sort()
        if numbers != list(range(1, len(numbers) + 1)):
            missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))[:10]
            problems.append(f"client {name} thread {thread}: requests {missing} have no outcome")
        dupes = [n for n, c in Counter(numbers).items() if c > 1]
        if dupes:
            problems.append(f"client {name} thread {thread}: requests {dupes[:10]} ended twice")
    return records, executions, problems


def _judge(report: FaultReport, records: list[dict[str, Any]], executions: Counter[str]) -> None:
    mine = [r for r in records if report.started <= r["sent"] < report.ended]
    report.sent = len(mine)
    for record in mine:
        outcome: str = record["outcome"]
        latency = record["done"] - record["sent"]
        report.max_latency_s = max(report.max_latency_s, latency)
        at_cut = record["sent"] <= max(report.cut, report.cut_done) and record["done"] >= report.cut
        report.in_flight_at_cut += at_cut
        if outcome == "ok":
            report.answered += 1
            report.in_flight_answered += at_cut
            if executions[record["body"]] == 0:
                report.violations.append(f"{record['body']} answered but never run by a worker")
        else:
            kind = outcome.split(":", 1)[0]
            report.errors[kind] += 1
            if kind not in CLEAR_ERRORS:
                report.violations.append(f"{record['body']}: {outcome}")
        if latency > CLIENT_TIMEOUT_S + DEADLINE_SLACK_S:
            report.violations.append(
                f"{record['body']} took {latency:.2f} s, deadline {CLIENT_TIMEOUT_S} s ({outcome})"
            )
        if executions[record["body"]] > 1:
            report.duplicates += 1


def _config_history(family: FamilyInLab) -> list[str]:
    """From every broker's log: applied versions only rise, and each is one we signed."""
    problems = []
    for host in HOSTS:
        running = 0
        for line in _logs(family.broker_log(host)):
            if line.get("event") != "config_applied":
                continue
            version, sha = line.get("version"), line.get("sha256")
            if not isinstance(version, int) or version <= running:
                problems.append(f"{host} applied v{version} while running v{running}")
            if not isinstance(version, int) or family.signed.get(version) != sha:
                problems.append(f"{host} applied v{version} ({sha}), not a config we signed")
            running = version if isinstance(version, int) else running
    return problems


def run(
    directory: Path,
    faults: Sequence[str] = FAULTS,
    *,
    fault_s: float = 8.0,
    settle_s: float = 2.0,
    client_threads: int = 2,
    out: Callable[[str], None] = print,
) -> list[FaultReport]:
    """Build the lab, start the family, apply each fault in turn; the reports, however it ends
    (every namespace and process is gone when this returns or raises)."""
    for fault in faults:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; faults: {', '.join(FAULTS)}")
    directory.mkdir(parents=True, exist_ok=True)
    reports: list[FaultReport] = []
    with Lab(HOSTS, directory / "lab") as lab:
        out(f"lab {lab.token}: hosts {', '.join(f'{h}={lab.address(h)}' for h in HOSTS)}")
        family = _start(lab, directory)
        ok, why = False, ""
        began = time.monotonic()
        while time.monotonic() - began < START_TIMEOUT_S and not ok:
            ok, why = family.converged(1)
            time.sleep(0.2)
        if not ok:
            raise LabError(f"the family did not come together: {why} ({_load()})")
        ready = time.time()
        _start_clients(family, client_threads)
        _wait_clients(family)
        for fault in faults:
            report = FaultReport(fault, started=time.time())
            low, high = family.version + 1, family.version + 2
            report.target_version = high

            def publish(low: int = low, high: int = high) -> None:
                family.publish("b1", low)
                time.sleep(0.3)
                family.publish("b2", high)

            time.sleep(settle_s)  # the fault's history starts with traffic before the cut
            out(f"{fault}: b1's link faulted for {fault_s:g} s; v{low} at b1, v{high} at b2")
            report.cut, report.cut_done = _apply(lab, fault, fault_s, publish)
            report.healed = time.time()
            healed = time.monotonic()
            why = ""
            while time.monotonic() - healed < CONVERGE_TIMEOUT_S:
                ok, why = family.converged(high)
                if ok:
                    report.converge_s = time.monotonic() - healed
                    break
                time.sleep(0.1)
            else:
                report.violations.append(
                    f"not converged {CONVERGE_TIMEOUT_S} s after heal: {why} ({_load()})"
                )
            report.versions = {
                h: v["status"]["config_version"] for h, v in family.views().items() if "status" in v
            }
            family.version = high
            time.sleep(settle_s)
            report.ended = time.time()
            reports.append(report)
            out(f"{fault}: healed, converged in {report.converge_s}")
        for client in family.clients:
            client.stop(CLIENT_TIMEOUT_S + 5)
        records, executions, problems = _history(family)
        for report in reports:
            _judge(report, records, executions)
        config_problems = _config_history(family)
        losses = [
            float(line["ts"])
            for host in HOSTS
            for line in _logs(family.broker_log(host))
            if line.get("event") == "peer_lost" and isinstance(line.get("ts"), int | float)
        ]
        for report in reports:
            report.peers_lost = sum(report.started <= ts < report.ended for ts in losses)
        if reports:
            quiet = sum(ready <= ts < reports[0].started for ts in losses)
            out(f"before any fault: {quiet} peer_lost lines (more than 0: a starved machine)")
        if reports:
            reports[-1].violations.extend(problems + config_problems)
        for host, spawned in family.brokers.items():
            if spawned.process.poll() is not None:
                reports[-1].violations.append(
                    f"broker {host} exited with {spawned.process.returncode}"
                )
    out(summary_table(reports))
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/partitions",
        description="Faults on real links between a 3-broker family in network namespaces.",
    )
    parser.add_argument("--fault", action="append", choices=FAULTS, help="default: every fault")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each fault lasts")
    parser.add_argument("--threads", type=int, default=2, help="request threads per client")
    parser.add_argument("--dir", type=Path, default=None, help="keep files here (default: tmp)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON too")
    args = parser.parse_args(argv)
    # SIGTERM (timeout, a CI runner) unwinds like Ctrl-C, so the Lab deletes its namespaces:
    # without this a terminated run left its four namespaces behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="scale0-partitions-") as tmp:
        directory = args.dir or Path(tmp)
        try:
            reports = run(
                directory,
                args.fault or FAULTS,
                fault_s=args.seconds,
                client_threads=args.threads,
            )
        except LabError as exc:
            print(f"partitions: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    return 1 if any(r.violations for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
