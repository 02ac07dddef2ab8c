"""The processes the partition harness runs inside a host's namespace: client, worker, probe, rogue.

``python -m scale0.chaos.agent client --endpoint E --out F --name c1``: threads that each send
one request at a time (body ``c1-T-N``, unique) and append one JSON line per request to F:
``{"body", "sent", "done", "outcome"}`` (wall-clock seconds; outcome ``ok``, or the error's
class and message). A reply whose body differs from the request's is recorded as ``mixed``.

``... worker --endpoint E --record F``: serves ``echo``, appending every body it runs to F
(one ``write`` with O_APPEND per execution, so duplicates are counted exactly).

``... probe --endpoint E``: reads one JSON list of management commands per stdin line and
answers one JSON object per line: ``{command: result, ...}`` or ``{"error": ...}``.

``... rogue --bind E --network F --key K``: publishes, every half second, configs every broker
must refuse: unsigned (a signature of zeros), signed by an unknown key, and an older version.

Each stops cleanly on SIGTERM (a client finishes the request it is waiting for, bounded by its
timeout) so the harness can read complete files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from scale0.config.canonical import canonical_json, config_sha256
from scale0.config.loader import load
from scale0.crypto.keys import load_private_key, sign_config
from scale0.net.admin import NoAnswer, Refused, call
from scale0.net.client import Client, Scale0Error
from scale0.net.worker import Worker
from scale0.wire.configsync import PublishedConfig
from scale0.wire.frames import ConfigType

__all__ = ["main"]


def _stop_event() -> threading.Event:
    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return stop


def _append(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def run_client(args: argparse.Namespace) -> int:

    stop = _stop_event()
    out = Path(args.out)

    def loop(index: int) -> None:
        count = 0
        with Client(args.endpoint, timeout=args.timeout, heartbeat_interval=0.5) as client:
            while not stop.is_set():
                count += 1
                body = f"{args.name}-{index}-{count}".encode()
                sent = time.time()
                try:
                    reply = client.request("echo", body)
                    outcome = "ok" if reply == [body] else f"mixed: {reply[:2]!r}"
                except Scale0Error as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                except Exception as exc:  # anything else is a finding, recorded as such
                    outcome = f"unexpected {type(exc).__name__}: {exc}"
                record = {
                    "body": body.decode(),
                    "sent": sent,
                    "done": time.time(),
                    "outcome": outcome,
                    "broker": client.endpoint,
                }
                _append(out, json.dumps(record).encode() + b"\n")
                stop.wait(args.pause)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


def run_worker(args: argparse.Namespace) -> int:

    stop = _stop_event()
    record = Path(args.record)

    def echo(body: list[bytes]) -> bytes:
        _append(record, body[0] + b"\n")
        if args.work > 0:
            time.sleep(args.work)
        return body[0]

    worker = Worker(args.endpoint, {"echo": echo}, heartbeat_interval=0.5, capacity=args.capacity)
    handle = worker.start_in_thread()
    stop.wait()
    handle.stop(10.0)
    return 0


def run_probe(args: argparse.Namespace) -> int:

    context: zmq.Context[Any] = zmq.Context()
    try:
        for line in sys.stdin:
            answer: dict[str, Any] = {}
            try:
                commands = json.loads(line)
                for command in commands:
                    reply = call(
                        args.endpoint,
                        args.auth_id,
                        args.password,
                        command,
                        timeout_s=args.timeout,
                        context=context,
                    )
                    if reply.code != 200:
                        raise RuntimeError(f"{command}: {reply.code} {reply.message}")
                    answer[command] = reply.result
            except (NoAnswer, Refused, RuntimeError, ValueError) as exc:
                answer = {"error": str(exc)}
            print(json.dumps(answer), flush=True)
    finally:
        context.destroy(linger=0)
    return 0


def run_rogue(args: argparse.Namespace) -> int:

    stop = _stop_event()
    network = load(Path(args.network), kind="network")
    key = load_private_key(Path(args.key))
    stranger = Ed25519PrivateKey.generate()

    def publication(version: int, signer: Ed25519PrivateKey | None) -> list[bytes]:
        config = dataclasses.replace(network, config_version=version)
        sha = config_sha256(config)
        signature = (
            "0" * 128 if signer is None else sign_config(signer, config.family, version, sha)
        )
        return PublishedConfig(
            family=config.family,
            config_version=version,
            config_type=ConfigType.JSON,
            sha256=sha,
            origin="rogue",
            signature=signature,
            document=canonical_json(config),
        ).to_frames()

    bad = [
        publication(1_000_000, None),  # unsigned: a signature of nothing
        publication(1_000_001, stranger),  # signed, by a key no broker trusts
        publication(1, key),  # properly signed, but older than anything running
    ]
    context: zmq.Context[Any] = zmq.Context()
    pub = context.socket(zmq.PUB)
    try:
        pub.bind(args.bind)
        while not stop.wait(0.5):
            for frames in bad:
                pub.send_multipart(frames)
    finally:
        pub.close(linger=0)
        context.term()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scale0.chaos.agent")
    sub = parser.add_subparsers(dest="role", required=True)
    client = sub.add_parser("client")
    client.add_argument("--endpoint", required=True)
    client.add_argument("--out", required=True)
    client.add_argument("--name", required=True)
    client.add_argument("--threads", type=int, default=2)
    client.add_argument("--timeout", type=float, default=5.0)
    client.add_argument("--pause", type=float, default=0.02)
    worker = sub.add_parser("worker")
    worker.add_argument("--endpoint", required=True)
    worker.add_argument("--record", required=True)
    worker.add_argument("--capacity", type=int, default=2)
    worker.add_argument("--work", type=float, default=0.01, help="seconds each request takes")
    probe = sub.add_parser("probe")
    probe.add_argument("--endpoint", required=True)
    probe.add_argument("--auth-id", default="viewer")
    probe.add_argument("--password", default="viewer-secret")
    probe.add_argument("--timeout", type=float, default=5.0)
    rogue = sub.add_parser("rogue")
    rogue.add_argument("--bind", required=True)
    rogue.add_argument("--network", required=True)
    rogue.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    runner = {"client": run_client, "worker": run_worker, "probe": run_probe, "rogue": run_rogue}
    return runner[args.role](args)


if __name__ == "__main__":
    raise SystemExit(main())
