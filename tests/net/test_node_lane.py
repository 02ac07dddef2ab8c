"""A broker with ``lane: true`` (scale0/net/lane.py) on real loopback sockets: what the C lane
takes never reaches the loop, yet the core's sessions stay as true as without it.

The rest of tests/net's broker modules run over both I/Os (conftest.py ``broker_io``); these
tests are about the lane itself, so they need it built (tools/test-fallback has no extension).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from scale0.core.effects import Channel
from scale0.mgmt.metrics import render_metrics
from scale0.net.lane import LANE_BUILT
from scale0.wire import (
    SIG_CLIENT,
    ClientReply,
    ClientRequest,
    Disconnect,
    DisconnectError,
    Heartbeat,
    Message,
    WorkerReply,
    WorkerRequest,
)
from scale0.wire.mdp import (
    MDPC01,
    MDPC02,
    MDPW01,
    MDPW02,
    MdpClientReply,
    MdpClientRequest,
    MdpWorkerReady,
    MdpWorkerReply,
    MdpWorkerRequest,
)
from scale0.wire.registry import decode_from_broker
from scale0.wire.worker import WorkerIdRequest
from tests.net import s0p
from tests.net.test_eventlog import records
from tests.net.test_node import WAIT_S, NodeThread, _network, _signature, ctx, signing

__all__ = ["ctx", "signing"]  # (fixtures, used by name)

pytestmark = pytest.mark.skipif(
    not LANE_BUILT, reason="the lane is C (scale0.net._zmqio.Lane): not built here"
)


@pytest.fixture
def laned(signing: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[NodeThread]:
    monkeypatch.delenv("SCALE0_LANE", raising=False)
    network = _network()
    thread = NodeThread(network, _signature(signing[0], network), lane=True)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def _stats(thread: NodeThread) -> dict[str, int]:
    assert thread.node is not None
    stats: dict[str, int] = thread.call(thread.node.stats)
    return stats


def _until(thread: NodeThread, what: str, ok: Any) -> dict[str, int]:
    """The node's stats once ``ok(stats)`` holds; fails after WAIT_S (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while not ok(stats := _stats(thread)):
        assert time.monotonic() < deadline, f"{what}: {stats}"
        time.sleep(0.01)
    return stats


def _beat(version: int = 1, skew: float = 0.0) -> Heartbeat:
    return Heartbeat(time=time.time() + skew, config_version=version, protocol=SIG_CLIENT)


