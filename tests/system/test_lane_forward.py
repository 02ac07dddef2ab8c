"""A family of two real brokers, every request forwarded (docs/architecture.md "Phase 4a",
"Phase 4b"): the origin's C lane forwards the client's requests and answers the peer's
FORWARDREPLYs, the serving broker's takes the FORWARDs and answers FORWARDREPLY itself.

The client is at b1, the only worker (tools/echo_worker.py, capacity 4) at b2, so b1 forwards
every request (F6) and b2 runs them. After the run b2's ``broker_stopped`` says how many
FORWARDs it served (``forwards_served``, the core's count, the lane's included) and how many
its lane took (``lane_forwards``): nearly all, once b1 knows b2's table and the worker is
ready. Every answer is the worker's own echo of its request, and b2's event log has one
``request`` record per FORWARD, the lane's written as the core writes its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from scale0.net.client import Client
from scale0.net.errors import ServiceNotFound
from scale0.net.lane import LANE_BUILT
from scale0.testing import running_brokers, wait_until
from tests.net.test_eventlog import records
from tests.system.test_limits import broker_stats, running_echo_worker

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not LANE_BUILT, reason="the lane is C: not built here"),
]

FAST = {"default_heartbeat_interval_ms": 200, "liveness": 5, "request_timeout_ms": 20_000}
REQUESTS = 300


def reaches_the_worker(client: Client) -> bool:
    """One request through b1: False while b1 knows of no worker of ``echo`` (404 at b1:
    it reaches no broker)."""
    try:
        return client.request("echo", [b"probe"]) == [b"probe"]
    except ServiceNotFound:
        return False


def test_the_serving_brokers_lane_answers_the_forwards(tmp_path: Path) -> None:
    with running_brokers(tmp_path, 2, **FAST) as (b1, b2), running_echo_worker(b2):
        client = Client(b1.endpoints["frontend"], client_id="alice", timeout=30.0)
        try:
            wait_until(lambda: reaches_the_worker(client), "b1 forwards to b2's worker")
            for i in range(REQUESTS):
                body = b"body-%d" % i
                assert client.request("echo", [body]) == [body]
        finally:
            client.close()
        stats = broker_stats(b2)
        origin = broker_stats(b1)
        events = records(b2.broker_file.parent / "events")
    assert stats["forwards_served"] == REQUESTS + 1  # (and the probe that got through)
    assert stats["lane_forwards"] >= REQUESTS - 10, stats  # (the first, while b2 starts)
    assert stats["lane_forwards"] <= stats["forwards_served"]
    # and b1's lane forwarded them and answered b2's FORWARDREPLYs (phase 4b)
    assert origin["forwarded"] == REQUESTS + 1 and origin["replies"] == REQUESTS + 1
    assert origin["lane_forwarded"] >= REQUESTS - 10, origin
    # b2 writes each one's `request` record, the lane's as the core's: forwarded from b1, no
    # client of b2's (docs/trend.md)
    requests = [r for r in events if r["kind"] == "request"]
    assert len(requests) == REQUESTS + 1
    assert {(r["forwarded_from"], r["status"], r["attempts"]) for r in requests} == {("b1", 200, 1)}
    assert not any("client" in r for r in requests)
    assert sorted(r["bytes_in"] for r in requests)[:2] == [5, 6]  # b"probe", b"body-0"
