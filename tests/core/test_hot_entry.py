"""The lean entry points (handle_request, handle_reply, handle_heartbeat, handle_mdp_request,
handle_mdp_reply) decide exactly as handle(Received(...))."""

from __future__ import annotations

from scale0.core.effects import Channel, Effect, Log
from scale0.wire.client import ClientRequest, Heartbeat
from scale0.wire.hot import Beat
from scale0.wire.mdp import (
    MDPC01,
    MDPC02,
    MDPW01,
    MDPW02,
    MdpClientRequest,
    MdpWorkerReady,
    MdpWorkerReply,
)
from scale0.wire.peer import BrokerState
from scale0.wire.worker import WorkerReply
from tests.core.harness import BACK, FRONT, Harness, dispatched, sends


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


def _beats(lean: bool) -> list[list[Effect]]:
    """Every outcome of a HEARTBEAT (R1, R8, R12, R16, the answer, the broker's own beats)."""
    h = Harness()
    trace: list[list[Effect]] = []

    def beat(
        channel: Channel, rid: bytes, *, version: int = 3, skew: float = 0.0, promise: int = 0
    ) -> None:
        if lean:
            sent = h.wall + skew
            trace.append(
                h.broker.handle_heartbeat(channel, rid, sent, version, h.now, h.wall, promise)
            )
        else:
            trace.append(
                h.heartbeat(channel, rid, version=version, skew=skew, promise=promise or None)
            )

    beat(FRONT, b"stranger")  # R1: not negotiated
    beat(BACK, b"stranger")
    h.client(b"C1")
    h.client(b"C2")
    h.worker(b"W1")
    h.worker(b"W2")
    beat(FRONT, b"C1")  # answered
    beat(FRONT, b"C2")  # answered with the same message (same wall, same version)
    beat(BACK, b"W1")  # liveness only: workers get the broker's beats on their own schedule
    beat(FRONT, b"C1", version=2)  # R16: FORCENEGOTIATE
    beat(FRONT, b"C2", skew=-100.0)  # R12: 412, the session ends
    beat(FRONT, b"C2")  # ... so it must negotiate again (R1)
    h.send(BACK, b"MW", MdpWorkerReady("echo", protocol=MDPW01))
    beat(BACK, b"MW")  # a Majordomo worker's routing id speaking S0P now
    trace.append(h.advance(1.0))  # R11: the broker's HEARTBEATs to W1 and W2
    h.advance(2.5)  # W2, silent past liveness, expires (R8); W1 was heard at 0 s only
    beat(BACK, b"W2")  # R1: forgotten
    # R23 (§3.4): promises, answered with the promise; bad ones are 400 and end the session
    h.client(b"C3")
    h.client(b"C4")
    h.worker(b"W3")
    beat(FRONT, b"C3", promise=5000)
    beat(FRONT, b"C4", promise=5000)  # the same answer object
    beat(FRONT, b"C3", promise=1000)  # the negotiated interval again
    beat(FRONT, b"C4", promise=999)  # below: 400
    beat(BACK, b"W3", promise=5000)
    trace.append(h.advance(5.0))  # the broker's beat to the idle W3 says interval_ms 5000
    beat(BACK, b"W3", promise=5001)  # above: 400
    return trace


def test_lean_heartbeat_gives_the_same_effects_as_handle() -> None:
    typed, lean = _beats(lean=False), _beats(lean=True)
    assert len(typed) == len(lean) == 18
    for step, (expected, got) in enumerate(zip(typed, lean, strict=True)):
        assert got == expected, f"step {step}"
    promises = [m.interval_ms for step in typed for _, m in sends(step) if isinstance(m, Heartbeat)]
    assert promises.count(5000) == 4  # two answers, and the broker's to W3 at once and later
    errors = [
        m.message
        for step in typed[-7:]
        for _, m in sends(step)
        if type(m).__name__ == "DisconnectError"
    ]
    assert len(errors) == 2 and "999" in errors[0] and "5001" in errors[1], errors
    kinds = {type(m).__name__ for step in typed for _, m in sends(step)}
    assert {"Heartbeat", "ForceNegotiate", "DisconnectError"} <= kinds


