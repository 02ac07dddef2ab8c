"""BrokerNode on real loopback sockets: negotiation, the hot path, the timer, bans, garbage.

In-process tests run the node on its own IOLoop in a background thread (joined on exit); the
soak test runs the installed ``scale0-broker`` as a subprocess so its RSS can be measured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from tornado.ioloop import IOLoop

from scale0.config.canonical import config_sha256, tree_sha256
from scale0.config.model import BrokerConfig, BrokerEntry, NetworkConfig
from scale0.core.effects import Channel
from scale0.crypto.keys import (
    generate_keypair,
    load_private_key,
    load_public_key,
    sign_config,
    verify_config,
)
from scale0.net.node import BindError, BrokerNode, _FdHandler, inbound_size_limit
from scale0.testing import running_broker
from scale0.wire import (
    SIG_CLIENT,
    SIG_WORKER,
    CheckConfig,
    ClientReply,
    ClientRequest,
    Config,
    ConfigType,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
    WorkerReply,
    WorkerRequest,
    decode_from_broker,
)
from tests.net import s0p

pytestmark = pytest.mark.usefixtures("broker_io")  # loop and lane (tests/conftest.py)

WAIT_S = 10.0


def _network(**overrides: Any) -> NetworkConfig:
    entry = BrokerEntry(
        identity="solo",
        frontend="tcp://127.0.0.1:15555",
        backend="tcp://127.0.0.1:15556",
        peer="tcp://127.0.0.1:15557",
        config_pub="tcp://127.0.0.1:15558",
        config_source=True,
    )
    return NetworkConfig(family="test", config_version=1, brokers=(entry,), **overrides)


def _broker_config(**overrides: Any) -> BrokerConfig:
    values: dict[str, Any] = {
        "identity": "solo",
        "frontend_port": 0,
        "backend_port": 0,
        "peer_port": 0,
        "config_pub_port": 0,
        "state": "active",
        "config_source": True,
        "network_config": "network.yaml",
        "signing_key": "signing.key",
        "trusted_keys": ("signing.pub",),
    }
    values.update(overrides)
    return BrokerConfig(**values)


class NodeThread:
    """A BrokerNode serving on its own asyncio/Tornado loop in a thread."""

    def __init__(
        self,
        network: NetworkConfig,
        signature: str | None,
        events: Path | None = None,
        **broker_overrides: Any,
    ) -> None:
        self.network = network
        self.signature = signature
        self.events = events  # the event log's directory, None: no event log
        self.broker_config = _broker_config(**broker_overrides)
        self.node: BrokerNode | None = None
        self.loop: IOLoop | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-node", daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self.loop = IOLoop.current()
            self.node = BrokerNode(
                self.broker_config,
                self.network,
                signature=self.signature,
                event_log_dir=self.events,
            )
            self.node.start()
            self._ready.set()
            await self.node.serve()

        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported by start()/stop() in the test thread
            self.error = exc
        finally:
            self._ready.set()

    def start(self) -> BrokerNode:
        self._thread.start()
        if not self._ready.wait(WAIT_S) or self.node is None or not self.node.running:
            self.stop()
            raise RuntimeError(f"node did not start: {self.error!r}")
        return self.node

    def endpoint(self, channel: Channel) -> str:
        assert self.node is not None
        return self.node.endpoints[channel]

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the node's loop and return its result (bounded wait)."""
        assert self.loop is not None
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            try:
                box.append(fn())
            finally:
                done.set()

        self.loop.add_callback(run)
        assert done.wait(WAIT_S), "node loop did not answer"
        return box[0]

    def stop(self) -> None:
        if self._thread.is_alive() and self.loop is not None and self.node is not None:
            self.loop.add_callback(self.node.stop)
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "node thread did not stop"
        if self.error is not None:
            raise self.error


