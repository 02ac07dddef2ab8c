"""Socket-level fuzzing of a running broker: real messages, corrupted, on every socket (#15.7).

Seeds are real messages built from :mod:`scale0.wire`'s classes (S0P client, worker and peer
commands, management requests, 7/MDP and 18/MDP, config publications); each is then corrupted
by one to three :data:`MUTATIONS` (truncated, frames dropped, swapped or duplicated, a frame
replaced by random bytes, by a huge one, by bad JSON or bad UTF-8, bits flipped, the signature or
command of another channel) and sent to the socket it belongs to: the frontend and backend
ROUTERs and the peer ROUTER from DEALERs (a fresh DEALER every few hundred messages, so a ban of
one identity does not end the run), and the config SUB side from a PUB the broker subscribes to.

After every round :func:`fuzz` checks, and records in a :class:`FuzzReport`: the broker process is
alive, an honest client is answered by an honest worker through it, its RSS stays under the bound,
and every message the broker sent back to the fuzzing sockets decodes (a broker answers garbage
with well-formed errors, never garbage). ``tools/fuzz --minutes N`` runs it long; the CI test
runs it for seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import zmq

from scale0.config.canonical import canonical_json, config_sha256
from scale0.config.model import BrokerEntry, NetworkConfig
from scale0.net.client import Client, Scale0Error
from scale0.net.worker import Worker
from scale0.testing import start_broker_process, write_family_configs
from scale0.wire import mdp
from scale0.wire.admin import ManagementRequest
from scale0.wire.client import CheckConfig, ClientRequest, Disconnect, Heartbeat
from scale0.wire.configsync import PublishedConfig
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import SIG_BROKER, SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.peer import (
    BrokerState,
    Forward,
    ForwardReply,
    Hello,
    PeerHeartbeat,
    Table,
    TableMode,
    TableReq,
    TableService,
    TableWorker,
)
from scale0.wire.registry import decode_from_broker, encode
from scale0.wire.worker import Ready, WorkerPartial, WorkerReply

__all__ = ["CHANNELS", "MUTATIONS", "FuzzReport", "fuzz", "mutate", "seeds"]

CHANNELS: Final = ("frontend", "backend", "peer", "link", "config")
#: Largest frame the fuzzer sends (bytes): above the broker's max_frame_bytes (a 400), below
#: the socket's ZMQ_MAXMSGSIZE guard, and a few beyond it (libzmq drops the connection).
MAX_FRAME_BYTES: Final = 256 * 1024
HUGE_SIZES: Final = (MAX_FRAME_BYTES + 1, 2 * MAX_FRAME_BYTES + 70_000, 3 << 20)
#: Messages sent from one DEALER identity before the fuzzer opens a new one.
PER_IDENTITY: Final = 200


def seeds(family: str = "test", peer_id: str = "fuzzer") -> dict[str, list[list[bytes]]]:
    """Valid frames per channel, from the real message classes (after the routing id).

    ``link`` is what a peer's ROUTER sends down the broker's link DEALER, as ``peer_id``.
    """
    now = time.time()
    table = TableService("echo", (TableWorker("w1", 2, now),))
    config_doc = canonical_json_doc(family)
    return {
        "frontend": [
            encode(CheckConfig(ConfigType.JSON, None, "fuzz-client", protocol=SIG_CLIENT)),
            encode(CheckConfig(ConfigType.ZFL, 1, None, protocol=SIG_CLIENT)),
            encode(ClientRequest("echo", b"rid-1", (b"body",))),
            encode(ClientRequest("mmi.service", b"rid-2", (b"echo",))),
            encode(Heartbeat(now, 1, protocol=SIG_CLIENT)),
            encode(ManagementRequest("viewer", "wrong", "status", "m1", {})),
            encode(Disconnect(protocol=SIG_CLIENT)),
            encode(mdp.MdpClientRequest("echo", (b"body",), protocol=mdp.MDPC01)),
            encode(mdp.MdpClientRequest("echo", (b"body",), protocol=mdp.MDPC02)),
        ],
        "backend": [
            encode(CheckConfig(ConfigType.JSON, None, None, protocol=SIG_WORKER)),
            encode(Ready(("echo", "fuzz"), True, 1000, now, 1, 2)),
            encode(WorkerReply(b"ticket-1", 200, (b"answer",))),
            encode(WorkerPartial(b"ticket-1", (b"part",))),
            encode(Heartbeat(now, 1, 1000, protocol=SIG_WORKER)),
            encode(Disconnect(protocol=SIG_WORKER)),
            encode(mdp.MdpWorkerReady("echo", protocol=mdp.MDPW01)),
            encode(mdp.MdpWorkerReady("echo", protocol=mdp.MDPW02)),
            encode(mdp.MdpWorkerReply(b"client", (b"answer",), protocol=mdp.MDPW02)),
        ],
        "peer": [
            encode(Hello("fuzzer", family, BrokerState.ACTIVE, 1, {}, TableMode.PUSH)),
            encode(PeerHeartbeat("fuzzer", now, BrokerState.ACTIVE, 1, 3)),
            encode(Table("fuzzer", 3, True, (table,))),
            encode(TableReq("fuzzer", 0)),
            encode(Forward(b"ticket-9", "echo", "fuzzer", (b"body",))),
            encode(Forward(b"ticket-7", "echo", "fuzzer", (b"body",), caller="0" * 40)),
            encode(ForwardReply(b"ticket-9", 200, (b"answer",))),
            encode(CheckConfig(ConfigType.JSON, 0, None, protocol=SIG_BROKER)),
        ],
        "link": [
            encode(Hello(peer_id, family, BrokerState.ACTIVE, 1, {}, TableMode.PULL)),
            encode(PeerHeartbeat(peer_id, now, BrokerState.ACTIVE, 1, 3)),
            encode(Table(peer_id, 3, True, (table,))),
            encode(TableReq(peer_id, 0)),
            encode(Forward(b"ticket-8", "echo", peer_id, (b"body",))),
            encode(ForwardReply(b"ticket-1", 200, (b"answer",))),
            encode(Disconnect(protocol=SIG_BROKER)),
        ],
        "config": [config_doc],
    }


def canonical_json_doc(family: str) -> list[bytes]:
    """A config publication that decodes (its signature is made up: the broker refuses it)."""
    entry = BrokerEntry(
        "x", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3", "tcp://127.0.0.1:4"
    )
    network = NetworkConfig(family=family, config_version=99, brokers=(entry,))
    return PublishedConfig(
        family=family,
        config_version=99,
        config_type=ConfigType.JSON,
        sha256=config_sha256(network),
        origin="fuzzer",
        signature="ab" * 64,
        document=canonical_json(network),
    ).to_frames()


BAD_JSON: Final = (
    b"{",
    b"[]",
    b"null",
    b'{"config_type": 5}',
    b'{"services": "echo", "time": "now"}',
    b'{"config_version": -1, "client_id": ""}',
    b'{"broker_id": {"x": 1}, "table_seq": 1e999}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a": NaN}',
    b'{"\xff\xfe": 1}',
)
BAD_UTF8: Final = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ech\x00o", b"\xf4\x90\x80\x80")
COMMANDS: Final = (
    b"REQUEST",
    b"READY",
    b"HELLO",
    b"TABLE",
    b"FORWARD",
    b"FORWARDAS",
    b"CONFIG",
    b"REPLY",
    b"MANAGEMENTREQ",
    b"NOPE",
    b"",
    b"\x01",
    b"\x05",
)
SIGNATURES: Final = (
    SIG_CLIENT,
    SIG_WORKER,
    SIG_BROKER,
    mdp.MDPC01,
    mdp.MDPC02,
    mdp.MDPW01,
    mdp.MDPW02,
    b"S0X9",
    b"",
)


def _truncate(r: random.Random, f: list[bytes]) -> list[bytes]:
    if r.random() < 0.5 and len(f) > 1:
        return f[: r.randrange(0, len(f))]
    i = r.randrange(len(f))
    return [*f[:i], f[i][: r.randrange(0, len(f[i]) + 1)], *f[i + 1 :]]


def _swap(r: random.Random, f: list[bytes]) -> list[bytes]:
    if len(f) < 2:
        return f
    i, j = r.sample(range(len(f)), 2)
    f = list(f)
    f[i], f[j] = f[j], f[i]
    return f


def _duplicate(r: random.Random, f: list[bytes]) -> list[bytes]:
    i = r.randrange(len(f)) if f else 0
    return [*f[: i + 1], *f[i : i + 1] * r.randint(1, 40), *f[i + 1 :]]


def _drop(r: random.Random, f: list[bytes]) -> list[bytes]:
    if not f:
        return f
    i = r.randrange(len(f))
    return f[:i] + f[i + 1 :]


def _random_frame(r: random.Random, f: list[bytes]) -> list[bytes]:
    i = r.randrange(len(f) + 1)
    return [*f[:i], r.randbytes(r.randrange(0, 64)), *f[i:]]


def _huge(r: random.Random, f: list[bytes]) -> list[bytes]:
    i = r.randrange(len(f)) if f else 0
    return [*f[:i], b"x" * r.choice(HUGE_SIZES), *f[i + 1 :]]


def _bad_json(r: random.Random, f: list[bytes]) -> list[bytes]:
    i = min(3, len(f) - 1) if f and r.random() < 0.7 else (r.randrange(len(f)) if f else 0)
    return [*f[:i], r.choice(BAD_JSON), *f[i + 1 :]]


def _bad_utf8(r: random.Random, f: list[bytes]) -> list[bytes]:
    if not f:
        return [r.choice(BAD_UTF8)]
    i = r.randrange(len(f))
    return [*f[:i], f[i][:4] + r.choice(BAD_UTF8) + f[i][4:], *f[i + 1 :]]


def _flip(r: random.Random, f: list[bytes]) -> list[bytes]:
    if not f:
        return f
    i = r.randrange(len(f))
    if not f[i]:
        return f
    data = bytearray(f[i])
    for _ in range(r.randint(1, 4)):
        data[r.randrange(len(data))] ^= 1 << r.randrange(8)
    return [*f[:i], bytes(data), *f[i + 1 :]]


def _wrong_type(r: random.Random, f: list[bytes]) -> list[bytes]:
    f = list(f) or [b""]
    if len(f) > 2 and r.random() < 0.5:
        f[2] = r.choice(COMMANDS)
    elif len(f) > 1:
        f[1] = r.choice(SIGNATURES)
    else:
        f[0] = r.choice(SIGNATURES)
    return f


MUTATIONS: Final[dict[str, Callable[[random.Random, list[bytes]], list[bytes]]]] = {
    "truncate": _truncate,
    "swap": _swap,
    "duplicate": _duplicate,
    "drop": _drop,
    "random_frame": _random_frame,
    "huge": _huge,
    "bad_json": _bad_json,
    "bad_utf8": _bad_utf8,
    "flip": _flip,
    "wrong_type": _wrong_type,
}


def mutate(r: random.Random, frames: list[bytes]) -> tuple[list[bytes], list[str]]:
    """``frames`` corrupted by one to three mutations (names returned); never empty."""
    names = [r.choice(sorted(MUTATIONS)) for _ in range(r.randint(1, 3))]
    for name in names:
        frames = MUTATIONS[name](r, frames or [b""])
    return (frames or [b""]), names


@dataclass
class FuzzReport:
    """What a fuzz run sent and what the broker did."""

    sent: Counter[str] = field(default_factory=Counter)  # per channel
    mutations: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)  # what the broker sent back, by kind
    logged: Counter[str] = field(default_factory=Counter)  # the broker's log events, by name
    honest_ok: int = 0
    rounds: int = 0
    rss_kb_start: int = 0
    rss_kb_max: int = 0
    problems: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, tree: dict[str, Any], problems: list[str]) -> FuzzReport:
        return cls(
            sent=Counter(tree["sent"]),
            mutations=Counter(tree["mutations"]),
            answers=Counter(tree["answers"]),
            logged=Counter(tree["logged"]),
            honest_ok=tree["honest_requests_answered"],
            rounds=tree["rounds"],
            rss_kb_start=tree["rss_kb_start"],
            rss_kb_max=tree["rss_kb_max"],
            problems=[*problems, *tree["problems"]],
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": dict(self.sent),
            "mutations": dict(self.mutations),
            "answers": dict(self.answers),
            "logged": dict(self.logged),
            "honest_requests_answered": self.honest_ok,
            "rounds": self.rounds,
            "rss_kb_start": self.rss_kb_start,
            "rss_kb_max": self.rss_kb_max,
            "problems": self.problems,
        }


class _Dealer:
    """A DEALER to one ROUTER channel; replaced every PER_IDENTITY messages."""

    def __init__(self, context: zmq.Context[Any], endpoint: str, signature: bytes) -> None:
        self.context, self.endpoint, self.signature = context, endpoint, signature
        self.sock: zmq.Socket[bytes] | None = None
        self.count = 0

    def socket(self) -> zmq.Socket[bytes]:
        if self.sock is None or self.count >= PER_IDENTITY:
            if self.sock is not None:
                self.sock.close(linger=0)
            self.sock = self.context.socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.setsockopt(zmq.SNDHWM, 10_000)
            self.sock.setsockopt(zmq.MAXMSGSIZE, 16 << 20)
            self.sock.connect(self.endpoint)
            self.count = 0
        self.count += 1
        return self.sock

    def drain(self, report: FuzzReport, channel: str) -> None:
        if self.sock is None:
            return
        while self.sock.poll(0, zmq.POLLIN):
            frames = self.sock.recv_multipart()
            majordomo = (mdp.MDPC01, mdp.MDPC02, mdp.MDPW01, mdp.MDPW02)
            if frames and frames[0] in majordomo:
                # A Majordomo peer that sent no empty delimiter is answered without one too
                # (scale0/wire/mdp.py): read it as the registry reads such frames.
                frames = [b"", *frames]
            if channel == "peer":
                signature = SIG_BROKER
            elif len(frames) > 1 and frames[1] in majordomo:
                signature = frames[1]
            else:
                signature = self.signature
            try:
                message = decode_from_broker(frames, signature=signature, max_frame_bytes=16 << 20)
            except ProtocolError as exc:
                report.problems.append(
                    f"{channel}: the broker sent undecodable {frames[:4]!r}: {exc}"
                )
                continue
            kind = type(message).__name__
            code = getattr(message, "code", None)
            report.answers[f"{channel} {kind}{'' if code is None else f' {code}'}"] += 1

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)


def _honest(frontend: str, report: FuzzReport, round_no: int) -> None:
    try:
        with Client(frontend, timeout=10.0) as client:
            body = b"honest-%d" % round_no
            if client.request("echo", body) == [body]:
                report.honest_ok += 1
            else:
                report.problems.append(f"round {round_no}: the honest client got a wrong answer")
    except Scale0Error as exc:
        report.problems.append(f"round {round_no}: the honest client failed: {exc}")


class _Link:
    """The fuzzer's ROUTER at the fake peer's endpoint: the broker's link DEALER connects to it.

    Everything is sent to the routing id the broker's DEALER introduced itself with (its HELLO).
    """

    def __init__(self, context: zmq.Context[Any], endpoint: str) -> None:
        self.sock: zmq.Socket[bytes] = context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 16 << 20)
        self.sock.bind(endpoint)
        self.routing_id: bytes | None = None

    def wait_hello(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.routing_id is None and time.monotonic() < deadline:
            if self.sock.poll(100, zmq.POLLIN):
                self.routing_id = self.sock.recv_multipart()[0]
        return self.routing_id is not None

    def send(self, frames: list[bytes]) -> None:
        assert self.routing_id is not None
        with contextlib.suppress(zmq.Again):
            self.sock.send_multipart([self.routing_id, *frames], zmq.NOBLOCK)

    def drain(self, report: FuzzReport) -> None:
        while self.sock.poll(0, zmq.POLLIN):
            routing_id, *frames = self.sock.recv_multipart()
            if routing_id != self.routing_id:  # the broker closed its link and opened another
                report.answers["link reconnected"] += 1
                self.routing_id = routing_id
            try:
                message = decode_from_broker(frames, signature=SIG_BROKER, max_frame_bytes=16 << 20)
            except ProtocolError as exc:
                report.problems.append(f"link: the broker sent undecodable {frames[:4]!r}: {exc}")
                continue
            code = getattr(message, "code", None)
            report.answers[
                f"link {type(message).__name__}{'' if code is None else f' {code}'}"
            ] += 1

    def close(self) -> None:
        self.sock.close(linger=0)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def attack(plan: dict[str, Any], out: Callable[[str], None] = print) -> FuzzReport:
    """The fuzzing loop against a running broker (in a process of its own: see :func:`fuzz`).

    ``plan``: the broker's ``pid`` and ``endpoints``, the fake peer's ``peer`` and
    ``config_pub`` endpoints and ``identity``, ``family``, ``seconds``, ``seed``,
    ``per_round``, ``rss_bound_kb``.
    """
    r = random.Random(plan["seed"])  # noqa: S311 - reproducible fuzzing, not secrets
    pid: int = plan["pid"]
    endpoints: dict[str, str] = plan["endpoints"]
    report = FuzzReport()
    context: zmq.Context[Any] = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(plan["config_pub"])
    link = _Link(context, plan["peer"])
    dealers = {
        "frontend": _Dealer(context, endpoints["frontend"], SIG_CLIENT),
        "backend": _Dealer(context, endpoints["backend"], SIG_WORKER),
        "peer": _Dealer(context, endpoints["peer"], SIG_BROKER),
    }
    try:
        if not link.wait_hello(15.0):
            report.problems.append("the broker never linked to the fake peer")
            return report
        handle = Worker(
            endpoints["backend"], {"echo": lambda body: body}, heartbeat_interval=0.5
        ).start_in_thread()
        try:
            if not handle.wait_registered(15.0):
                report.problems.append("the honest worker never registered")
                return report
            report.rss_kb_start = report.rss_kb_max = _rss_kb(pid)
            grammar = seeds(plan["family"], peer_id=plan["identity"])
            started = time.monotonic()
            while time.monotonic() - started < plan["seconds"]:
                report.rounds += 1
                for _ in range(plan["per_round"]):
                    channel = r.choice(CHANNELS)
                    frames, names = mutate(r, list(r.choice(grammar[channel])))
                    report.mutations.update(names)
                    report.sent[channel] += 1
                    if channel == "config":
                        pub.send_multipart(frames)
                    elif channel == "link":
                        link.send(frames)
                    else:
                        dealer = dealers[channel]
                        dealer.socket().send_multipart(frames, copy=len(frames[0]) < 4096)
                for channel, dealer in dealers.items():
                    dealer.drain(report, channel)
                link.drain(report)
                if not _alive(pid):
                    report.problems.append("the broker exited")
                    return report
                _honest(endpoints["frontend"], report, report.rounds)
                rss = _rss_kb(pid)
                report.rss_kb_max = max(report.rss_kb_max, rss)
                if rss > plan["rss_bound_kb"]:
                    report.problems.append(f"RSS {rss} kB over the bound {plan['rss_bound_kb']} kB")
                    return report
                if report.problems:
                    return report
        finally:
            handle.stop(10.0)
    finally:
        for dealer in dealers.values():
            dealer.close()
        link.close()
        pub.close(linger=0)
        context.term()
    return report


def fuzz(
    directory: Path,
    *,
    seconds: float,
    seed: int | None = None,
    per_round: int = 400,
    rss_bound_kb: int = 150_000,
    out: Callable[[str], None] = print,
) -> FuzzReport:
    """Run one broker in ``directory`` and fuzz every socket for about ``seconds``.

    The broker's network config names a second broker, ``b2``, that never starts: the fuzzer
    binds a ROUTER at b2's peer endpoint (the broker's link DEALER connects to it: channel
    ``link``) and a PUB at b2's config_pub (which the broker's config SUB subscribes to).
    The fuzzing sockets live in a child process (:func:`attack`): should libzmq abort in it,
    this process still stops the broker (by PID) and reports how the child died.
    """
    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 32)
    out(f"fuzz: seed {seed} (pass --seed {seed} to repeat the run)")
    broker_files, network_file, network = write_family_configs(
        directory,
        2,
        sources=(0, 1),
        management=False,
        max_frame_bytes=MAX_FRAME_BYTES,
        error_threshold=50,
        error_ban_s=1.0,
        # Fake workers hold requests they never answer: a drain of the default 10 s would race
        # the stop's own 10 s before SIGKILL, and broker_stopped would go unwritten.
        broker_overrides=({"shutdown_grace_ms": 2000}, {"shutdown_grace_ms": 2000}),
    )
    fake = network.brokers[1]
    report = FuzzReport()
    broker = start_broker_process(broker_files[0], network_file, network)
    try:
        plan = {
            "pid": broker.pid,
            "endpoints": broker.endpoints,
            "peer": fake.peer,
            "config_pub": fake.config_pub,
            "identity": fake.identity,
            "family": network.family,
            "seconds": seconds,
            "seed": seed,
            "per_round": per_round,
            "rss_bound_kb": rss_bound_kb,
        }
        plan_file, report_file = directory / "fuzz-plan.json", directory / "fuzz-report.json"
        plan_file.write_text(json.dumps(plan))
        with (directory / "fuzzer.stderr").open("wb") as stderr:
            child = subprocess.Popen(  # noqa: S603 - this module, fixed arguments
                [
                    sys.executable,
                    "-m",
                    "scale0.chaos.fuzz",
                    "--attack",
                    str(plan_file),
                    "--report",
                    str(report_file),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            code = child.wait(seconds + 120)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
            report.problems.append(f"the fuzzer hung past {seconds + 120:g} s")
        if report_file.exists():
            report = FuzzReport.from_dict(json.loads(report_file.read_text()), report.problems)
        if code != 0:
            tail = (directory / "fuzzer.stderr").read_text(errors="replace")[-2000:]
            report.problems.append(f"the fuzzer process died ({code}), not the broker: {tail}")
        if broker.process.poll() is not None:
            report.problems.append(
                f"the broker exited with {broker.process.returncode}:\n" + broker.stderr()[-3000:]
            )
    finally:
        broker.stop()
        report.logged.update(str(line.get("event")) for line in broker.logs())
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/fuzz",
        description="Corrupted real messages against every socket of a running broker.",
    )
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rss-bound-mb", type=int, default=150)
    parser.add_argument("--attack", type=Path, help=argparse.SUPPRESS)  # the child (fuzz())
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attack is not None:
        child = attack(json.loads(args.attack.read_text()))
        tmp_report = args.report.with_suffix(".tmp")
        tmp_report.write_text(json.dumps(child.as_dict()))
        tmp_report.replace(args.report)
        return 0
    with tempfile.TemporaryDirectory(prefix="scale0-fuzz-") as tmp:
        report = fuzz(
            Path(tmp),
            seconds=args.minutes * 60,
            seed=args.seed,
            rss_bound_kb=args.rss_bound_mb * 1000,
        )
    print(json.dumps(report.as_dict(), indent=2))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