def test_one_heartbeat_message_serves_every_connection_of_a_round() -> None:
    """The answers of one batch, and the beats of one timer round, are one message object,
    which the net layer encodes once (BrokerNode._perform)."""
    h = Harness()
    for rid in (b"C1", b"C2"):
        h.client(rid)
    for rid in (b"W1", b"W2"):
        h.worker(rid)
    answers = [m for rid in (b"C1", b"C2") for _, m in sends(h.heartbeat(FRONT, rid), FRONT)]
    assert len(answers) == 2 and answers[0] is answers[1]
    assert isinstance(answers[0], Heartbeat) and answers[0].time == h.wall
    beats = [m for _, m in sends(h.advance(1.0), BACK)]
    assert len(beats) == 2 and beats[0] is beats[1]
    assert isinstance(beats[0], Heartbeat) and beats[0].hbeatinterval_ms == 1000
    later = [m for _, m in sends(h.heartbeat(FRONT, b"C1"), FRONT)]
    assert later[0] is not answers[0] and later == [Heartbeat(h.wall, 3, protocol=b"S0C1")]


MDP_READINGS = {
    "7/MDP": (MDPC01, True, False),
    "18/MDP": (MDPC02, True, False),
    "majortomo": (MDPC02, True, True),
}


def _mdp(lean: bool) -> list[list[Effect]]:
    """Majordomo requests and replies of every reading, to S0P and Majordomo workers."""
    h = Harness()
    tickets: list[bytes] = []
    trace: list[list[Effect]] = []

    def request(rid: bytes, reading: str, service: str = "echo") -> None:
        protocol, delimited, majortomo = MDP_READINGS[reading]
        body = (b"hi-" + rid,)
        if lean:
            effects = h.broker.handle_mdp_request(rid, MDP_READINGS[reading], service, body, h.now)
        else:
            message = MdpClientRequest(
                service, body, protocol=protocol, delimited=delimited, majortomo=majortomo
            )
            effects = h.send(FRONT, rid, message)
        tickets.extend(m.ticket for _, m in sends(effects, BACK) if hasattr(m, "ticket"))
        trace.append(effects)

    def reply(rid: bytes, ticket: bytes, protocol: bytes = MDPW02) -> None:
        body = (b"answer", ticket)
        if lean:
            effects = h.broker.handle_mdp_reply(rid, ticket, body, h.now)
        else:
            effects = h.send(BACK, rid, MdpWorkerReply(ticket, body, protocol=protocol))
        tickets.extend(m.ticket for _, m in sends(effects, BACK) if hasattr(m, "ticket"))
        trace.append(effects)

    h.broker.core.state = BrokerState.DISABLED
    request(b"C0", "7/MDP")  # D1: not active, dropped
    h.broker.core.state = BrokerState.ACTIVE
    h.send(BACK, b"MW1", MdpWorkerReady("echo", protocol=MDPW01))
    h.send(BACK, b"MW2", MdpWorkerReady("echo", protocol=MDPW02))
    h.worker(b"SW")
    request(b"C1", "7/MDP")  # to MW1, as an MDPW01 REQUEST
    request(b"C2", "18/MDP")  # to MW2
    request(b"C3", "majortomo")  # to SW (S0P)
    request(b"C1", "majortomo")  # every worker busy: it waits
    request(b"C2", "18/MDP", "mmi.service")  # the broker answers itself, 8/MMI's bare code
    reply(b"MW1", tickets[0], MDPW01)  # the 7/MDP client's reply; the waiting one goes to MW1
    reply(b"MW2", tickets[1])
    reply(b"MW2", b"no-such-ticket")  # R14: dropped
    reply(b"SW", tickets[2])  # an S0P worker's ticket in a Majordomo reply: its own, answered
    reply(b"MW1", tickets[3], MDPW01)
    h.advance(10.0)
    request(b"C4", "18/MDP", "nobody")  # 404 in a FINAL
    return trace