def _wait_for_workers(thread: NodeThread, count: int) -> None:
    """Until the core counts ``count`` READY workers; fails after WAIT_S (bounded)."""
    assert thread.node is not None
    deadline = time.monotonic() + WAIT_S
    while (workers := thread.call(thread.node.stats)["workers"]) < count:
        assert time.monotonic() < deadline, f"{workers} of {count} workers registered"
        time.sleep(0.01)  # the interval between two looks, not a guess at how long READY takes


@pytest.fixture(scope="module")
def signing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return generate_keypair(tmp_path_factory.mktemp("keys"))


def _signature(key_path: Path, network: NetworkConfig) -> str:
    return sign_config(
        load_private_key(key_path), network.family, network.config_version, config_sha256(network)
    )


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _node(signing: tuple[Path, Path], **network_overrides: Any) -> NodeThread:
    network = _network(**network_overrides)
    return NodeThread(network, _signature(signing[0], network))


@pytest.fixture
def node(signing: tuple[Path, Path]) -> Iterator[NodeThread]:
    thread = _node(signing)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def _round_trip(ctx: zmq.Context[Any], frontend: str, backend: str, tag: bytes) -> None:
    """READY + REQUEST -> worker gets REQUEST; REPLY -> client gets REPLY."""
    with (
        s0p.worker(ctx, backend, ("echo",)) as worker,
        s0p.client(ctx, frontend) as client,
    ):
        # READY is fire-and-forget; a request racing it may wait in the queue (R6), still fine.
        client.send(ClientRequest("echo", b"req-" + tag, (b"ping", tag)))
        request = worker.recv(WorkerRequest)
        assert request.service == "echo"
        assert request.body == (b"ping", tag)
        worker.send(WorkerReply(request.ticket, 200, (b"pong", tag)))
        reply = client.recv(ClientReply)
        assert (reply.request_id, reply.status, reply.body) == (b"req-" + tag, 200, (b"pong", tag))


# ---- basics ---------------------------------------------------------------------------------


def test_endpoints_are_the_real_ports(node: NodeThread) -> None:
    assert node.node is not None
    endpoints = node.node.endpoints
    assert set(endpoints) == {Channel.FRONTEND, Channel.BACKEND, Channel.PEER}
    assert set(node.node.endpoint_names()) == {"frontend", "backend", "peer", "config_pub"}
    for endpoint in node.node.endpoint_names().values():
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) > 0


