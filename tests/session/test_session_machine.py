"""Hypothesis drives a client session through any order of broker messages, timers and moves."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scale0.session.errors import Scale0Error
from scale0.session.failover import Failover
from scale0.session.link import BrokerLink
from scale0.session.requests import ClientSession, PendingRequest
from scale0.wire.client import (
    ClientPartial,
    ClientReply,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.frames import SIG_CLIENT, ConfigType
from tests.session.helpers import WALL, config_frames, network

REFUSALS = [400, 401, 403, 409, 412, 426, 429, 501, 503]


class ClientSessionMachine(RuleBasedStateMachine):
    """Every request ends exactly once, by its deadline at the latest; ids never repeat."""

    def __init__(self) -> None:
        super().__init__()
        self.link = BrokerLink(SIG_CLIENT, heartbeat_interval_s=0.5)
        failover = Failover("tcp://127.0.0.1:7000", "frontend")
        self.session = ClientSession(self.link, 2, failover, id_prefix=b"\x07" * 8)
        self.now = 0.0
        self.session.arrived(self.now)
        self.requests: list[PendingRequest] = []
        self.sent_ids: list[bytes] = []
        #: Sends each request may have had: one, its retries, one more per negotiation (C2).
        self.allowed: dict[bytes, int] = {}

    def _take_outbox(self) -> None:
        for frames in self.link.outbox:
            if frames[2] == b"REQUEST":
                self.sent_ids.append(frames[4])
        self.link.outbox.clear()

    def _open_request(self) -> PendingRequest | None:
        return next((r for r in self.requests if not r.done), None)

    @rule(timeout_s=st.floats(0.1, 10.0))
    def submit(self, timeout_s: float) -> None:
        request = self.session.submit("svc", b"x", timeout_s, self.now)
        self.requests.append(request)
        self.allowed[request.request_id] = 1 + self.session.retries
        self._take_outbox()

    @rule(step=st.floats(0.0, 2.0))
    def time_passes(self, step: float) -> None:
        self.now += step
        self.session.tick(self.now, WALL + self.now)
        move = self.session.move
        if move is not None and self.now >= move.at:
            self.session.arrived(self.now)
        self._take_outbox()

    @rule(config_type=st.sampled_from(list(ConfigType)), full=st.booleans())
    def negotiated(self, config_type: ConfigType, full: bool) -> None:
        frames = (
            config_frames(network(3), config_type, SIG_CLIENT)
            if full
            else ConfigAck(1, "c.1", protocol=SIG_CLIENT).to_frames()
        )
        for request in self.requests:
            if not request.done:
                self.allowed[request.request_id] += 1
        self.session.receive(frames, self.now)
        self._take_outbox()

    @rule(code=st.sampled_from(REFUSALS))
    def refused(self, code: int) -> None:
        self.session.receive(DisconnectError(code, "no", protocol=SIG_CLIENT).to_frames(), self.now)
        self._take_outbox()

    @rule(step=st.floats(0.0, 0.9))
    def broker_heartbeat(self, step: float) -> None:
        self.time_passes(step)
        self.session.receive(Heartbeat(WALL, 1, protocol=SIG_CLIENT).to_frames(), self.now)
        self._take_outbox()

    @rule(force=st.booleans())
    def broker_says(self, force: bool) -> None:
        message = (
            ForceNegotiate("who", protocol=SIG_CLIENT) if force else Disconnect(protocol=SIG_CLIENT)
        )
        self.session.receive(message.to_frames(), self.now)
        self._take_outbox()

    @precondition(lambda self: self._open_request() is not None)
    @rule(status=st.sampled_from([200, 404, 409, 500, 503]), partial=st.booleans())
    def answered(self, status: int, partial: bool) -> None:
        request = self._open_request()
        assert request is not None
        if partial:
            message = ClientPartial("svc", request.request_id, (b"p",))
        elif status == 200:
            message = ClientReply("svc", request.request_id, 200, (b"ok",))
        else:
            message = ClientReply.failure("svc", request.request_id, status, "no")
        self.session.receive(message.to_frames(), self.now)
        self._take_outbox()

    @invariant()
    def each_request_ends_once_and_by_its_deadline(self) -> None:
        for request in self.requests:
            finals = [o for o in request.outcomes if isinstance(o, Scale0Error) or o[0]]
            assert len(finals) == (1 if request.done else 0)
            if request.done:
                assert request.request_id not in self.session.pending
                assert isinstance(request.outcomes[-1], Scale0Error) or request.outcomes[-1][0]
            else:
                assert request.request_id in self.session.pending
                assert self.now < request.deadline  # a tick at the deadline ends it (C4)
            assert request.sends <= self.allowed[request.request_id]

    @invariant()
    def ids_are_unique_and_only_ours_are_sent(self) -> None:
        ids = [request.request_id for request in self.requests]
        assert len(set(ids)) == len(ids)
        assert set(self.sent_ids) <= set(ids)
        assert len(self.sent_ids) == sum(request.sends for request in self.requests)


TestClientSession = ClientSessionMachine.TestCase
TestClientSession.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
