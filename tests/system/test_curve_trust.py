"""A client or worker that checks the config's signature itself, on real processes (§2.5, S1-S4).

The family serves CURVE (``running_brokers(..., curve=True)``) unless a test says otherwise;
the client and the ``scale0-worker`` process are given the seed's endpoint and CURVE key, and
the family's signing public key (``keys/signing.pub``, the file the brokers list in
``trusted_keys``). What they verify is the client view, signed by the config source with that
key (``view_signature``, §6.2): they are never sent the whole config, whose admins' scrypt
hashes are for brokers only. A rogue seed is a broker process of another family: its own
signing key, its own CURVE key (which the client was given, so CURVE itself lets it in). A
proxy between client and broker records every byte the client is sent, or rewrites or
replays CONFIGs. Waits are bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from scale0.config.loader import load
from scale0.crypto.keys import generate_keypair, key_id, load_public_key
from scale0.net.client import Client, UntrustedConfig
from scale0.session.errors import Scale0Error
from scale0.testing import (
    FAMILY_ADMINS,
    BrokerProcess,
    curve_options,
    curve_worker_args,
    running_brokers,
    wait_until,
)

pytestmark = pytest.mark.system

WAIT_S = 20.0
FAST: dict[str, Any] = {"default_heartbeat_interval_ms": 200, "liveness": 5}


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
                # The signed view was verified: b2's endpoint and CURVE key come from it.
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


Rewrite = Callable[[list[bytes]], list[bytes]]


@contextmanager
def proxy(
    broker: BrokerProcess, rewrite: Rewrite | None = None, *, curve: bool = True
) -> Iterator[tuple[str, str | None, list[list[bytes]]]]:
    """A server in front of ``broker``'s frontend (CURVE when ``curve``) that forwards
    everything, passes each message to the client through ``rewrite`` (if any) and records
    what the client was sent. Yields (endpoint, its CURVE key or None, the messages sent)."""
    context = zmq.Context()
    front = context.socket(zmq.ROUTER)
    back = context.socket(zmq.DEALER)
    key: str | None = None
    if curve:
        public, secret = zmq.curve_keypair()
        front.curve_server = True
        front.curve_secretkey = secret
        back.curve_serverkey = curve_options(broker)["server_key"].encode()
        back.curve_publickey = public
        back.curve_secretkey = secret
        key = public.decode()
    front.linger = back.linger = 0
    port = front.bind_to_random_port("tcp://127.0.0.1")
    back.connect(broker.endpoints["frontend"])
    stop = threading.Event()
    sent: list[list[bytes]] = []

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
                    out = rewrite(frames) if rewrite is not None else frames
                    sent.append(out)
                    front.send_multipart([client, *out])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}", key, sent
    finally:
        stop.set()
        thread.join(WAIT_S)
        front.close()
        back.close()
        context.term()


def is_config(frames: list[bytes]) -> bool:
    return len(frames) == 5 and frames[2] == b"CONFIG"


@contextmanager
def tampering_proxy(broker: BrokerProcess, rogue_frontend: str) -> Iterator[tuple[str, str]]:
    """A CURVE proxy that rewrites each CONFIG: every other broker's frontend becomes
    ``rogue_frontend`` and the ``sha256`` option is made the new document's, the signatures
    kept. Yields (endpoint, its CURVE key)."""
    seen: list[int] = []

    def tamper(frames: list[bytes]) -> list[bytes]:
        if not is_config(frames):
            return frames
        tree = json.loads(frames[4])
        for entry in tree.get("brokers", [])[1:]:
            entry["frontend"] = rogue_frontend
        document = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
        options = json.loads(frames[3])
        options["sha256"] = hashlib.sha256(document).hexdigest()
        seen.append(options["config_version"])
        return [*frames[:3], json.dumps(options).encode(), document]

    with proxy(broker, tamper) as (endpoint, key, _sent):
        assert key is not None
        yield endpoint, key
    assert seen, "the proxy never saw a CONFIG"


def admin_hashes(broker: BrokerProcess) -> list[bytes]:
    """The admins' scrypt hashes of the family's network config, as bytes."""
    network = load(broker.network_file, kind="network")
    hashes = [admin.password_hash.encode() for admin in network.admins]
    assert hashes, "the family has admins"
    return hashes


def test_a_verifying_client_is_sent_the_signed_view_never_the_admins_hashes(
    tmp_path: Path,
) -> None:
    """Every byte the broker sends a client with the trusted key (through a recording proxy):
    the CONFIG carries the view and its view_signature, and no admin's hash, nor any field of
    the whole config the view does not name, is anywhere in it."""
    trusted = tmp_path / "keys" / "signing.pub"
    with (
        running_brokers(tmp_path, 2, curve=True, **FAST) as (b1, b2),
        proxy(b1) as (endpoint, proxy_key, sent),
    ):
        options = dict(curve_options(b1), server_key=proxy_key)
        with Client(
            endpoint, timeout=5.0, heartbeat_interval=0.2, trusted_key=trusted, **options
        ) as client:
            config = client.connect(timeout=WAIT_S)
            assert config.version == 1
            assert {entry["identity"] for entry in config.document["brokers"]} == {"b1", "b2"}
        configs = [frames for frames in sent if is_config(frames)]
        assert configs, "the client was sent no CONFIG"
        for frames in configs:
            options_sent = json.loads(frames[3])
            assert "view_signature" in options_sent and "signature" not in options_sent
            assert set(json.loads(frames[4])) == set(b1.network.client_view)
        received = b"".join(b"".join(frames) for frames in sent)
        for secret in admin_hashes(b1):
            assert secret not in received
        for word in (b"password_hash", b"admins", b"scrypt", b"error_threshold"):
            assert word not in received
        assert b2.pid  # the family is whole


def test_a_replayed_older_view_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A proxy that answers with the view of version 1 (validly signed, once current) after the
    client verified version 2: refused as older, and version 1 is never in force again (the
    client leaves the proxy for a broker its verified view names, as after a 503)."""
    trusted = tmp_path / "keys" / "signing.pub"
    recorded: dict[int, list[bytes]] = {}
    replay: dict[str, list[bytes] | None] = {"with": None}

    def record_or_replay(frames: list[bytes]) -> list[bytes]:
        if not is_config(frames):
            return frames
        recorded.setdefault(json.loads(frames[3])["config_version"], frames)
        return replay["with"] or frames

    def refused_as_older() -> bool:
        seen.append(verified_version(client))
        return any(
            "older than the verified config_version 2" in record.getMessage()
            for record in caplog.records
        )

    seen: list[int] = []
    with (
        running_brokers(tmp_path, 1, curve=True, **FAST) as (b1,),
        proxy(b1, record_or_replay) as (endpoint, proxy_key, _sent),
    ):
        options = dict(curve_options(b1), server_key=proxy_key)
        with Client(
            endpoint, timeout=3.0, heartbeat_interval=0.2, trusted_key=trusted, **options
        ) as client:
            assert client.connect(timeout=WAIT_S).version == 1
            raise_version(b1, 2)
            wait_until(lambda: verified_version(client) == 2, what="the client verified v2")
            replay["with"] = recorded[1]
            raise_version(b1, 3)
            wait_until(refused_as_older, what="the replayed view of v1 refused")
            assert 1 not in seen and set(seen) <= {2, 3}