def test_ready_is_logged_once_with_the_endpoints(
    signing: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scale0")
    thread = _node(signing)
    thread.start()
    try:
        assert thread.node is not None
        expected = thread.node.endpoint_names()
    finally:
        thread.stop()
    ready = [r for r in caplog.records if getattr(r, "s0_event", None) == "broker_ready"]
    assert len(ready) == 1
    fields = ready[0].s0_fields  # type: ignore[attr-defined]
    assert fields["endpoints"] == expected
    assert ready[0].s0_broker == "solo"  # type: ignore[attr-defined]
    stopped = [r for r in caplog.records if getattr(r, "s0_event", None) == "broker_stopped"]
    assert len(stopped) == 1


def test_checkconfig_gets_config(node: NodeThread, ctx: zmq.Context[Any]) -> None:
    with s0p.Dealer(ctx, node.endpoint(Channel.FRONTEND), SIG_CLIENT) as client:
        client.send(CheckConfig(ConfigType.JSON, protocol=SIG_CLIENT))
        config = client.recv(Config)
    network = node.network
    assert config.config_version == network.config_version
    # protocol.md §3.2: a client gets its view, a digest of exactly that view (so it can check
    # the document arrived intact), and no signature (which covers the whole config only).
    view = json.loads(config.document)
    assert config.sha256 == tree_sha256(view) != config_sha256(network)
    assert config.signature is None
    assert view["family"] == "test" and "admins" not in view


def test_the_broker_signs_its_network_config_at_start(
    node: NodeThread, signing: tuple[Path, Path]
) -> None:
    # The signature a config source makes at start verifies against its own public key (it is
    # what peers will receive with the whole config, protocol.md §5.5).
    network = node.network
    assert node.signature is not None
    verify_config(
        node.signature,
        network.family,
        network.config_version,
        config_sha256(network),
        [load_public_key(signing[1])],
    )


def test_checkconfig_raw_frames_carry_the_config(node: NodeThread, ctx: zmq.Context[Any]) -> None:
    # Independent of how the signature is spelled: the CONFIG frames and the document.
    with s0p.Dealer(ctx, node.endpoint(Channel.BACKEND), SIG_WORKER) as worker:
        worker.send(CheckConfig(ConfigType.JSON, protocol=SIG_WORKER))
        frames = worker.expect_command(b"CONFIG")
    options = json.loads(frames[3])
    assert options["config_version"] == 1
    assert options["sha256"] == tree_sha256(json.loads(frames[4]))
    assert options.get("signature") is None
    assert json.loads(frames[4])["family"] == "test"


def test_request_reaches_worker_and_reply_reaches_client(
    node: NodeThread, ctx: zmq.Context[Any]
) -> None:
    _round_trip(ctx, node.endpoint(Channel.FRONTEND), node.endpoint(Channel.BACKEND), b"1")


def test_many_requests_in_one_burst_are_all_answered(
    node: NodeThread, ctx: zmq.Context[Any]
) -> None:
    # More than one batch (DEFAULT_BATCH_SIZE) in flight at once: nothing is lost at the edge.
    count = 3000
    with (
        s0p.worker(ctx, node.endpoint(Channel.BACKEND), ("echo",), capacity=64) as worker,
        s0p.client(ctx, node.endpoint(Channel.FRONTEND)) as client,
    ):
        _wait_for_workers(node, 1)  # READY is one-way: requests before it lands would wait
        for i in range(count):
            client.send(ClientRequest("echo", b"%d" % i, (b"x",)))
        answered: set[bytes] = set()
        deadline = time.monotonic() + 30
        while len(answered) < count and time.monotonic() < deadline:
            while worker.socket.poll(0):
                frames = worker.socket.recv_multipart()
                request = decode_from_broker(frames, signature=SIG_WORKER, max_frame_bytes=1 << 20)
                if isinstance(request, WorkerRequest):
                    worker.send(WorkerReply(request.ticket, 200, request.body))
            if client.socket.poll(10):
                reply = client.recv(ClientReply)
                assert reply.status == 200
                answered.add(reply.request_id)
        assert len(answered) == count


#: The loop's pump, tested where the loop reads these requests: with a lane they never reach
#: it (the lane takes a negotiated S0P client's requests, phase 3b; its own batching is held
#: by tests/net/test_lane*.py).
LOOP_ONLY = pytest.mark.parametrize("broker_io", ["loop"], indirect=True)


@LOOP_ONLY
def test_one_pump_drains_every_socket(node: NodeThread, ctx: zmq.Context[Any]) -> None:
    # docs/performance.md step 1: a worker's REPLY and the client REQUEST waiting for that worker
    # are handled in one pass of the loop, not one wake-up per socket.
    assert node.node is not None and node.loop is not None
    broker_node, loop = node.node, node.loop
    with (
        s0p.worker(ctx, node.endpoint(Channel.BACKEND), ("echo",)) as worker,
        s0p.client(ctx, node.endpoint(Channel.FRONTEND)) as client,
    ):
        client.send(ClientRequest("echo", b"first", (b"a",)))
        first = worker.recv(WorkerRequest)  # the worker (capacity 1) is busy now
        wakeups_before = node.call(broker_node.stats)["net_wakeups"]
        held, go = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            go.wait(WAIT_S)

        # Hold the loop while both sockets fill up; send only once it is held, so the FDs'
        # readiness cannot be handled before the probe below.
        loop.add_callback(hold)
        assert held.wait(WAIT_S)
        worker.send(WorkerReply(first.ticket, 200, (b"a",)))
        client.send(ClientRequest("echo", b"second", (b"b",)))
        done = threading.Event()
        box: list[tuple[dict[str, int], dict[str, int], int]] = []

        def probe() -> None:
            # Runs before the loop looks at the FDs again: wait (on the loop's thread, the
            # sockets' owner) until both sockets hold their message, then do what the loop
            # does when the backend's FD fires (polling here processed both FDs' signals).
            poller = zmq.Poller()
            for port in broker_node._ports.values():
                poller.register(port.socket, zmq.POLLIN)
            deadline = time.monotonic() + WAIT_S
            ready = 0
            while ready < 2 and time.monotonic() < deadline:
                ready = len(poller.poll(100))
            before = broker_node.stats()
            backend = broker_node._ports[Channel.BACKEND.value]
            _FdHandler(broker_node, backend)(backend.fd, IOLoop.READ)
            box.append((before, broker_node.stats(), ready))
            done.set()

        loop.add_callback(probe)
        go.set()
        assert done.wait(WAIT_S)
        before, after, ready = box[0]
        assert ready == 2
        assert after["net_received"] - before["net_received"] == 2
        assert after["replies"] - before["replies"] == 1
        assert after["net_sent"] - before["net_sent"] == 2  # REPLY to the client, REQUEST out
        assert client.recv(ClientReply).request_id == b"first"
        second = worker.recv(WorkerRequest)
        assert second.body == (b"b",)
        worker.send(WorkerReply(second.ticket, 200, (b"b",)))
        assert client.recv(ClientReply).request_id == b"second"
        assert node.call(broker_node.stats)["net_wakeups"] > wakeups_before


@LOOP_ONLY
def test_a_port_sent_on_after_its_batch_is_read_again(
    signing: tuple[Path, Path], ctx: zmq.Context[Any]
) -> None:
    # docs/operations.md (the peer-silence defect, fixed): in one round the client's REQUEST
    # queued a send on the backend, the backend was then read to its end, and the worker's
    # REPLY arrived before the round's sends went out. The send processed libzmq's command
    # for that REPLY, so the backend's FD never fired for it: the loop slept with the REPLY
    # waiting until something else touched the socket. Here nothing else does (heartbeats a
    # minute apart), so the first reply only comes if the send itself left the port dirty.
    # (Between two brokers the same turn stopped b1 reading b2's link on its peer ROUTER.)
    thread = _node(signing, default_heartbeat_interval_ms=60_000)
    thread.start()
    try:
        assert thread.node is not None
        broker_node = thread.node
        backend = broker_node._ports[Channel.BACKEND.value]
        flush = broker_node._flush
        with (
            s0p.worker(
                ctx,
                thread.endpoint(Channel.BACKEND),
                ("echo",),
                capacity=2,
                heartbeat=False,
                hbeatinterval_ms=60_000,
            ) as worker,
            s0p.client(ctx, thread.endpoint(Channel.FRONTEND)) as client,
        ):
            client.send(ClientRequest("echo", b"first", (b"a",)))
            first = worker.recv(WorkerRequest)  # one slot of two taken: the second goes too
            signalled: list[bool] = []

            def reply_arrives_before_the_send() -> None:
                # On the loop's thread, once, in the round that routes the second request:
                # its REQUEST waits in the outbox for the backend, the round's reads are done.
                if not signalled and any(item[0] == backend.io for item in broker_node._outbox):
                    worker.send(WorkerReply(first.ticket, 200, (b"a",)))
                    deadline = time.monotonic() + WAIT_S
                    ready: list[int] = []
                    while not ready and time.monotonic() < deadline:
                        ready = select.select([backend.fd], [], [], 0.1)[0]  # libzmq signalled
                    signalled.append(bool(ready))
                    time.sleep(0.01)  # past libzmq's ~1 ms throttle: the send processes commands
                flush()

            thread.call(lambda: setattr(broker_node, "_flush", reply_arrives_before_the_send))
            client.send(ClientRequest("echo", b"second", (b"b",)))
            second = worker.recv(WorkerRequest)
            assert signalled == [True]
            assert client.recv(ClientReply).request_id == b"first"
            worker.send(WorkerReply(second.ticket, 200, (b"b",)))
            assert client.recv(ClientReply).request_id == b"second"
    finally:
        thread.stop()


def test_a_burst_of_heartbeats_is_answered_in_order_with_what_lies_between(
    node: NodeThread, ctx: zmq.Context[Any]
) -> None:
    # The node hands each batch's runs of plain HEARTBEATs to the core in one call
    # (heartbeat_items, in C or on the fallback): the answers keep the order of what was sent,
    # the messages between them are answered in their place, and an odd HEARTBEAT (an old
    # config_version, one from a stranger) gets what it always got.
    def beat(version: int = 1) -> Heartbeat:
        return Heartbeat(time.time(), version, protocol=SIG_CLIENT)

    ask = ClientRequest("mmi.service", b"q", (b"echo",))
    with (
        s0p.client(ctx, node.endpoint(Channel.FRONTEND)) as client,
        s0p.Dealer(ctx, node.endpoint(Channel.FRONTEND), SIG_CLIENT) as stranger,
    ):
        burst = [beat(), beat(), beat(0), beat(), ask, beat(), beat()] * 20
        for message in burst:
            client.send(message)
        stranger.send(beat())
        got = [client.recv_or_none(heartbeats=True) for _ in burst]
        want = [
            "ClientReply"
            if isinstance(m, ClientRequest)
            else "ForceNegotiate"
            if m.config_version == 0
            else "Heartbeat"
            for m in burst
            if isinstance(m, ClientRequest | Heartbeat)
        ]
        assert [type(m).__name__ for m in got] == want
        assert isinstance(stranger.recv_or_none(heartbeats=True), ForceNegotiate)


def test_timer_drives_broker_heartbeats(signing: tuple[Path, Path], ctx: zmq.Context[Any]) -> None:
    thread = _node(signing, default_heartbeat_interval_ms=100)
    thread.start()
    try:
        with s0p.worker(
            ctx, thread.endpoint(Channel.BACKEND), ("echo",), hbeatinterval_ms=100
        ) as worker:
            beats = 0
            deadline = time.monotonic() + 5
            while beats < 3 and time.monotonic() < deadline:
                message = worker.recv_or_none(1.0, heartbeats=True)
                if isinstance(message, Heartbeat):
                    beats += 1
                    worker.send(Heartbeat(time.time(), 1, protocol=SIG_WORKER))
            assert beats >= 3
        assert thread.node is not None
        stats = thread.call(thread.node.stats)
        assert stats["net_ticks"] >= 3
    finally:
        thread.stop()


def test_stop_tells_everyone_disconnect(signing: tuple[Path, Path], ctx: zmq.Context[Any]) -> None:
    thread = _node(signing)
    thread.start()
    try:
        client = s0p.client(ctx, thread.endpoint(Channel.FRONTEND))
        worker = s0p.worker(ctx, thread.endpoint(Channel.BACKEND), ("echo",))
        with client, worker:
            _wait_for_workers(thread, 1)  # READY is one-way: it must land before stopping
            thread.stop()
            client.expect_command(b"DISCONNECT")
            worker.expect_command(b"DISCONNECT")
    finally:
        thread.stop()


def test_port_in_use_is_a_bind_error(node: NodeThread) -> None:
    port = int(node.endpoint(Channel.FRONTEND).rsplit(":", 1)[1])
    network = _network()
    other = BrokerNode(_broker_config(frontend_port=port), network, signature=None)

    async def try_start() -> None:
        other.start()

    with pytest.raises(BindError) as caught:
        asyncio.run(try_start())
    assert caught.value.channel is Channel.FRONTEND
    assert str(port) in str(caught.value)
    other.stop()  # idempotent on a node that never started; releases its context


# ---- hostile input --------------------------------------------------------------------------

_SIGNATURES = (b"S0C1", b"S0W1", b"S0B1", b"MDPC01", b"MDPC02", b"MDPW01", b"MDPW02", b"S0X9", b"")
_COMMANDS = (
    b"CHECKCONFIG",
    b"READY",
    b"REQUEST",
    b"REPLY",
    b"PARTIAL",
    b"HEARTBEAT",
    b"DISCONNECT",
    b"MANAGEMENTREQ",
    b"HELLO",
    b"\x01",
    b"request",
    b"",
)


def garbage(rng: random.Random, max_frame_bytes: int) -> list[bytes]:
    """One hostile multipart message of a random shape (never empty: zmq sends >= 1 frame)."""
    kind = rng.randrange(9)
    junk = [rng.randbytes(rng.randrange(0, 48)) for _ in range(rng.randrange(0, 6))]
    if kind == 0:  # anything at all
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 9))]
    if kind == 1:  # right shape, random signature and command, junk options
        return [b"", rng.choice(_SIGNATURES), rng.choice(_COMMANDS), *junk]
    if kind == 2:  # bad JSON options
        return [b"", rng.choice(_SIGNATURES[:3]), b"CHECKCONFIG", b'{"config_type": "json"']
    if kind == 3:  # options of the wrong types
        options = {"config_type": rng.choice([1, None, "yaml", []]), "config_version": "x"}
        return [b"", b"S0C1", b"CHECKCONFIG", json.dumps(options).encode()]
    if kind == 4:  # a frame over max_frame_bytes (but under the libzmq guard)
        size = max_frame_bytes + 1 + rng.randrange(2048)
        return [b"", b"S0C1", b"REQUEST", b"echo", b"id", b"x" * size]
    if kind == 5:  # non-empty delimiter
        return [b"oops", b"S0C1", b"REQUEST", b"echo", b"id"]
    if kind == 6:  # truncated
        return [b"", rng.choice(_SIGNATURES[:2])][: rng.randrange(1, 3)]
    if kind == 7:  # READY with a reserved or silly service list
        options = {"services": rng.choice([["mmi.x"], [""], "echo", [1]]), "heartbeat": True}
        return [b"", b"S0W1", b"READY", json.dumps(options).encode()]
    return [b"", b"S0W1", b"REPLY", rng.randbytes(8), b"2x0", *junk]  # bad status


