"""The Majordomo peers of tools/mdp.py against real brokers: the C strict-LRU floor
(tools/mdp_lru.c, built with gcc), the same C routing in a Python process, called by its
Tornado or asyncio loop or in a C thread of its own (tools/mdp_lru_loop.c and .py: bench cases
c-lru-loop, c-lru-asyncio, c-lru-thread) and majortomo
(PyPI), each a real process on 127.0.0.1. Every test of "the C broker" runs against all four
hosts of the C routing (tools/mdp_lru.h): mdp-lru, Tornado, asyncio, a C thread in Python.

A request goes through and comes back in every framing each broker speaks; the C broker's
guarantee is checked from the worker side (a worker never holds two requests; ready workers are
served first in, first out); heartbeats keep an idle worker registered, and a worker whose
broker falls silent starts over. Every wait is bounded; brokers are stopped by PID.
"""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

from tests.tools.cbuild import built
from tools.mdp import MAJORTOMO, MDP01, MDP02, Client, Dialect, Request, Worker
from tools.mdp_brokers import (
    RunningBroker,
    build_c_broker,
    build_c_loop_module,
    running_c_broker,
    running_c_loop_broker,
    running_majortomo,
)

TIMEOUT_S = 5.0
SERVICE = b"echo"
ALL = pytest.mark.parametrize("dialect", [MDP01, MDP02, MAJORTOMO], ids=lambda d: d.name)


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(build_c_broker, tmp_path_factory.mktemp("mdp-lru"))


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture(scope="module")
def c_loop_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(build_c_loop_module, tmp_path_factory.mktemp("mdp-lru-loop"))


@pytest.fixture(params=["c-lru", "c-lru-loop", "c-lru-asyncio", "c-lru-thread"])
def c_broker(
    request: pytest.FixtureRequest, c_binary: Path, c_loop_module: Path, tmp_path: Path
) -> Iterator[RunningBroker]:
    """The C routing in each of its hosts: its own zmq_poll loop (mdp-lru), Tornado's IOLoop,
    asyncio's loop, a C thread beside a Tornado loop. Heartbeats every 100 ms, so the liveness
    tests take well under a second."""
    if request.param == "c-lru":
        host = running_c_broker(c_binary, tmp_path, heartbeat_ms=100, liveness=3)
    else:
        loop = {"c-lru-loop": "tornado", "c-lru-asyncio": "asyncio"}.get(request.param, "thread")
        host = running_c_loop_broker(
            c_loop_module, tmp_path, loop=loop, heartbeat_ms=100, liveness=3
        )
    with host as broker:
        yield broker
    # Stopped by SIGTERM, each host prints its counters and exits 0.
    assert broker.process.returncode == 0, broker.stop()
    assert broker.stats().get("wakeups", 0) > 0, broker.stop()


Handler = Callable[[Worker, Request], None]


def echo(worker: Worker, request: Request) -> None:
    worker.reply(request, [b"echo:" + request.body[0], *request.body[1:]])