def verified_version(client: Client) -> int:
    """Let the client hear its broker (a broker-answered mmi.service request), then say which
    config version it runs (the sync client reads its socket only inside a call)."""
    with contextlib.suppress(Scale0Error):
        client.request("mmi.service", b"echo", timeout=0.5)
    return client.config.version if client.config is not None else 0


def raise_version(broker: BrokerProcess, version: int) -> None:
    """As an operator does on a config source: raise config_version, SIGHUP, wait for it."""
    text = broker.network_file.read_text()
    broker.network_file.write_text(
        text.replace(f"config_version: {version - 1}\n", f"config_version: {version}\n")
    )
    os.kill(broker.pid, signal.SIGHUP)
    wait_until(
        lambda: any(
            e.get("event") == "config_applied" and e.get("version") == version
            for e in broker.logs()
        ),
        what=f"version {version} applied",
    )


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
            assert checking.config is None


def test_a_config_without_a_view_signature_is_refused_until_signed_again(tmp_path: Path) -> None:
    """docs/operations.md "A config signed without its client view", as written: without
    CURVE too, a verifying client takes the signed view; a config set with a signature file
    that has no view_signature (made before views were signed) is refused naming it, while a
    plain client is served; `scale0ctl config sign` and `config set` again fix it (the same
    version: the brokers add the view signature, nothing renegotiates)."""
    trusted = tmp_path / "keys" / "signing.pub"
    with running_brokers(tmp_path, 1, **FAST) as (b1,):
        with Client(b1.endpoints["frontend"], timeout=5.0, trusted_key=trusted) as client:
            assert client.connect(timeout=WAIT_S).version == 1
        # An operator sets version 2 with a signature file that has no view_signature.
        v2 = tmp_path / "v2.yaml"
        v2.write_text(
            b1.network_file.read_text().replace("config_version: 1\n", "config_version: 2\n")
        )
        ctl("config", "sign", str(v2), "--key", str(tmp_path / "keys" / "signing.key"))
        old = tmp_path / "v2.yaml.sig"
        fields = json.loads(old.read_text())
        del fields["view_signature"]
        old.write_text(json.dumps(fields))
        verified = ctl("config", "verify", str(v2), "--trusted", str(trusted))
        assert "no view_signature (clients that verify refuse it): sign it again" in verified
        ctl("config", "set", str(v2), "--broker", b1.endpoints["frontend"])
        with (
            Client(b1.endpoints["frontend"], timeout=3.0, trusted_key=trusted) as checking,
            pytest.raises(UntrustedConfig, match="carries no view_signature"),
        ):
            checking.connect(timeout=3.0)
        with Client(b1.endpoints["frontend"], timeout=5.0) as plain:
            assert plain.connect(timeout=WAIT_S).version == 2
        # The procedure: sign it again with this scale0ctl, set it again.
        ctl("config", "sign", str(v2), "--key", str(tmp_path / "keys" / "signing.key"))
        ctl("config", "set", str(v2), "--broker", b1.endpoints["frontend"])
        with Client(b1.endpoints["frontend"], timeout=5.0, trusted_key=trusted) as client:
            assert client.connect(timeout=WAIT_S).version == 2
        assert any(e.get("event") == "config_view_signed" for e in b1.logs())


