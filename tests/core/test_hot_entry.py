"""The lean entry points (handle_request, handle_reply) decide exactly as handle(Received(...))."""

from __future__ import annotations

from scale0.core.effects import Effect
from scale0.wire.client import ClientRequest
from scale0.wire.peer import BrokerState
from scale0.wire.worker import WorkerReply
from tests.core.harness import BACK, FRONT, Harness, dispatched


def _play(lean: bool) -> list[list[Effect]]:
    h = Harness()
    tickets: list[bytes] = []
    trace: list[list[Effect]] = []

    def request(rid: bytes, request_id: bytes, service: str = "echo") -> None:
        body = (b"body-" + request_id,)
        if lean:
            effects = h.broker.handle_request(rid, service, request_id, body, h.now)
        else:
            effects = h.send(FRONT, rid, ClientRequest(service, request_id, body))
        tickets.extend(m.ticket for _, m in dispatched(effects))
        trace.append(effects)

    def reply(rid: bytes, ticket: bytes, status: int = 200) -> None:
        body = (b"answer", ticket)
        if lean:
            effects = h.broker.handle_reply(rid, ticket, status, body, h.now)
        else:
            effects = h.send(BACK, rid, WorkerReply(ticket, status, body))
        tickets.extend(m.ticket for _, m in dispatched(effects))
        trace.append(effects)

    request(b"stranger", b"r0")  # R1: not negotiated
    h.client(b"C")
    h.worker(b"W1")
    request(b"C", b"r1")  # R5: straight to W1
    request(b"C", b"r2")  # R6: W1 is busy, it waits
    request(b"C", b"r1")  # R10: joins the one in flight
    request(b"C", b"r3", "mmi.service")  # R7: the broker answers itself
    request(b"C", b"r4", "scale0.x")
    reply(b"W1", tickets[0], 503)  # r1 answered, r2 goes to W1
    reply(b"W1", b"no-such-ticket")  # R14: dropped
    reply(b"W2", tickets[1])  # R14: not W2's ticket
    request(b"C", b"r1")  # R10: the cached reply
    reply(b"W1", tickets[1])
    h.advance(10.0)  # past the start-up grace: unknown services are 404 now
    h.client(b"C")  # the silent session expired meanwhile
    request(b"C", b"r5", "nobody")
    h.broker.core.state = BrokerState.DISABLED
    request(b"C", b"r6")  # R3
    return trace


def test_lean_entry_points_give_the_same_effects_as_handle() -> None:
    typed, lean = _play(lean=False), _play(lean=True)
    assert len(typed) == len(lean) == 13
    for step, (expected, got) in enumerate(zip(typed, lean, strict=True)):
        assert got == expected, f"step {step}"
    assert any(typed), "the scenario must produce effects to compare"