@contextmanager
def serving(worker: Worker, handler: Handler = echo) -> Iterator[list[BaseException]]:
    """Run ``worker`` in a thread until the block ends; errors raised there are listed."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                request = worker.recv(0.05)
                if request is not None:
                    handler(worker, request)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(TIMEOUT_S)
        worker.close()
    assert not thread.is_alive(), "worker thread did not stop"
    assert not errors, errors


@ALL
def test_mdp_request_through_c_broker(
    c_broker: RunningBroker, ctx: zmq.Context[zmq.Socket[bytes]], dialect: Dialect
) -> None:
    worker = Worker(c_broker.backend, SERVICE, dialect, context=ctx, heartbeat_interval_s=0.1)
    client = Client(c_broker.frontend, dialect, context=ctx)
    with serving(worker):
        assert client.request(SERVICE, [b"hello"], TIMEOUT_S) == [b"echo:hello"]
        # Body frames are opaque and several: all of them, in order, both ways.
        body = [b"a", b"", b"\x00" * 1000]
        assert client.request(SERVICE, body, TIMEOUT_S) == [b"echo:a", b"", b"\x00" * 1000]
    assert client.dropped == worker.dropped == 0
    client.close()


def test_mdp_request_through_majortomo(tmp_path: Path, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    with running_majortomo(tmp_path, heartbeat_ms=200) as broker:
        worker = Worker(broker.backend, SERVICE, MAJORTOMO, context=ctx, heartbeat_interval_s=0.2)
        client = Client(broker.frontend, MAJORTOMO, context=ctx)
        with serving(worker):
            assert client.request(SERVICE, [b"hello"], TIMEOUT_S) == [b"echo:hello"]
            assert client.request(SERVICE, [b"a", b"b"], TIMEOUT_S) == [b"echo:a", b"b"]
        assert client.dropped == worker.dropped == 0
        client.close()


def partials(worker: Worker, request: Request) -> None:
    worker.partial(request, [b"one"])
    worker.partial(request, [b"two"])
    worker.reply(request, [b"end"])


@pytest.mark.parametrize("dialect", [MDP02, MAJORTOMO], ids=lambda d: d.name)
def test_mdp02_partials_through_c_broker(
    c_broker: RunningBroker, ctx: zmq.Context[zmq.Socket[bytes]], dialect: Dialect
) -> None:
    worker = Worker(c_broker.backend, SERVICE, dialect, context=ctx, heartbeat_interval_s=0.1)
    client = Client(c_broker.frontend, dialect, context=ctx)
    with serving(worker, partials):
        assert client.request(SERVICE, [b"x"], TIMEOUT_S) == [b"one", b"two", b"end"]
    client.close()


def test_mdp02_partials_through_majortomo(
    tmp_path: Path, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    with running_majortomo(tmp_path, heartbeat_ms=200) as broker:
        worker = Worker(broker.backend, SERVICE, MAJORTOMO, context=ctx, heartbeat_interval_s=0.2)
        client = Client(broker.frontend, MAJORTOMO, context=ctx)
        with serving(worker, partials):
            assert client.request(SERVICE, [b"x"], TIMEOUT_S) == [b"one", b"two", b"end"]
        client.close()


def test_c_broker_never_gives_a_worker_two_requests(
    c_broker: RunningBroker, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Strict LRU, seen by the workers: while one holds a request it listens for 20 ms for
    another; with 40 requests outstanding for 2 workers, none ever arrives."""

    def slow(worker: Worker, request: Request) -> None:
        extra = worker.recv(0.02)  # a broker without the guarantee sends the next one now
        worker.reply(request, request.body)
        if extra is not None:
            worker.reply(extra, extra.body)

    workers = [
        Worker(c_broker.backend, SERVICE, MDP01, context=ctx, heartbeat_interval_s=0.1)
        for _ in range(2)
    ]
    client = Client(c_broker.frontend, MDP01, context=ctx)
    with serving(workers[0], slow), serving(workers[1], slow):
        for i in range(40):
            client.send(SERVICE, [b"%d" % i])
        answered = sorted(int(client.recv(TIMEOUT_S).body[0]) for _ in range(40))
    assert answered == list(range(40))
    assert [w.max_held for w in workers] == [1, 1]
    client.close()