def ctl(*args: str) -> str:
    """``scale0ctl ARGS`` as the family's admin; its stdout (it must succeed)."""
    executable = shutil.which("scale0ctl")
    assert executable is not None
    password, _role = FAMILY_ADMINS["admin"]
    done = subprocess.run(
        [executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SCALE0_AUTH_ID": "admin", "SCALE0_AUTH_PASSWORD": password},
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_the_view_signature_reaches_a_joined_broker_by_config_and_pub_and_is_saved(
    tmp_path: Path,
) -> None:
    """b2 is no config source: it got version 1 from its seed's CONFIG (§5.5) and version 2
    from the PUB (§6.1); a verifying client served by b2 alone verifies both, and b2's saved
    config holds the view signature (§6.3 rule 6)."""
    trusted = tmp_path / "keys" / "signing.pub"
    # No republish within the test: b2 has version 1 from the CONFIG alone, version 2 from the
    # one publish that follows its SIGHUP.
    with running_brokers(tmp_path, 2, sources=[0], config_republish_s=600.0, **FAST) as (b1, b2):
        with Client(b2.endpoints["frontend"], timeout=5.0, trusted_key=trusted) as client:
            assert client.connect(timeout=WAIT_S).version == 1
            raise_version(b1, 2)
            wait_until(lambda: verified_version(client) == 2, what="v2 verified at b2")
            assert client.endpoint == b2.endpoints["frontend"]
        saved = json.loads((tmp_path / "b2" / "data" / "network-config.json").read_text())
        assert saved["document"]["config_version"] == 2
        assert re.fullmatch(r"[0-9a-f]{128}", saved["view_signature"])


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