def test_lean_majordomo_entry_points_give_the_same_effects_as_handle() -> None:
    typed, lean = _mdp(lean=False), _mdp(lean=True)
    assert len(typed) == len(lean) == 12
    for step, (expected, got) in enumerate(zip(typed, lean, strict=True)):
        assert got == expected, f"step {step}"
    kinds = {type(m).__name__ for step in typed for _, m in sends(step)}
    assert {"MdpWorkerRequest", "MdpClientReply", "WorkerRequest"} <= kinds


def _runs(many: bool) -> list[list[Effect]]:
    """Runs of HEARTBEATs as one batch receive hands them over: every outcome in one run."""
    h = Harness()
    trace: list[list[Effect]] = []

    def run(channel: Channel, plain: list[tuple[bytes, float, int] | Beat]) -> None:
        beats = [b if len(b) == 4 else (*b, 0) for b in plain]
        if many:
            trace.append(h.broker.handle_heartbeats(channel, beats, h.now, h.wall))
        else:
            out: list[Effect] = []
            for rid, sent, version, promise in beats:
                out += h.broker.handle_heartbeat(
                    channel, rid, sent, version, h.now, h.wall, promise
                )
            trace.append(out)

    for rid in (b"C1", b"C2", b"C3"):
        h.client(rid)
    for rid in (b"W1", b"W2", b"W3"):
        h.worker(rid)
    w = h.wall
    run(FRONT, [(b"C1", w, 3), (b"stranger", w, 3), (b"C2", w, 3), (b"C3", w - 100.0, 3)])
    run(FRONT, [(b"C1", w, 2), (b"C2", w, 3), (b"C3", w, 3), (b"C1", w, 3)])
    trace.append(h.advance(2.5))  # the broker's beats; W2 silent from here on
    w = h.wall
    run(BACK, [(b"W1", w, 3), (b"W3", w, 4), (b"stranger", w, 3), (b"W1", w, 3)])
    trace.append(h.advance(0.4))
    run(BACK, [(b"W2", h.wall, 3), (b"W3", h.wall + 100.0, 3), (b"W1", h.wall, 3)])  # W2: gap
    h.send(BACK, b"MW", MdpWorkerReady("echo", protocol=MDPW01))
    run(BACK, [(b"MW", h.wall, 3), (b"W1", h.wall, 3), (b"MW", h.wall, 3)])  # it speaks S0P now
    trace.append(h.advance(3.0))
    run(FRONT, [(b"C1", h.wall, 3), (b"C2", h.wall, 3)])  # expired: FORCENEGOTIATE
    # R23: promises in a run: made, kept, broken (400), and the broker's beats that follow
    h.client(b"C5")
    h.worker(b"W5")
    w = h.wall
    run(FRONT, [(b"C5", w, 3, 5000), (b"C5", w, 3, 5000), (b"C5", w, 3, 0), (b"C5", w, 3, 5000)])
    run(BACK, [(b"W5", w, 3, 5000), (b"W5", w, 3, 5000), (b"W5", w, 3, 1)])
    h.worker(b"W5")
    run(BACK, [(b"W5", w, 3, 5000)])
    trace.append(h.advance(5.0))
    return trace


def test_a_run_of_heartbeats_gives_the_effects_of_one_call_each() -> None:
    one, many = _runs(many=False), _runs(many=True)
    assert len(one) == len(many) == 13
    for step, (expected, got) in enumerate(zip(one, many, strict=True)):
        assert got == expected, f"step {step}"
    kinds = {type(m).__name__ for step in one for _, m in sends(step)}
    assert {"Heartbeat", "ForceNegotiate", "DisconnectError"} <= kinds
    logs = {e.event for step in one for e in step if isinstance(e, Log)}
    assert {"heartbeat_gap", "worker_lost"} <= logs