def test_broker_ready_says_the_lane_runs_and_scale0_lane_0_turns_it_off(
    signing: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scale0")
    network = _network()
    for forced, want in ((None, "c"), ("0", "off")):
        if forced is None:
            monkeypatch.delenv("SCALE0_LANE", raising=False)
        else:
            monkeypatch.setenv("SCALE0_LANE", forced)
        caplog.clear()
        thread = NodeThread(network, _signature(signing[0], network), lane=True)
        thread.start()
        thread.stop()
        ready = [r for r in caplog.records if getattr(r, "s0_event", None) == "broker_ready"]
        assert [r.s0_fields["lane"] for r in ready] == [want]  # type: ignore[attr-defined]


def test_a_clients_plain_heartbeats_are_answered_by_the_lane_and_keep_its_session(
    laned: NodeThread, ctx: zmq.Context[Any]
) -> None:
    """Network defaults: a 1 s interval, liveness 3. The client beats for 4 s, past its
    timeout; the loop reads at most its first (its CHECKCONFIG may still be the loop's:
    "Order") and the core still holds its session, heard through the lane. (Requests: the
    test below.)"""
    with s0p.client(ctx, laned.endpoint(Channel.FRONTEND)) as client:
        client.send(_beat())
        client.recv(Heartbeat, heartbeats=True)  # the loop's: R20 marks the connection then
        before = _stats(laned)
        beats = 0
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            client.send(_beat())
            answer = client.recv(Heartbeat, heartbeats=True)
            assert answer.config_version == laned.network.config_version
            assert abs(answer.time - time.time()) < 5.0
            beats += 1
            time.sleep(0.2)
        after = _until(laned, "the lane's count", lambda s: s["lane_beats"] >= beats)
        assert after["net_received"] == before["net_received"]  # none reached the loop
        assert after["clients"] == 1  # not expired: the core heard them through the lane
        # status and /metrics say what the lane did (docs/protocol.md, docs/management.md)
        node = laned.node
        assert node is not None
        status = laned.call(
            lambda: node.with_core(lambda broker: broker.status(time.monotonic(), time.time()))
        )
        assert status["lane"]["beats"] >= beats and status["lane"]["answers"] >= beats
        text = render_metrics(status)
        taken = [
            line
            for line in text.splitlines()
            if "scale0_lane_messages_total{" in line and 'outcome="taken"' in line
        ]
        assert len(taken) == 1 and int(float(taken[0].rsplit(" ", 1)[1])) >= beats


def test_without_the_lane_status_says_null_and_metrics_say_nothing(
    signing: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCALE0_LANE", "0")
    network = _network()
    thread = NodeThread(network, _signature(signing[0], network), lane=True)
    node = thread.start()
    try:
        status = thread.call(lambda: node.broker.status(time.monotonic(), time.time()))
    finally:
        thread.stop()
    assert status["lane"] is None
    assert "scale0_lane" not in render_metrics(status)


def test_a_skewed_or_stale_heartbeat_goes_to_the_loop_and_gets_its_rule(
    laned: NodeThread, ctx: zmq.Context[Any]
) -> None:
    with s0p.client(ctx, laned.endpoint(Channel.FRONTEND)) as client:
        client.send(_beat())
        client.recv(Heartbeat, heartbeats=True)
        _until(laned, "negotiated", lambda s: s["clients"] == 1)
        client.send(_beat(skew=3600.0))  # R12: 412 and the session ends
        error = client.recv(DisconnectError)
        assert error.code == 412
        _until(laned, "the session ended", lambda s: s["clients"] == 0)


def test_requests_and_replies_go_through_the_lane_and_stop_says_disconnect(
    laned: NodeThread, ctx: zmq.Context[Any]
) -> None:
    """A negotiated S0P client's requests to an S0P worker are the lane's (phase 3b), and
    the core's DISCONNECTs at stop still go out through it."""
    frontend, backend = laned.endpoint(Channel.FRONTEND), laned.endpoint(Channel.BACKEND)
    with (
        s0p.worker(ctx, backend, ("echo",)) as worker,
        s0p.client(ctx, frontend) as client,
    ):
        for n in range(20):
            client.send(ClientRequest("echo", b"r%d" % n, (b"ping", b"%d" % n)))
            request = worker.recv(WorkerRequest)
            worker.send(WorkerReply(request.ticket, 200, request.body))
            reply = client.recv(ClientReply)
            assert (reply.request_id, reply.body) == (b"r%d" % n, (b"ping", b"%d" % n))
        stats = _until(laned, "the lane's counts told", lambda s: s["replies"] == 20)
        assert stats["lane_requests"] == stats["lane_replies"] == stats["requests"] == 20
        assert stats["lane_send_dropped"] == 0
        laned.stop()  # the core's DISCONNECTs go out through the lane before it stops
        assert isinstance(client.recv(Disconnect, timeout_s=WAIT_S), Disconnect)


#: Majordomo worker readings, each its own service: (frame head, READY, HEARTBEAT, reply).
MDP_READINGS = {
    "mdp-w01": ([b"", MDPW01], b"\x01", b"\x04", b"\x03"),
    "mdp-w02": ([b"", MDPW02], b"\x01", b"\x05", b"\x04"),  # majortomo's worker too
    "mdp-w02-bare": ([MDPW02], b"\x01", b"\x05", b"\x04"),  # 18/MDP's text: no frame 0
}


def test_majordomo_workers_plain_heartbeats_are_taken_by_the_lane_and_keep_their_sessions(
    laned: NodeThread, ctx: zmq.Context[Any]
) -> None:
    """Three Majordomo workers, one per reading, with raw frames. After READY (the loop's: it
    opens their sessions and negotiates their connections) every HEARTBEAT of theirs is the
    lane's: counted in lane_beats, none reaching the loop, and beating past liveness x interval
    (network defaults: 1 s, 3) keeps them; each still serves a request."""
    workers: dict[str, zmq.Socket[Any]] = {}
    try:
        for service, (head, ready, _beat_cmd, _reply) in MDP_READINGS.items():
            dealer = ctx.socket(zmq.DEALER)
            dealer.linger = 0
            dealer.connect(laned.endpoint(Channel.BACKEND))
            dealer.send_multipart([*head, ready, service.encode()])
            workers[service] = dealer
        _until(laned, "the workers' sessions", lambda s: s["workers"] == 3)

        def beat(service: str) -> None:
            head, _ready, beat_cmd, _reply = MDP_READINGS[service]
            workers[service].send_multipart([*head, beat_cmd])

        # Each worker's first beats may meet its READY still in the loop's hands ("Order"):
        # beat until one is the lane's. Every beat is counted one way or the other.
        for service in MDP_READINGS:
            deadline = time.monotonic() + WAIT_S
            while True:
                assert time.monotonic() < deadline, f"{service}: no beat taken by the lane"
                before = _stats(laned)
                beat(service)
                after = _until(
                    laned,
                    "the beat counted",
                    lambda s, b=before: (
                        s["lane_beats"] + s["net_received"] > b["lane_beats"] + b["net_received"]
                    ),
                )
                if after["lane_beats"] > before["lane_beats"]:
                    break
        before = _stats(laned)
        rounds = 0
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            for service in MDP_READINGS:
                beat(service)
            rounds += 1
            time.sleep(0.2)
        want = before["lane_beats"] + 3 * rounds
        after = _until(laned, "the lane's count", lambda s: s["lane_beats"] >= want)
        assert after["lane_beats"] == want
        assert after["net_received"] == before["net_received"]  # none reached the loop
        assert after["workers"] == 3  # not expired: the core heard them through the lane
        with s0p.client(ctx, laned.endpoint(Channel.FRONTEND)) as client:
            for n, (service, (head, _ready, _beat_cmd, reply)) in enumerate(MDP_READINGS.items()):
                client.send(ClientRequest(service, b"q%d" % n, (b"ping",)))
                dealer = workers[service]
                while True:  # past the broker's HEARTBEATs to it
                    assert dealer.poll(WAIT_S * 1000), f"{service}: no REQUEST"
                    frames = dealer.recv_multipart()
                    assert frames[: len(head)] == head
                    if frames[len(head)] == b"\x02":
                        break
                ticket, empty, *body = frames[len(head) + 1 :]
                assert empty == b"" and body == [b"ping"]
                dealer.send_multipart([*head, reply, ticket, b"", b"pong", service.encode()])
                answer = client.recv(ClientReply)
                assert (answer.request_id, answer.body) == (
                    b"q%d" % n,
                    (b"pong", service.encode()),
                )
    finally:
        for dealer in workers.values():
            dealer.close(0)


def _mdp_client(ctx: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(endpoint)
    return dealer


def test_majordomo_requests_are_dispatched_queued_and_answered_by_the_lane(
    laned: NodeThread, ctx: zmq.Context[Any]
) -> None:
    """Phase 3b: two Majordomo clients keep 20 requests each outstanding against two
    Majordomo workers (18/MDP and 7/MDP). After the clients' first requests (which open their
    sessions in the core) the lane takes, queues, dispatches and answers them without the
    loop; the core still counts and measures every one (status and /metrics), and every
    answer is the request's own, in the reading its client spoke."""
    frontend, backend = laned.endpoint(Channel.FRONTEND), laned.endpoint(Channel.BACKEND)
    readings = ((MDPW02, True), (MDPW01, True))
    workers = [_mdp_client(ctx, backend) for _ in readings]
    clients = [_mdp_client(ctx, frontend) for _ in range(2)]
    try:
        for dealer, (protocol, delimited) in zip(workers, readings, strict=True):
            ready = MdpWorkerReady("echo", protocol=protocol, delimited=delimited)
            dealer.send_multipart(ready.to_frames())
        _until(laned, "the workers' sessions", lambda s: s["workers"] == 2)
        client_readings = ((MDPC02, True), (MDPC01, True))
        sent = {0: 0, 1: 0}
        total = 400

        def ask(index: int) -> None:
            protocol, delimited = client_readings[index]
            body = (b"%d" % index, b"%d" % sent[index])
            request = MdpClientRequest("echo", body, protocol=protocol, delimited=delimited)
            clients[index].send_multipart(request.to_frames())
            sent[index] += 1

        for index in (0, 1):
            for _ in range(20):
                ask(index)
        answered = {0: 0, 1: 0}
        poller = zmq.Poller()
        for sock in (*workers, *clients):
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + 4 * WAIT_S
        while sum(answered.values()) < total:
            assert time.monotonic() < deadline, f"answered {answered} of {total}"
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                if sock in workers:
                    protocol, delimited = readings[workers.index(sock)]
                    message = decode_from_broker(
                        frames, signature=protocol, max_frame_bytes=1 << 20
                    )
                    if isinstance(message, MdpWorkerRequest):
                        reply = MdpWorkerReply(
                            message.ticket, message.body, protocol=protocol, delimited=delimited
                        )
                        sock.send_multipart(reply.to_frames())
                    continue
                index = clients.index(sock)
                protocol, delimited = client_readings[index]
                reply = decode_from_broker(frames, signature=protocol, max_frame_bytes=1 << 20)
                assert isinstance(reply, MdpClientReply) and reply.protocol == protocol
                assert reply.body[0] == b"%d" % index  # its own request's answer
                answered[index] += 1
                if sent[index] < total // 2:
                    ask(index)
        stats = _until(laned, "the lane drained", lambda s: s["replies"] == total)
        assert stats["requests"] == total and stats["in_flight"] == 0 and stats["queued"] == 0
        assert stats["lane_replies"] >= total - 40  # all but the first window's, at most
        assert stats["lane_queued"] > 0
        node = laned.node
        assert node is not None
        status = laned.call(
            lambda: node.with_core(lambda broker: broker.status(time.monotonic(), time.time()))
        )
        echo = laned.call(lambda: node.broker.core.metrics.services["echo"])
        assert echo.replies == {200: total} and echo.latency.count == total
        lane = status["lane"]
        assert isinstance(lane, dict) and lane["requests"] >= total - 40
        text = render_metrics(status).splitlines()
        (answered,) = [
            line
            for line in text
            if line.startswith("scale0_lane_requests_total{") and 'outcome="answered"' in line
        ]
        (waiting,) = [line for line in text if line.startswith("scale0_lane_waiting")]
        assert float(answered.rsplit(" ", 1)[1]) == lane["replies"]
        assert float(waiting.rsplit(" ", 1)[1]) == 0
    finally:
        for sock in (*workers, *clients):
            sock.close(0)


def test_s0p_requests_are_dispatched_queued_answered_and_cached_by_the_lane(
    laned: NodeThread, ctx: zmq.Context[Any]
) -> None:
    """Phase 3b, S0P: two clients keep 20 requests each outstanding against two S0P workers,
    one that asked for request ids (IDREQUEST) and one that did not. The clients negotiated,
    so the lane takes their requests from the first: it queues, dispatches and answers them
    without the loop and puts every answer in the reply cache; the core counts and measures
    every one, per status (the workers answer every tenth with 500). Then every tenth request
    is asked again: the core answers each from the cache the lane filled, with the worker's
    own status and body, and no worker runs it again."""
    frontend, backend = laned.endpoint(Channel.FRONTEND), laned.endpoint(Channel.BACKEND)
    workers = [
        s0p.worker(ctx, backend, ("echo",), request_ids=True),
        s0p.worker(ctx, backend, ("echo",)),
    ]
    clients = [s0p.client(ctx, frontend) for _ in range(2)]
    total = 400
    try:
        _until(laned, "the workers' sessions", lambda s: s["workers"] == 2)
        sent = {0: 0, 1: 0}

        def ask(index: int) -> None:
            request_id = b"c%d.%d" % (index, sent[index])
            clients[index].send(ClientRequest("echo", request_id, (request_id,)))
            sent[index] += 1

        for index in (0, 1):
            for _ in range(20):
                ask(index)
        answers: dict[bytes, ClientReply] = {}
        kinds: set[str] = set()
        poller = zmq.Poller()
        for dealer in (*workers, *clients):
            poller.register(dealer.socket, zmq.POLLIN)
        deadline = time.monotonic() + 4 * WAIT_S
        while len(answers) < total:
            assert time.monotonic() < deadline, f"answered {len(answers)} of {total}"
            for sock, _ in poller.poll(100):
                dealer = next(d for d in (*workers, *clients) if d.socket is sock)
                message = dealer.recv(Message)
                if isinstance(message, WorkerRequest | WorkerIdRequest):
                    kinds.add(type(message).__name__)
                    (request_id,) = message.body
                    if isinstance(message, WorkerIdRequest):  # the client's own ids
                        assert message.request_id == request_id
                    status = 500 if int(request_id.rsplit(b".", 1)[1]) % 10 == 0 else 200
                    dealer.send(WorkerReply(message.ticket, status, (b"done", request_id)))
                elif isinstance(message, ClientReply):
                    index = clients.index(dealer)
                    assert message.body == (b"done", message.request_id)  # its own answer
                    assert message.request_id.startswith(b"c%d." % index)
                    answers[message.request_id] = message
                    if sent[index] < total // 2:
                        ask(index)
        stats = _until(laned, "the lane drained", lambda s: s["replies"] == total)
        assert stats["requests"] == total and stats["in_flight"] == 0 and stats["queued"] == 0
        assert stats["lane_replies"] >= total - 40  # all but the first window's, at most
        assert kinds == {"WorkerRequest", "WorkerIdRequest"}
        node = laned.node
        assert node is not None
        echo = laned.call(lambda: node.broker.core.metrics.services["echo"])
        assert echo.replies == {200: total - total // 10, 500: total // 10}
        assert stats["reply_cache"] == total
        # The resends: answered from the cache, the worker's status and body, no worker asked
        for request_id in sorted(answers)[::10]:
            index = int(request_id[1:2])
            clients[index].send(ClientRequest("echo", request_id, (request_id,)))
            again = clients[index].recv(ClientReply)
            assert again == answers[request_id]
        for dealer in workers:  # (the broker's HEARTBEATs at most)
            while (frames := dealer.recv_frames(timeout_s=0.2)) is not None:
                assert frames[2] == b"HEARTBEAT", frames
        stats = _stats(laned)
        assert stats["cache_hits"] == total // 10
        assert stats["requests"] == total + total // 10 and stats["replies"] == total
    finally:
        for dealer in (*workers, *clients):
            dealer.close()


def test_with_the_event_log_on_the_lane_serves_and_every_request_is_recorded(
    signing: tuple[Path, Path], ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    """With an event log the lane still takes requests (its done ring): 200 S0P requests, a
    window of 10, all but the first window the lane's; after the stop every request has one
    ``request`` record with the worker's status, as the core writes them (docs/trend.md)."""
    network = _network()
    thread = NodeThread(network, _signature(signing[0], network), events=tmp_path, lane=True)
    thread.start()
    total, window = 200, 10
    try:
        with (
            s0p.worker(ctx, thread.endpoint(Channel.BACKEND), ("echo",)) as worker,
            s0p.client(ctx, thread.endpoint(Channel.FRONTEND)) as client,
        ):
            _until(thread, "the worker's session", lambda s: s["workers"] == 1)
            sent = answered = 0
            while sent < window:
                client.send(ClientRequest("echo", b"e%d" % sent, (b"x" * 7,)))
                sent += 1
            while answered < total:
                request = worker.recv(WorkerRequest)
                status = 500 if request.ticket[-1] % 5 == 0 else 200
                worker.send(WorkerReply(request.ticket, status, (b"y" * 11,)))
                reply = client.recv(ClientReply)
                assert reply.body == (b"y" * 11,)
                answered += 1
                if sent < total:
                    client.send(ClientRequest("echo", b"e%d" % sent, (b"x" * 7,)))
                    sent += 1
            stats = _until(thread, "the lane's counts", lambda s: s["replies"] == total)
            assert stats["lane_replies"] >= total - window
            assert stats["lane_done"] == stats["lane_replies"] and stats["lane_done_full"] == 0
            node = thread.node
            assert node is not None
            counted = thread.call(lambda: dict(node.broker.core.metrics.services["echo"].replies))
    finally:
        thread.stop()
    requests = [r for r in records(tmp_path) if r["kind"] == "request"]
    assert len(requests) == total
    assert all(r["bytes_in"] == 7 and r["bytes_out"] == 11 for r in requests)
    by_status = {s: sum(1 for r in requests if r["status"] == s) for s in (200, 500)}
    assert by_status == counted and set(counted) == {200, 500}  # the records are the answers
