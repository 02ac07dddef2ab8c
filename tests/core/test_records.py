"""What the core reports for the event log (scale0/core/records.py): one RequestDone per request
answered, by the broker that answered it, and the Log fields the net layer translates."""

from __future__ import annotations

from typing import Any

from scale0.core.effects import Channel, Effect, Log, Received, RequestDone, Send
from scale0.wire.client import Disconnect
from scale0.wire.frames import SIG_WORKER
from scale0.wire.peer import ForwardReply
from scale0.wire.worker import WorkerReply, WorkerRequest
from tests.core.fabric import Fabric, family_config
from tests.core.harness import BACK, Harness, dispatched, only, replies

C1 = b"\x00client1"
W1, W2 = b"\x00w1", b"\x00w2"
ON: dict[str, int] = {}  # any mapping turns the reports on (the node gives its writer's stats)


def done(effects: list[Effect]) -> list[RequestDone]:
    return [e for e in effects if isinstance(e, RequestDone)]


def logs(effects: list[Effect], event: str) -> list[dict[str, Any]]:
    return [e.fields for e in effects if isinstance(e, Log) and e.event == event]


def recording(**network: Any) -> Harness:
    h = Harness(**network)
    h.broker.event_log = ON
    return h


def test_nothing_is_reported_while_the_node_writes_no_event_log() -> None:
    h = Harness()
    h.worker(W1)
    h.client(C1)
    ticket = only(dispatched(h.request(C1, b"r1")))[1].ticket
    assert done(h.reply(W1, ticket)) == []


def test_an_answered_request_is_reported_once_with_what_the_broker_knows() -> None:
    h = recording()
    h.worker(W1)
    h.client(C1)
    started = h.now
    ticket = only(dispatched(h.request(C1, b"r1", body=b"hello")))[1].ticket
    h.now += 0.25
    out = h.reply(W1, ticket, body=b"answer!")
    assert only(done(out)) == RequestDone(
        service="echo",
        worker=W1,
        client=C1,
        forwarded_from=None,
        started=started,
        finished=started + 0.25,
        bytes_in=5,
        bytes_out=7,
        status=200,
        attempts=1,
    )
    # A retry of the same request is answered from the reply cache: not a second request.
    assert done(h.request(C1, b"r1")) == []


def test_the_hot_entry_points_report_the_same() -> None:
    h = recording()
    h.worker(W1)
    h.client(C1)
    out = h.broker.handle_request(C1, "echo", b"r1", (b"hi",), h.now)
    ticket = only(dispatched(out))[1].ticket
    report = only(done(h.broker.handle_reply(W1, ticket, 500, (b"boom",), h.now + 0.1)))
    assert (report.status, report.worker, report.bytes_out, report.attempts) == (500, W1, 4, 1)


def test_a_request_that_waited_in_vain_is_reported_failed_without_a_worker() -> None:
    h = recording()
    h.worker(W1)
    h.client(C1)
    h.request(C1, b"busy")
    h.request(C1, b"waits")  # the only worker is busy: it waits until its deadline (R6)
    out = h.advance(5.1)
    failed = [d for d in done(out) if d.worker is None]
    assert [(d.status, d.attempts, d.bytes_out) for d in failed] == [(503, 0, 0)]
    assert {r.status for _, r in replies(out)} >= {503}


def test_a_request_for_a_service_nobody_offers_is_reported_404() -> None:
    h = recording()
    h.advance(6.0)  # past the startup grace (R7)
    h.client(C1)
    out = h.request(C1, b"r1", service="nosuch", body=b"abc")
    assert only(replies(out))[1].status == 404
    assert only(done(out)) == RequestDone("nosuch", None, C1, None, h.now, h.now, 3, 0, 404, 0)


def test_a_lost_worker_s_request_is_reported_once_after_its_retry() -> None:
    h = recording()
    h.worker(W1)
    h.worker(W2)
    h.client(C1)
    first = only(dispatched(h.request(C1, b"r1")))
    lost = h.send(BACK, first[0], Disconnect(protocol=SIG_WORKER))
    assert done(lost) == []  # dispatched again (R8), not finished
    retry = only(dispatched(lost))
    report = only(done(h.reply(retry[0], retry[1].ticket)))
    assert report.attempts == 2 and report.worker == retry[0]


def test_worker_lost_and_heartbeat_gap_logs_carry_the_silence() -> None:
    h = Harness()
    h.worker(W1, interval_ms=1000)
    h.advance(2.5)  # silent 2.5 intervals, under liveness (3): a gap, not a loss
    gap = only(logs(h.heartbeat(BACK, W1), "heartbeat_gap"))
    assert gap == {"worker": W1.hex(), "gap_ms": 2500}
    assert logs(h.heartbeat(BACK, W1), "heartbeat_gap") == []  # heard at once: no gap
    lost = only(logs(h.advance(3.2), "worker_lost"))
    assert lost["reason"] == "expired" and lost["silent_ms"] >= 3000


def test_a_forwarded_request_is_reported_by_the_broker_whose_worker_ran_it() -> None:
    fabric = Fabric(family_config())
    for broker in fabric.brokers.values():
        broker.event_log = ON
    fabric.start()
    fabric.advance(1.0)
    fabric.worker("c", W1)
    fabric.advance(1.1)
    fabric.client("a", C1)
    fabric.request("a", C1, b"r1")  # a has no worker: forwarded to c (F6)
    assert fabric.serve("c") == 1
    assert [r.status for _, r in fabric.replies("a")] == [200]
    assert done(fabric.effects["a"]) == []  # the entry broker records nothing
    report = only(done(fabric.effects["c"]))
    assert report.forwarded_from == "a" and report.client is None and report.worker == W1


def test_a_forwarded_request_refused_404_is_left_to_its_origin() -> None:
    fabric = Fabric(family_config())
    for broker in fabric.brokers.values():
        broker.event_log = ON
    fabric.start()
    fabric.advance(1.0)
    fabric.worker("c", W1)
    fabric.advance(1.1)
    fabric.client("a", C1)
    # c's worker leaves; a forwards before c's next table says so; c answers 404 (F7, F8).
    fabric.drops.append(lambda src, dst, m: True)
    fabric.feed("c", Received(Channel.BACKEND, W1, Disconnect(protocol=SIG_WORKER)))
    fabric.settle()
    fabric.drops.clear()
    fabric.request("a", C1, b"r1")
    refusals = [
        e.message
        for e in fabric.effects["c"]
        if isinstance(e, Send) and isinstance(e.message, ForwardReply)
    ]
    assert [m.status for m in refusals] == [404]
    assert done(fabric.effects["c"]) == []
    fabric.worker("a", W2)  # the request routed again at a waits there for a worker (F8)
    (rid, message) = only(fabric.take("a", WorkerRequest))
    fabric.feed("a", Received(Channel.BACKEND, rid, WorkerReply(message.ticket, 200, (b"x",))))
    fabric.settle()
    report = only(done(fabric.effects["a"]))
    assert report.forwarded_from is None and report.worker == W2 and report.attempts == 2
