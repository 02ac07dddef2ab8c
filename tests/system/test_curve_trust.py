"""A client or worker that checks the config's signature itself, on real processes (§2.5, S1-S4).

The family serves CURVE (``running_brokers(..., curve=True)``); the client and the
``scale0-worker`` process are given the seed's endpoint and CURVE key, and the family's signing
public key (``keys/signing.pub``, the file the brokers list in ``trusted_keys``). A rogue seed
is a broker process of another family: its own signing key, its own CURVE key (which the
client was given, so CURVE itself lets it in). Waits are bounded.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from scale0.crypto.keys import generate_keypair, key_id, load_public_key
from scale0.net.client import Client, UntrustedConfig
from scale0.session.errors import Scale0Error
from scale0.testing import BrokerProcess, curve_options, curve_worker_args, running_brokers

pytestmark = pytest.mark.system

WAIT_S = 20.0
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}


def wait_until(condition: Callable[[], bool], timeout: float = WAIT_S, what: str = "") -> None:
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def answers(client: Client, body: bytes) -> bool:
    try:
        return client.request("echo", body, timeout=2.0) == [body]
    except Scale0Error:
        return False


def worker_process(broker: BrokerProcess, trusted: Path, stderr: Path) -> subprocess.Popen[bytes]:
    executable = shutil.which("scale0-worker")
    assert executable is not None
    with stderr.open("wb") as sink:
        return subprocess.Popen(
            [
                executable,
                broker.endpoints["backend"],
                "scale0.net.worker:echo_handler",
                "--service",
                "echo",
                "--heartbeat-interval",
                "0.2",
                "--log-level",
                "info",
                *curve_worker_args(broker),
                "--trusted-key",
                str(trusted),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(WAIT_S)


def test_a_client_and_a_worker_with_the_trusted_key_work_across_the_family(
    tmp_path: Path,
) -> None:
    trusted = tmp_path / "keys" / "signing.pub"
    with running_brokers(tmp_path, 2, curve=True, **FAST) as (b1, b2):
        worker = worker_process(b2, trusted, tmp_path / "worker.err")
        try:
            with Client(
                b1.endpoints["frontend"],
                timeout=10.0,
                heartbeat_interval=0.2,
                trusted_key=trusted,
                **curve_options(b1),
            ) as client:
                config = client.connect(timeout=WAIT_S)
                # The whole signed config was verified: b2's endpoint and CURVE key come from it.
                entries = {entry["identity"]: entry for entry in config.document["brokers"]}
                assert entries["b2"]["curve_public_key"] == curve_options(b2)["server_key"]
                assert "admins" not in config.document
                assert b2.endpoints["frontend"] in client.brokers
                wait_until(lambda: answers(client, b"forwarded"), what="echo through b1 to b2")
                # b1 goes: the client moves to b2 with the key the verified config gave it.
                assert b1.stop() == 0
                wait_until(lambda: answers(client, b"moved"), what="echo at b2 after b1 stopped")
                assert client.endpoint == b2.endpoints["frontend"]
                assert client.failovers >= 1
        finally:
            stop(worker)
        logged = (tmp_path / "worker.err").read_text()
        assert "untrusted config" not in logged


def test_a_rogue_seed_with_another_signing_key_is_refused_with_a_clear_error(
    tmp_path: Path,
) -> None:
    genuine = tmp_path / "family" / "keys"
    genuine.mkdir(parents=True)
    generate_keypair(genuine)  # the family the client trusts; none of its brokers is reached
    trusted = genuine / "signing.pub"
    with running_brokers(tmp_path / "rogue", 1, curve=True, **FAST) as (rogue,):
        worker = worker_process(rogue, trusted, tmp_path / "worker.err")
        try:
            with Client(
                rogue.endpoints["frontend"],
                timeout=3.0,
                heartbeat_interval=0.2,
                trusted_key=trusted,
                **curve_options(rogue),
            ) as client:
                with pytest.raises(UntrustedConfig) as caught:
                    client.connect(timeout=3.0)
                message = str(caught.value)
                assert "no trusted key verifies the signature" in message
                assert key_id(load_public_key(trusted)) in message
                assert rogue.endpoints["frontend"] in message
                with pytest.raises(UntrustedConfig, match="no trusted key verifies"):
                    client.request("echo", b"x", timeout=3.0)
                assert client.brokers == [rogue.endpoints["frontend"]]  # nothing learned
                assert client.config is None
            # The worker refused it too, said why, and never registered there.
            wait_until(
                lambda: "untrusted config" in (tmp_path / "worker.err").read_text(),
                what="the worker logs the untrusted config",
            )
            assert not [e for e in rogue.logs() if e.get("event") == "worker_ready"]
        finally:
            stop(worker)
        assert "no trusted key verifies" in (tmp_path / "worker.err").read_text()


@contextmanager
def tampering_proxy(broker: BrokerProcess, rogue_frontend: str) -> Iterator[tuple[str, str]]:
    """A CURVE server in front of ``broker``'s frontend that forwards everything but rewrites
    each CONFIG: every other broker's frontend becomes ``rogue_frontend`` and the ``sha256``
    option is made the new document's, the signature kept. Yields (endpoint, its CURVE key)."""
    public, secret = zmq.curve_keypair()
    context = zmq.Context()
    front = context.socket(zmq.ROUTER)
    front.curve_server = True
    front.curve_secretkey = secret
    front.linger = 0
    port = front.bind_to_random_port("tcp://127.0.0.1")
    back = context.socket(zmq.DEALER)
    back.curve_serverkey = curve_options(broker)["server_key"].encode()
    back.curve_publickey = public
    back.curve_secretkey = secret
    back.linger = 0
    back.connect(broker.endpoints["frontend"])
    stop = threading.Event()
    seen: list[int] = []

    def tamper(frames: list[bytes]) -> list[bytes]:
        if len(frames) != 5 or frames[2] != b"CONFIG":
            return frames
        tree = json.loads(frames[4])
        for entry in tree.get("brokers", [])[1:]:
            entry["frontend"] = rogue_frontend
        document = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
        options = json.loads(frames[3])
        options["sha256"] = hashlib.sha256(document).hexdigest()
        seen.append(options["config_version"])
        return [*frames[:3], json.dumps(options).encode(), document]

    def run() -> None:
        client: bytes | None = None
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        while not stop.is_set():
            for sock, _ in poller.poll(50):
                frames = sock.recv_multipart()
                if sock is front:
                    client = frames[0]
                    back.send_multipart(frames[1:])
                elif client is not None:
                    front.send_multipart([client, *tamper(frames)])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}", public.decode()
    finally:
        stop.set()
        thread.join(WAIT_S)
        front.close()
        back.close()
        context.term()
    assert seen, "the proxy never saw a CONFIG"