def _request_runs(many: bool) -> list[list[Effect]]:
    """Runs of REQUESTs and REPLYs as one batch receive hands them over (Broker.handle_requests,
    handle_replies), against one handle_request / handle_reply call each: every outcome of the
    hot path inside a run, and runs with a Majordomo peer present (one call each then)."""
    h = Harness()
    tickets: list[bytes] = []
    trace: list[list[Effect]] = []

    held: list[tuple[bytes, bytes]] = []  # (worker, ticket) of every dispatch in the trace

    def note(effects: list[Effect]) -> None:
        tickets.extend(m.ticket for _, m in sends(effects, BACK) if hasattr(m, "ticket"))
        held.extend((w, m.ticket) for w, m in sends(effects, BACK) if hasattr(m, "ticket"))
        trace.append(effects)

    def requests(*items: tuple[bytes, str, bytes]) -> None:
        run = [(rid, service, rid_, (b"body-" + rid_,)) for rid, service, rid_ in items]
        if many:
            note(h.broker.handle_requests(run, h.now))
        else:
            out: list[Effect] = []
            for rid, service, request_id, body in run:
                out += h.broker.handle_request(rid, service, request_id, body, h.now)
            note(out)

    def replies(*items: tuple[bytes, bytes, int]) -> None:
        run = [(rid, ticket, status, (b"answer", ticket)) for rid, ticket, status in items]
        if many:
            note(h.broker.handle_replies(run, h.now))
        else:
            out: list[Effect] = []
            for rid, ticket, status, body in run:
                out += h.broker.handle_reply(rid, ticket, status, body, h.now)
            note(out)

    h.client(b"C1")
    h.client(b"C2")
    h.worker(b"W1", capacity=2)
    h.worker(b"W2")
    # R1, R5 (W1 twice, then W2), R6 (waits), R10 (joins), R7 (mmi, reserved)
    requests(
        (b"stranger", "echo", b"s1"),
        (b"C1", "echo", b"r1"),
        (b"C2", "echo", b"r2"),
        (b"C1", "echo", b"r3"),
        (b"C1", "echo", b"r4"),
        (b"C2", "echo", b"r2"),
        (b"C1", "mmi.service", b"r5"),
        (b"C2", "scale0.x", b"r6"),
    )
    # answered, the waiting one dispatched; R14 unknown ticket and wrong worker; a stranger
    replies(
        (b"W1", tickets[0], 200),
        (b"W1", b"no-such-ticket", 200),
        (b"W2", tickets[1], 503),
        (b"W2", tickets[2], 200),  # W1's ticket (R5 took W1, W2, W1)
    )
    replies((b"stranger", tickets[3], 200), (b"W1", tickets[3], 200), (b"W1", tickets[1], 200))
    requests((b"C1", "echo", b"r1"), (b"C2", "echo", b"r7"))  # R10: the cached reply
    h.advance(10.0)  # past the start-up grace; the sessions expired
    h.client(b"C1")
    h.worker(b"W1", capacity=5)
    requests((b"C1", "nobody", b"r8"), (b"C1", "echo", b"r9"), (b"C2", "echo", b"r10"))
    h.send(BACK, b"MW", MdpWorkerReady("echo", protocol=MDPW02))
    h.send(FRONT, b"MC", MdpClientRequest("echo", (b"hi",), protocol=MDPC02))
    # a Majordomo peer speaks: one call each; MC's routing id speaks S0P from its REQUEST on
    assert h.broker.majordomo.speaks
    before = len(held)
    run = [(b"C1", "echo", b"r11"), (b"MC", "echo", b"r12")]
    requests(*run, *[(b"C1", "echo", b"r%d" % n) for n in range(13, 17)])  # the last waits
    # MC's answer in S0P now (D3); MW's REPLY in S0P: the waiting one goes to it as S0P
    replies(*[(w, t, 200) for w, t in held[before:]])
    h.broker.core.state = BrokerState.DISABLED
    requests((b"C1", "echo", b"r17"), (b"C1", "echo", b"r18"))  # R3
    return trace


def test_a_run_of_requests_and_replies_gives_the_effects_of_one_call_each() -> None:
    one, many = _request_runs(many=False), _request_runs(many=True)
    assert len(one) == len(many) == 8
    for step, (expected, got) in enumerate(zip(one, many, strict=True)):
        assert got == expected, f"step {step}"
    kinds = {type(m).__name__ for step in one for _, m in sends(step)}
    assert {"WorkerRequest", "ClientReply", "ForceNegotiate", "DisconnectError"} <= kinds
    statuses = {m.status for step in one for _, m in sends(step) if hasattr(m, "status")}
    assert {200, 404, 503} <= statuses