def test_banned_sender_gets_no_answers(signing: tuple[Path, Path], ctx: zmq.Context[Any]) -> None:
    threshold = 5
    thread = _node(signing, error_threshold=threshold)
    thread.start()
    try:
        frontend = thread.endpoint(Channel.FRONTEND)
        with s0p.Dealer(ctx, frontend, SIG_CLIENT) as bad:
            for _ in range(threshold * 4):
                bad.send_frames([b"", b"NOPE", b"REQUEST"])
            answers = []
            while (message := bad.recv_or_none(0.5)) is not None:
                answers.append(message)
            codes = [m.code for m in answers if isinstance(m, DisconnectError)]
            assert len(codes) == len(answers)
            assert codes == [501] * threshold + [429]
            # Now banned: even a perfectly good CHECKCONFIG is dropped unread.
            bad.send(CheckConfig(ConfigType.JSON, 1, protocol=SIG_CLIENT))
            assert bad.recv_or_none(0.5) is None
        # Others are unaffected.
        _round_trip(ctx, frontend, thread.endpoint(Channel.BACKEND), b"after-ban")
        assert thread.node is not None
        stats = thread.call(thread.node.stats)
        assert stats["banned"] == 1
        assert stats["net_banned_dropped"] >= threshold * 4 - threshold - 1
        assert stats["net_internal_errors"] == 0
    finally:
        thread.stop()