def test_a_proxy_that_tampers_with_the_config_is_refused(tmp_path: Path) -> None:
    trusted = tmp_path / "keys" / "signing.pub"
    with (
        running_brokers(tmp_path, 2, curve=True, **FAST) as (b1, _b2),
        tampering_proxy(b1, "tcp://127.0.0.1:1") as (endpoint, proxy_key),
    ):
        options = dict(curve_options(b1), server_key=proxy_key)
        # A client that trusts its seed takes the rogue endpoint (what the check is for)...
        with Client(endpoint, timeout=3.0, heartbeat_interval=0.2, **options) as trusting:
            trusting.connect(timeout=WAIT_S)
            assert "tcp://127.0.0.1:1" in trusting.brokers
        # ...a client that checks the signature refuses the config and learns nothing from it.
        with Client(
            endpoint, timeout=3.0, heartbeat_interval=0.2, trusted_key=trusted, **options
        ) as checking:
            with pytest.raises(UntrustedConfig, match="no trusted key verifies the signature"):
                checking.connect(timeout=3.0)
            assert checking.brokers == [endpoint]


def test_a_seed_that_sends_no_signature_is_refused(tmp_path: Path) -> None:
    """Without CURVE a broker sends the client view, unsigned: a client that checks refuses it."""
    with running_brokers(tmp_path, 1, **FAST) as (b1,):
        trusted = tmp_path / "keys" / "signing.pub"
        with (
            Client(b1.endpoints["frontend"], timeout=3.0, trusted_key=trusted) as client,
            pytest.raises(UntrustedConfig, match="not signed"),
        ):
            client.connect(timeout=3.0)
        # The same broker serves a client that trusts its seed as before.
        with Client(b1.endpoints["frontend"], timeout=10.0) as plain:
            assert plain.connect(timeout=WAIT_S).version == 1


def test_scale0_worker_refuses_a_trusted_key_it_cannot_read(tmp_path: Path) -> None:
    executable = shutil.which("scale0-worker")
    assert executable is not None
    missing = tmp_path / "nope.pub"
    bad = subprocess.run(
        [
            executable,
            "tcp://127.0.0.1:1",
            "scale0.net.worker:echo_handler",
            "--trusted-key",
            str(missing),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "--trusted-key" in bad.stderr and str(missing) in bad.stderr
