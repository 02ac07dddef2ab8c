"""Hypothesis drives the broker core through random lives; invariants hold after every step."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from scale0.core.effects import Effect
from scale0.wire.client import ClientReply, Disconnect, ForceNegotiate
from scale0.wire.frames import SIG_WORKER
from scale0.wire.worker import WorkerRequest
from tests.core.harness import BACK, FRONT, Harness, dispatched, replies, sends

WORKERS = [f"\x00w{i}".encode() for i in range(4)]
CLIENTS = [f"\x00c{i}".encode() for i in range(3)]


class BrokerLife(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(max_retries=1, max_queued_requests=5)
        self.asked: set[tuple[bytes, bytes]] = set()
        self.answers: Counter[tuple[bytes, bytes]] = Counter()
        self.first: dict[tuple[bytes, bytes], ClientReply] = {}
        self.running: dict[bytes, tuple[bytes, WorkerRequest]] = {}  # ticket -> (worker, req)
        self.next_id = 0

    def absorb(self, effects: list[Effect]) -> None:
        told = [r for r, m in sends(effects, FRONT) if isinstance(m, ForceNegotiate)]
        for worker, req in dispatched(effects):
            self.running[req.ticket] = (worker, req)
        for client, reply in replies(effects):
            assert isinstance(reply, ClientReply)
            self.answers[(client, reply.request_id)] += 1
            self.first.setdefault((client, reply.request_id), reply)
        for client in dict.fromkeys(told):
            # What the client library does: negotiate again, resend what is unanswered.
            self.absorb(self.h.client(client, client_id=client.hex()))
            for c, request_id in sorted(self.asked - set(self.first)):
                if c == client:
                    self.absorb(self.h.request(client, request_id))

    @initialize()
    def start(self) -> None:
        for c in CLIENTS:
            self.h.client(c, client_id=c.hex())

    @rule(w=st.sampled_from(WORKERS), capacity=st.integers(1, 3))
    def worker_ready(self, w: bytes, capacity: int) -> None:
        self.absorb(self.h.worker(w, capacity=capacity, heartbeat=False, every_effect=True))

    @rule(c=st.sampled_from(CLIENTS), service=st.sampled_from(["echo", "echo", "other"]))
    def request(self, c: bytes, service: str) -> None:
        self.next_id += 1
        request_id = str(self.next_id).encode()
        self.asked.add((c, request_id))
        self.absorb(self.h.request(c, request_id, service=service))

    @rule(data=st.data())
    def worker_answers(self, data: st.DataObject) -> None:
        if not self.running:
            return
        ticket = data.draw(st.sampled_from(sorted(self.running)))
        worker, _ = self.running.pop(ticket)
        self.absorb(self.h.reply(worker, ticket))

    @rule(w=st.sampled_from(WORKERS))
    def worker_leaves(self, w: bytes) -> None:
        self.absorb(self.h.send(BACK, w, Disconnect(protocol=SIG_WORKER)))

    @rule(seconds=st.sampled_from([0.1, 1.0, 2.5, 6.0]))
    def time_passes(self, seconds: float) -> None:
        for c in CLIENTS:  # clients stay connected
            self.absorb(self.h.heartbeat(FRONT, c))
        self.absorb(self.h.advance(seconds))

    @rule(c=st.sampled_from(CLIENTS), data=st.data())
    def client_repeats_a_request(self, c: bytes, data: st.DataObject) -> None:
        answered_ok = sorted(k[1] for k, r in self.first.items() if k[0] == c and r.status == 200)
        pending = sorted(rid for cl, rid in self.asked if cl == c and (cl, rid) not in self.first)
        choices = answered_ok + pending
        if not choices:
            return
        request_id = data.draw(st.sampled_from(choices))
        self.absorb(self.h.heartbeat(FRONT, c))  # stay negotiated for this check
        effects = self.h.request(c, request_id)
        assert dispatched(effects) == []  # a repeat never runs the request a second time
        got = replies(effects)
        if request_id in answered_ok:
            assert got == [(c, self.first[(c, request_id)])]  # the cached reply, identical
        else:
            assert got == []  # joins the request still waiting or running

    @invariant()
    def nothing_answered_twice_or_unasked(self) -> None:
        for key, n in self.answers.items():
            assert n == 1, key
            assert key in self.asked

    @invariant()
    def counters_are_consistent(self) -> None:
        stats = self.h.broker.stats()
        assert stats["queued"] >= 0 and stats["in_flight"] >= 0
        assert stats["queued"] + stats["in_flight"] <= len(self.asked)

    def teardown(self) -> None:
        # However the life went, every request is answered once time runs out.
        for _ in range(4):
            for c in CLIENTS:
                self.absorb(self.h.heartbeat(FRONT, c))
            self.absorb(self.h.advance(6.0))
        assert set(self.answers) == self.asked
        assert self.h.broker.stats()["in_flight"] == 0


def test_broker_life() -> None:
    """(A function, not ``BrokerLife.TestCase``: tests/core/conftest.py runs it over each pool.)"""
    run_state_machine_as_test(
        BrokerLife, settings=settings(max_examples=150, stateful_step_count=40, deadline=None)
    )