def test_garbage_in_process_raises_nothing(
    signing: tuple[Path, Path], ctx: zmq.Context[Any]
) -> None:
    thread = _node(signing, error_threshold=100_000, max_frame_bytes=4096)
    thread.start()
    rng = random.Random(1)
    try:
        for channel in (Channel.FRONTEND, Channel.BACKEND):
            with s0p.Dealer(ctx, thread.endpoint(channel), SIG_CLIENT) as sender:
                for _ in range(2000):
                    sender.send_frames(garbage(rng, 4096))
                # Quiet for a while = everything was read.
                while sender.recv_frames(0.5) is not None:
                    pass
        _round_trip(
            ctx, thread.endpoint(Channel.FRONTEND), thread.endpoint(Channel.BACKEND), b"after"
        )
        assert thread.node is not None
        stats = thread.call(thread.node.stats)
        assert stats["net_internal_errors"] == 0
        assert stats["net_malformed"] > 1000
    finally:
        thread.stop()


def test_garbage_soak_keeps_rss_flat_and_service_up(tmp_path: Path, ctx: zmq.Context[Any]) -> None:
    """10 000 hostile messages on each socket of a real broker process.

    SCALE0_SOAK_ROUNDS=N repeats the measured round N times (a leak grows every round).
    """
    max_frame = 4096
    per_socket = 10_000
    senders_per_socket = 10
    chunk = 100
    rng = random.Random(20240607)
    with running_broker(tmp_path, error_threshold=1_000_000, max_frame_bytes=max_frame) as b:
        frontend, backend = b.endpoints["frontend"], b.endpoints["backend"]

        syncs = iter(range(1 << 30))

        def sync(dealer: s0p.Dealer) -> None:
            """Everything this dealer sent before is processed once its CHECKCONFIG is answered
            (a ROUTER reads each connection in order); paces the load so queues stay small."""
            client_id = f"sync-{next(syncs)}"
            dealer.send(CheckConfig(ConfigType.JSON, 1, client_id, protocol=dealer.signature))
            deadline = time.monotonic() + 30
            while True:
                frames = dealer.expect_command(b"CONFIGACK", max(0.0, deadline - time.monotonic()))
                if json.loads(frames[3]).get("client_id") == client_id:
                    return

        def blast(count: int) -> None:
            dealers = [
                s0p.Dealer(ctx, endpoint, signature)
                for endpoint, signature in ((frontend, SIG_CLIENT), (backend, SIG_WORKER))
                for _ in range(senders_per_socket)
            ]
            try:
                per_dealer = count // senders_per_socket
                for start in range(0, per_dealer, chunk):
                    for dealer in dealers:
                        for _ in range(min(chunk, per_dealer - start)):
                            dealer.send_frames(garbage(rng, max_frame))
                    for dealer in dealers:
                        sync(dealer)
                # A frame beyond the libzmq guard: that connection is dropped, nothing buffered.
                with s0p.Dealer(ctx, frontend, SIG_CLIENT) as huge:
                    huge.send_frames([b"", b"S0C1", b"X" * (inbound_size_limit(max_frame) + 1)])
                    assert huge.recv_frames(0.3) is None
            finally:
                for dealer in dealers:
                    dealer.close()

        # Warm-up with the same load: libzmq queues and allocator arenas grow to their working
        # size in the first round (and glibc keeps that memory); a leak shows in the rounds after.
        blast(per_socket)
        _round_trip(ctx, frontend, backend, b"warm")
        before_kb = b.rss_kb()
        samples = []
        for round_ in range(int(os.environ.get("SCALE0_SOAK_ROUNDS", "1"))):
            blast(per_socket)
            _round_trip(ctx, frontend, backend, b"after-%d" % round_)
            samples.append(b.rss_kb())
        after_kb = samples[-1]
        assert after_kb - before_kb < 20 * 1024, (before_kb, after_kb)
        events = [line.get("event") for line in b.logs()]
        assert "internal_error" not in events
        assert "effect_failed" not in events
        assert b.stop() == 0