def test_c_broker_serves_ready_workers_first_in_first_out(
    c_broker: RunningBroker, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Requests one at a time to two idle workers: the one that answered longest ago gets the
    next, so they alternate (a most-recently-used broker would send every one to the same)."""

    def named(name: bytes) -> Handler:
        def handler(worker: Worker, request: Request) -> None:
            worker.reply(request, [name])

        return handler

    client = Client(c_broker.frontend, MDP01, context=ctx)
    a = Worker(c_broker.backend, SERVICE, MDP01, context=ctx, heartbeat_interval_s=0.1)
    b = Worker(c_broker.backend, SERVICE, MDP01, context=ctx, heartbeat_interval_s=0.1)
    with serving(a, named(b"a")), serving(b, named(b"b")):
        # Until both are registered and have served once (bounded), then strictly alternate.
        seen: set[bytes] = set()
        for _ in range(50):
            seen.add(client.request(SERVICE, [b"x"], TIMEOUT_S)[0])
            if len(seen) == 2:
                break
        assert seen == {b"a", b"b"}
        served = [client.request(SERVICE, [b"x"], TIMEOUT_S)[0] for _ in range(10)]
    assert all(x != y for x, y in itertools.pairwise(served)), served
    client.close()


def test_mdp_worker_stays_registered_through_heartbeats(
    c_broker: RunningBroker, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Idle for ten heartbeat intervals, the worker keeps its registration: neither side
    expired the other (RFC 7, "Heartbeating")."""
    worker = Worker(c_broker.backend, SERVICE, MDP01, context=ctx, heartbeat_interval_s=0.1)
    assert worker.recv(1.0) is None
    client = Client(c_broker.frontend, MDP01, context=ctx)
    with serving(worker):
        assert client.request(SERVICE, [b"late"], TIMEOUT_S) == [b"echo:late"]
    assert worker.reconnects == worker.disconnects == 0
    client.close()


def test_mdp_worker_starts_over_when_the_broker_falls_silent(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """A 'broker' that never answers: after ``liveness`` intervals the worker opens a new
    socket and sends READY again; it heartbeats meanwhile."""
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    worker = Worker(
        f"tcp://127.0.0.1:{port}",
        SERVICE,
        MDP01,
        context=ctx,
        heartbeat_interval_s=0.05,
        liveness=3,
    )
    assert worker.recv(0.4) is None
    commands: list[tuple[bytes, bytes]] = []
    while router.poll(100):
        frames = router.recv_multipart()
        assert frames[1:3] == [b"", b"MDPW01"]
        commands.append((frames[0], frames[3]))
    assert worker.reconnects >= 1
    readies = [identity for identity, command in commands if command == b"\x01"]
    assert len(set(readies)) >= 2  # READY again, from a new socket
    assert b"\x04" in {command for _, command in commands}  # HEARTBEAT
    worker.close(disconnect=False)
    router.close()


def test_c_broker_disconnects_a_worker_that_replies_unasked(
    c_broker: RunningBroker, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """RFC 7: "The broker MUST respond to any valid but unexpected command by sending
    DISCONNECT". A REPLY from a worker that never said READY is one."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(c_broker.backend)
    dealer.send_multipart([b"", b"MDPW01", b"\x03", b"client", b"", b"body"])
    assert dealer.poll(int(TIMEOUT_S * 1000))
    assert dealer.recv_multipart() == [b"", b"MDPW01", b"\x05"]
    dealer.close()


def test_c_broker_survives_garbage_and_serves_on(
    c_broker: RunningBroker, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Malformed messages on both sockets are dropped (RFC 7: "SHOULD respond to invalid
    messages by dropping them"); the broker goes on serving a well-formed worker and client."""
    garbage = [
        [b""],
        [b"", b""],
        [b"", b"MDPC01"],
        [b"x", b"MDPC01", SERVICE, b"body"],
        [b"", b"MDPC02", b"\x07", SERVICE, b"body"],
        [b"", b"MDPC02", b"\x01"],
        [b"", b"MDPW01"],
        [b"", b"MDPW01", b"\x01"],
        [b"", b"MDPW01", b"\x01", SERVICE, b"extra"],
        [b"", b"MDPW02", b"\xff"],
        [b"", b"MDPW01", b"\x03\x03"],
        [b"", b"MDPC01", SERVICE, *[b"f"] * 70],  # over the broker's 64 frames
    ]
    worker = Worker(c_broker.backend, SERVICE, MDP01, context=ctx, heartbeat_interval_s=0.1)
    client = Client(c_broker.frontend, MDP01, context=ctx)
    with serving(worker):
        # Worker side: garbage, then a HEARTBEAT from a stranger, which is answered with
        # DISCONNECT; on one connection, so the garbage was handled before the answer came.
        back = ctx.socket(zmq.DEALER)
        back.linger = 0
        back.connect(c_broker.backend)
        for frames in garbage:
            back.send_multipart(frames)
        back.send_multipart([b"", b"MDPW01", b"\x04"])
        answers = []
        while back.poll(500):
            answers.append(back.recv_multipart())
        assert answers, "no DISCONNECT for the stranger's HEARTBEAT"
        assert answers[-1] == [b"", b"MDPW01", b"\x05"]
        back.close()
        # Client side: garbage, then a request on the same connection, which is answered.
        for frames in garbage:
            client.socket.send_multipart(frames)
        assert client.request(SERVICE, [b"still"], TIMEOUT_S) == [b"echo:still"]
        assert client.dropped == 0
    assert c_broker.process.poll() is None, "the broker died"
    client.close()


def test_c_loop_wake_up_left_with_input_asks_the_loop_for_another(
    tmp_path_factory: pytest.TempPathFactory, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Built with MAX_ROUNDS=0 and DRAIN_BUDGET=1 (one message per socket per drain), a
    wake-up that still sees input after its drain stops and asks the loop (``again``) for
    another, as ZMQ_FD will not signal that input again: with bursts of 30 requests for 2
    workers, every one is answered, on both loops, and the path was taken."""
    defines = ("MAX_ROUNDS=0", "DRAIN_BUDGET=1")
    module = built(build_c_loop_module, tmp_path_factory.mktemp("rounds0"), defines)
    for loop in ("tornado", "asyncio"):
        directory = tmp_path_factory.mktemp(loop)
        with running_c_loop_broker(module, directory, loop=loop, heartbeat_ms=100) as broker:
            workers = [
                Worker(broker.backend, SERVICE, MDP01, context=ctx, heartbeat_interval_s=0.1)
                for _ in range(2)
            ]
            client = Client(broker.frontend, MDP01, context=ctx)
            with serving(workers[0]), serving(workers[1]):
                for round_ in range(10):
                    for i in range(30):
                        client.send(SERVICE, [b"%d" % i])
                    answered = sorted(int(client.recv(TIMEOUT_S).body[0][5:]) for _ in range(30))
                    assert answered == list(range(30)), round_
            client.close()
        stats = broker.stats()
        assert stats["replies"] == 300 and stats["again"] > 0, (loop, stats)


def test_c_loop_extension_names_bad_input(c_loop_module: Path) -> None:
    """The extension's entry points refuse what they cannot use, with errors that say what
    is wrong, before touching any socket; the host refuses bad settings the same way."""
    spec = importlib.util.spec_from_file_location("_mdp_lru_loop", c_loop_module)
    assert spec is not None and spec.loader is not None
    lane = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lane)
    with pytest.raises(RuntimeError, match=r"start\(\) was not called"):
        lane.wake(3, 1)
    with pytest.raises(ValueError, match="frontend is a NULL socket handle"):
        lane.start(0, 1, 2500.0, 3, print)
    with pytest.raises(ValueError, match="heartbeat_ms must be > 0 and liveness >= 1"):
        lane.start(1, 1, 0.0, 3, print)
    with pytest.raises(TypeError, match="`again` must be callable"):
        lane.start(1, 1, 2500.0, 3, None)
    assert lane.stats().startswith("stats requests=0 replies=0 wakeups=0 ")
    with pytest.raises(RuntimeError, match=r"start\(\) first"):
        lane.run_thread()
    lane.stop_thread()  # no thread: nothing to stop
    host = Path(__file__).resolve().parents[2] / "tools" / "mdp_lru_loop.py"
    done = subprocess.run(
        [sys.executable, str(host), "--module-dir", str(c_loop_module.parent), "-l", "0", "a", "b"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "-i must be > 0 and -l >= 1" in done.stderr, done.stderr
