"""Limits that hold under abuse (R20, R22, docs/protocol.md §8.1), on real scale0-broker
processes: 10 000 connections that never negotiate, and honest clients still served; thousands
that never say HELLO on a family member's peer port, and the family still routing.

Half the flood completes the ZMTP handshake as a DEALER would (greeting and READY) and then says
nothing; the other half connects and sends nothing at all. The broker must hang every one up
(past max_unnegotiated at once, the rest after negotiate_timeout_ms), keep its memory bounded
(VmRSS from /proc, sampled throughout) and answer an honest client the whole time.
"""

from __future__ import annotations

import contextlib
import errno
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from scale0.net.client import Client
from scale0.testing import BrokerProcess, running_broker, running_brokers
from scale0.wire.peer import BrokerState, Hello, TableMode
from scale0.wire.registry import encode

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
FLOOD = 10_000
WAVE = 500  # connections opened between two honest requests
MAX_UNNEGOTIATED = 256
NEGOTIATE_TIMEOUT_MS = 3_000
#: Bounds of the test's own waits (not timings asserted).
CLOSE_WAIT_S = 60.0
#: The broker's RSS may grow this much over its start while the flood lasts. Measured: about
#: +13 MB with the limits, +128 MB with them off (max_unnegotiated 100 000, a 600 s timeout:
#: 10 000 libzmq connections' engine buffers and pipes), so the bound tells the two apart.
RSS_GROWTH_LIMIT_KB = 48 * 1024

# ZMTP 3.0 (rfc.zeromq.org spec 23): a greeting, then a READY command naming a DEALER.
GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
_READY_BODY = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
READY = b"\x04" + bytes([len(_READY_BODY)]) + _READY_BODY


def raise_open_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return
    if hard != resource.RLIM_INFINITY and hard < wanted:
        with contextlib.suppress(ValueError, OSError):  # root may raise the hard limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(
        tmp_path,
        max_unnegotiated=MAX_UNNEGOTIATED,
        negotiate_timeout_ms=NEGOTIATE_TIMEOUT_MS,
    ) as started:
        yield started


@pytest.fixture
def echo_worker(broker: BrokerProcess) -> Iterator[subprocess.Popen[bytes]]:
    with running_echo_worker(broker) as process:
        yield process


@contextlib.contextmanager
def running_echo_worker(broker: BrokerProcess) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "echo_worker.py"), broker.endpoints["backend"]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def open_connection(host: str, port: int, greet: bool) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    if greet:
        sock.sendall(GREETING + READY)
    sock.setblocking(False)
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the broker ended this connection (EOF or reset); anything it sent is read."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError as exc:
        return exc.errno in (errno.ECONNRESET, errno.EPIPE)


