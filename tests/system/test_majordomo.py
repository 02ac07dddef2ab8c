"""Majordomo clients and workers join a real family unchanged (docs/protocol.md §10).

The peers are tools/mdp.py's 7/MDP client and worker, written from RFC 7's frame tables alone
(not from Scale0's code), against real broker processes on 127.0.0.1: a Majordomo client
reaches Majordomo and S0P workers, here and at another broker; an S0P client reaches a
Majordomo worker at another broker; PARTIALs reach a 7/MDP client folded into its reply; mmi.*
answers from the whole family. Every wait is bounded; brokers are stopped by PID.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import majortomo  # in the test extra: a missing one fails, it is not skipped
import pytest
import zmq

from scale0.net.client import Client
from scale0.net.worker import echo_handler
from scale0.testing import running_brokers, wait_until
from tests.system.test_family import FAST, WAIT_S, family_ready, worker_thread
from tests.tools.test_mdp import serving
from tools.mdp import MAJORTOMO, MDP01, MDP02, Dialect, MdpError, Request
from tools.mdp import Client as MdpClient
from tools.mdp import Worker as MdpWorker

# Each test runs on the loop and in the C lane (tests/conftest.py broker_io).
pytestmark = pytest.mark.usefixtures("broker_io")

Handler = Callable[[MdpWorker, Request], None]


def echo(worker: MdpWorker, request: Request) -> None:
    worker.reply(request, [b"mdp:" + request.body[0], *request.body[1:]])


@contextlib.contextmanager
def mdp_worker(
    endpoint: str,
    service: bytes,
    ctx: zmq.Context[zmq.Socket[bytes]],
    handler: Handler = echo,
    dialect: Dialect = MDP01,
) -> Iterator[MdpWorker]:
    """A Majordomo worker in a thread (tests/tools/test_mdp.py's ``serving``), heartbeating at
    the family's FAST interval, until the block ends; what it raised fails the test."""
    worker = MdpWorker(endpoint, service, dialect, context=ctx, heartbeat_interval_s=0.2)
    with serving(worker, handler):
        yield worker


def mmi(client: MdpClient, service: bytes, *body: bytes) -> list[bytes]:
    return client.request(b"mmi." + service, list(body), WAIT_S)


def offered(client: MdpClient, service: bytes) -> Callable[[], bool]:
    return lambda: mmi(client, b"service", service) == [b"200"]


def test_majordomo_clients_and_workers_reach_each_other_and_s0p_across_brokers(
    tmp_path: Path,
) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with running_brokers(tmp_path, 2, sources=(0,), **FAST) as brokers:
            b1, b2 = brokers
            family_ready(brokers)
            mdp_at_b1 = MdpClient(b1.endpoints["frontend"], MDP01, context=ctx)
            mdp_at_b2 = MdpClient(b2.endpoints["frontend"], MDP01, context=ctx)
            with (
                mdp_worker(b2.endpoints["backend"], b"far", ctx) as far,
                worker_thread(b1.endpoints["backend"], {"s0p": echo_handler}),
                Client(b1.endpoints["frontend"], timeout=WAIT_S) as s0p_client,
            ):
                # The Majordomo worker at b2 is in b2's table at b1 (mmi.service sees it).
                wait_until(offered(mdp_at_b1, b"far"), "b1 knows b2's Majordomo worker")
                # A Majordomo client at b1 -> the Majordomo worker at b2 (forwarded).
                for n in range(20):
                    body = [b"%d" % n, b"", b"x" * 300]
                    assert mdp_at_b1.request(b"far", body, WAIT_S) == [b"mdp:%d" % n, *body[1:]]
                # An S0P client at b1 -> the Majordomo worker at b2: a REPLY 200.
                answers = s0p_client.request_many("far", (b"%d" % n for n in range(20)))
                assert answers == [[b"mdp:%d" % n] for n in range(20)]
                # A Majordomo client at b2 -> the S0P worker at b1.
                wait_until(offered(mdp_at_b2, b"s0p"), "b2 knows b1's S0P worker")
                assert mdp_at_b2.request(b"s0p", [b"hi", b"there"], WAIT_S) == [b"hi", b"there"]
                # mmi.* from the whole family, in 8/MMI's bare codes.
                assert mmi(mdp_at_b2, b"workers", b"far") == [b"1"]
                assert mmi(mdp_at_b2, b"services") == [b"far", b"s0p"]
                assert mmi(mdp_at_b2, b"nothing") == [b"501"]
                assert far.max_held == 1  # a Majordomo worker holds one request at a time
            assert mdp_at_b1.dropped == mdp_at_b2.dropped == 0
            mdp_at_b1.close()
            mdp_at_b2.close()
            b1.stop()
            b2.stop()
            for broker in (b1, b2):
                unsupported = [e for e in broker.logs() if e.get("event") == "unsupported_message"]
                assert unsupported == [], unsupported
    finally:
        ctx.destroy(linger=0)


def test_a_majordomo_worker_that_stops_loses_no_request(tmp_path: Path) -> None:
    """A Majordomo worker that says DISCONNECT mid-run: its request goes to the other worker
    (R8), and the Majordomo client gets every answer once."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with running_brokers(tmp_path, 1, sources=(0,), **FAST) as brokers:
            (b1,) = brokers
            client = MdpClient(b1.endpoints["frontend"], MDP01, context=ctx)
            with mdp_worker(b1.endpoints["backend"], b"echo", ctx) as steady:
                quitter = MdpWorker(
                    b1.endpoints["backend"], b"echo", MDP01, context=ctx, heartbeat_interval_s=0.2
                )
                wait_until(lambda: mmi(client, b"workers", b"echo") == [b"2"], "two workers")
                for n in range(10):
                    client.send(b"echo", [b"%d" % n])
                # The quitter takes at most one request, then leaves without answering it.
                with contextlib.suppress(MdpError):
                    quitter.recv(1.0)
                quitter.close()  # its DISCONNECT: the broker dispatches its request again
                answers = sorted(client.recv(WAIT_S).body[0] for _ in range(10))
                assert answers == sorted(b"mdp:%d" % n for n in range(10))
                assert steady.max_held == 1
            client.close()
    finally:
        ctx.destroy(linger=0)


def partials(worker: MdpWorker, request: Request) -> None:
    worker.partial(request, [b"one"])
    worker.reply(request, [b"end", *request.body])


@pytest.mark.parametrize("dialect", [MDP01, MDP02, MAJORTOMO], ids=lambda d: d.name)
def test_every_reading_of_majordomo_is_answered_in_its_own_framing(
    tmp_path: Path, dialect: Dialect
) -> None:
    """7/MDP, 18/MDP's own framing (no empty frame 0) and majortomo's: tools/mdp.py's client
    and worker of that reading, through one broker; PARTIALs where the version has them."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with running_brokers(tmp_path, 1, sources=(0,), **FAST) as brokers:
            (b1,) = brokers
            client = MdpClient(b1.endpoints["frontend"], dialect, context=ctx)
            handler = echo if dialect is MDP01 else partials
            with mdp_worker(b1.endpoints["backend"], b"echo", ctx, handler, dialect):
                wait_until(
                    lambda: client.request(b"mmi.service", [b"echo"], WAIT_S)[-1] == b"200",
                    "the worker registered",
                )
                client.send(b"echo", [b"hi"])
                got: list[bytes] = []
                while True:
                    reply = client.recv(WAIT_S)
                    got.extend(reply.body)
                    if reply.final:
                        break
            expected = [b"mdp:hi"] if dialect is MDP01 else [b"one", b"end", b"hi"]
            assert got == expected
            assert client.dropped == 0
            client.close()
    finally:
        ctx.destroy(linger=0)


def test_majortomos_own_client_and_worker_join_unchanged(tmp_path: Path) -> None:
    """The majortomo package (PyPI), an independent MDP/0.2 implementation: its Worker serves
    and its Client asks through a Scale0 broker, with a PARTIAL on the way."""
    with running_brokers(tmp_path, 1, sources=(0,), **FAST) as brokers:
        (b1,) = brokers
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        stop = threading.Event()
        errors: list[BaseException] = []
        worker = majortomo.Worker(
            b1.endpoints["backend"],
            b"upper",
            heartbeat_interval=0.2,
            heartbeat_timeout=5.0,
            zmq_context=ctx,
        )

        def serve() -> None:
            try:
                worker.connect()
                while not stop.is_set():
                    client_id, body = worker.wait_for_request()
                    worker.send_reply_partial(client_id, [b"working"])
                    worker.send_reply_final(client_id, [frame.upper() for frame in body])
            except BaseException as e:
                if not stop.is_set():
                    errors.append(e)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client = majortomo.Client(b1.endpoints["frontend"], zmq_context=ctx)
        client.connect()
        try:
            probe = MdpClient(b1.endpoints["frontend"], MDP01, context=ctx)
            wait_until(
                lambda: probe.request(b"mmi.service", [b"upper"], WAIT_S) == [b"200"],
                "majortomo's worker registered",
            )
            probe.close()
            for word in (b"hello", b"scale0"):
                client.send(b"upper", word, b"x")
                assert client.recv_all_as_list(timeout=WAIT_S) == [b"working", word.upper(), b"X"]
        finally:
            stop.set()
            client.close()
            b1.stop()  # its DISCONNECT ends wait_for_request in the worker thread
            thread.join(WAIT_S)
            ctx.destroy(linger=0)
        assert not thread.is_alive(), "majortomo worker thread did not stop"
        assert not errors, errors