def flood_while_serving(
    flood: list[socket.socket],
    address: tuple[str, int],
    total: int,
    wave: int,
    watched: BrokerProcess,
    client: Client,
) -> tuple[int, int, list[socket.socket]]:
    """Open ``total`` raw connections to ``address`` (into ``flood``, which the caller closes),
    ``wave`` between two echo requests that must be answered, then wait (bounded) for the
    broker to hang them all up, still asking. Returns ``watched``'s peak RSS in kB, the
    requests served, and the connections still open at the end."""
    peak_kb = watched.rss_kb()
    served = 0
    for number in range(total // wave):
        for i in range(wave):
            flood.append(open_connection(*address, greet=i % 2 == 0))
        body = b"served during wave %d" % number
        assert client.request("echo", [body]) == [body]
        served += 1
        peak_kb = max(peak_kb, watched.rss_kb())
    open_ones = list(flood)
    deadline = time.monotonic() + CLOSE_WAIT_S  # bounded; the count is what is asserted
    while open_ones and time.monotonic() < deadline:
        time.sleep(0.2)
        open_ones = [s for s in open_ones if not closed_by_peer(s)]
        peak_kb = max(peak_kb, watched.rss_kb())
        assert client.request("echo", [b"still"]) == [b"still"]
        served += 1
    return peak_kb, served, open_ones


def test_ten_thousand_connections_that_never_negotiate(
    broker: BrokerProcess, echo_worker: subprocess.Popen[bytes]
) -> None:
    raise_open_files(FLOOD + 1024)
    host, port = broker.endpoints["frontend"].removeprefix("tcp://").rsplit(":", 1)
    with Client(broker.endpoints["frontend"], timeout=10) as client:
        assert client.request("echo", [b"warm"]) == [b"warm"]
        for i in range(50):  # what serving honest clients costs, before the flood
            assert client.request("echo", [b"%d" % i]) == [b"%d" % i]
        baseline_kb = broker.rss_kb()
        flood: list[socket.socket] = []
        try:
            # Every flooding connection is hung up: at once past max_unnegotiated, the rest
            # after negotiate_timeout_ms.
            peak_kb, served, open_ones = flood_while_serving(
                flood, (host, int(port)), FLOOD, WAVE, broker, client
            )
            growth_kb = peak_kb - baseline_kb
            print(
                f"\nflood {FLOOD}: broker RSS {baseline_kb} kB before, peak {peak_kb} kB "
                f"(+{growth_kb} kB), {served} honest requests served during it, "
                f"{len(open_ones)} flooding connections left open"
            )
            assert open_ones == [], f"{len(open_ones)} of {FLOOD} connections still open"
        finally:
            for sock in flood:
                sock.close()
        assert growth_kb < RSS_GROWTH_LIMIT_KB
        # The broker still negotiates and serves a new client.
        with Client(broker.endpoints["frontend"], timeout=10) as late:
            assert late.request("echo", [b"after"]) == [b"after"]
    stats = broker_stats(broker)
    hung_up = stats.get("unnegotiated_over_limit", 0) + stats.get("unnegotiated_timeout", 0)
    assert hung_up >= FLOOD, stats
    assert stats["net_hung_up"] >= FLOOD


def broker_stats(broker: BrokerProcess) -> dict[str, int]:
    broker.stop()
    for line in broker.logs():
        if line.get("event") == "broker_stopped":
            stats: dict[str, int] = line["stats"]
            return stats
    raise AssertionError("no broker_stopped line:\n" + broker.stderr())


# ---- the peer port (R22) ------------------------------------------------------------------------

PEER_FLOOD = 4_000
PEER_WAVE = 500
#: Strangers that say a HELLO the broker refuses (401), each from a new connection: past
#: error_threshold (20) their address, 127.0.0.1, is banned, the address the other member
#: (b2, on the same host) links from too.
REFUSED_HELLOS = 40


def refused_hellos(context: zmq.Context[zmq.Socket[bytes]], endpoint: str, count: int) -> int:
    """``count`` DEALERs each say a HELLO of another family on its own connection; returns
    how many got DISCONNECTERROR 401 back (the rest got 429 once, or nothing while banned)."""
    hello = Hello("intruder", "other", BrokerState.ACTIVE, 0, {}, TableMode.PULL)
    frames = encode(hello)
    answered = 0
    for _ in range(count):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            sock.send_multipart(frames)
            if sock.poll(2000):
                reply = sock.recv_multipart()
                answered += b"401" in reply[-1] or b'"code":401' in reply[-1]
        finally:
            sock.close(linger=0)
    return answered


def test_thousands_of_peer_connections_that_never_say_hello(tmp_path: Path) -> None:
    """b1's peer port is flooded (silent TCP, silent ZMTP, refused HELLOs); b1's clients are
    served by b2's worker through the family all along, and b1's memory stays bounded."""
    raise_open_files(PEER_FLOOD + 1024)
    with running_brokers(
        tmp_path, 2, max_unnegotiated=MAX_UNNEGOTIATED, negotiate_timeout_ms=NEGOTIATE_TIMEOUT_MS
    ) as (b1, b2):
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        flood: list[socket.socket] = []
        try:
            with running_echo_worker(b2), Client(b1.endpoints["frontend"], timeout=15) as client:
                # b1 has no worker: every answer below came through b2 (FORWARD, §5.4).
                assert client.request("echo", [b"warm"]) == [b"warm"]
                for i in range(50):
                    assert client.request("echo", [b"%d" % i]) == [b"%d" % i]
                baseline_kb = b1.rss_kb()
                host, port = b1.endpoints["peer"].removeprefix("tcp://").rsplit(":", 1)
                # Strangers' HELLOs first: refused (401) until their address is banned.
                answered = refused_hellos(context, b1.endpoints["peer"], REFUSED_HELLOS)
                peak_kb, served, open_ones = flood_while_serving(  # the family routes
                    flood, (host, int(port)), PEER_FLOOD, PEER_WAVE, b1, client
                )
                growth_kb = peak_kb - baseline_kb
                print(
                    f"\npeer flood {PEER_FLOOD}: b1 RSS {baseline_kb} kB before, peak {peak_kb} "
                    f"kB (+{growth_kb} kB), {served} requests served through b2 during it, "
                    f"{answered} of {REFUSED_HELLOS} refused HELLOs answered 401, "
                    f"{len(open_ones)} flooding connections left open"
                )
                assert open_ones == [], f"{len(open_ones)} of {PEER_FLOOD} still open"
                assert growth_kb < RSS_GROWTH_LIMIT_KB
                # Scored by address: the ban came within the threshold, not after every try.
                assert 0 < answered <= 20
                # The banned address is b2's too: b2's link was never cut, and the family
                # still routes both ways after the flood.
                assert client.request("echo", [b"after"]) == [b"after"]
                with Client(b2.endpoints["frontend"], timeout=15) as other:
                    assert other.request("echo", [b"b2"]) == [b"b2"]
        finally:
            for sock in flood:
                sock.close()
            context.destroy(linger=0)
        b1_logs = _stopped(b1)
        b2_logs = _stopped(b2)
    stats = _stats(b1_logs)
    hung_up = sum(stats.get(k, 0) for k in ("unnegotiated_over_limit", "unnegotiated_timeout"))
    # Every flooding connection was hung up by b1; none of b2's links (hangups beyond the
    # strangers' connections would be).
    assert PEER_FLOOD <= hung_up <= PEER_FLOOD + REFUSED_HELLOS, stats
    assert stats["banned"] >= 1, stats
    banned = [line for line in b1_logs if line.get("event") == "peer_address_banned"]
    assert banned and banned[0]["address"] == "127.0.0.1"
    # (peer_lost lines depend on scheduling on a loaded machine: shown, not asserted.)
    lost = [line for line in b1_logs + b2_logs if line.get("event") == "peer_lost"]
    print(f"peer_lost lines during the run: {len(lost)}")


def _stopped(broker: BrokerProcess) -> list[dict[str, object]]:
    broker.stop()
    return broker.logs()


def _stats(logs: list[dict[str, object]]) -> dict[str, int]:
    for line in logs:
        if line.get("event") == "broker_stopped":
            stats: dict[str, int] = line["stats"]  # type: ignore[assignment]
            return stats
    raise AssertionError("no broker_stopped line")
