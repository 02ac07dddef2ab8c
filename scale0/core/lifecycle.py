"""The broker's own state: joining, active, disabled; and moving service away (R3, R18, R19).

Every change of state goes through :meth:`Lifecycle.change`, which looks the next state up in
:data:`scale0.core.states.BROKER_TRANSITIONS`; what a change does besides (R18: move waiting
requests and idle workers to an active peer) follows from the table's answer, not from a copy of
its conditions.
"""

from __future__ import annotations

from scale0.core.context import PROTOCOL, Core
from scale0.core.effects import Channel, Drained, Effect, Log, Send
from scale0.core.ports import (
    DispatchPort,
    FamilyPort,
    ForwardingPort,
    LedgerPort,
    SessionsPort,
)
from scale0.core.requests import Pending
from scale0.core.states import BrokerInput, Change, broker_next
from scale0.wire.client import Disconnect, DisconnectError
from scale0.wire.peer import BrokerState

__all__ = ["Lifecycle"]


class Lifecycle:
    """State changes, and the moving away of work that disabling and draining mean."""

    dispatch: DispatchPort
    family: FamilyPort
    forwarding: ForwardingPort
    ledger: LedgerPort
    sessions: SessionsPort

    def __init__(self, core: Core) -> None:
        self.core = core
        self._drained_said = False

    def change(self, change: BrokerInput, now: float, by: str, out: list[Effect]) -> Change:
        """Apply ``change`` by the table (scale0/core/states.py); log and act on a new state."""
        core = self.core
        before = core.state
        if change is BrokerInput.ENABLE and core.draining:
            return Change(503, before, before, f"broker {core.identity} is stopping")
        after = broker_next(before, change)
        if after is None:
            why = f"broker {core.identity} is {before.value}: it has no config yet"
            return Change(503, before, before, why)
        if after is before:
            return Change(200, before, after)
        core.state = after
        details = {"from": before.value, "to": after.value, "by": by}
        out.append(Log("info" if by == "config" else "warning", "broker_state", details))
        if after is BrokerState.DISABLED:
            self.move_away(now, out)
        return Change(200, before, after)

    def move_away(self, now: float, out: list[Effect]) -> None:
        """R18: the broker stops serving; its waiting requests and idle workers go elsewhere."""
        core = self.core
        dispatch = self.dispatch
        forwarding = self.forwarding
        moved: set[bytes] = set()
        ledger = self.ledger
        for service in ledger.queued_services():
            while (pending := ledger.next_waiting(service)) is not None:
                if pending.origin is not None:
                    why = f"broker {core.identity} is {core.state.value}"
                    dispatch.fail(pending, 503, why, out)
                    continue
                peer = forwarding.pick_peer(service, free=False)
                if peer is not None:
                    forwarding.forward_to(peer, pending, out)
                    continue
                # Nobody here will run it: its client resends it where it is told to go.
                dispatch.let_go(pending, f"broker {core.identity} is {core.state.value}", out)
                moved.add(pending.client)
        for routing_id in moved:
            self.move_client(routing_id, now, out)
        for worker in ledger.workers():
            if not ledger.used(worker):
                self.move_worker(worker.routing_id, now, out)
        self.check_drained(out)

    def move_worker(self, routing_id: bytes, now: float, out: list[Effect]) -> None:
        self._move(Channel.BACKEND, routing_id, now, out)

    def move_client(self, routing_id: bytes, now: float, out: list[Effect]) -> None:
        if routing_id in self.sessions.clients:
            self._move(Channel.FRONTEND, routing_id, now, out)

    def _move(self, channel: Channel, routing_id: bytes, now: float, out: list[Effect]) -> None:
        """R18: 301 to an active peer (503 if none); R17's DISCONNECT, early, when stopping, so
        that it fails over at once. Either way its session here ends."""
        protocol = PROTOCOL[channel]
        if self.core.draining:
            message: Disconnect | DisconnectError = Disconnect(protocol=protocol)
        else:
            message = self.family.not_accepting(protocol, channel)
        out.append(Send(channel, routing_id, message))
        self.sessions.forget(channel, routing_id, now, out, "moved")

    def drain(self, grace_ms: int, now: float, out: list[Effect]) -> None:
        """R19: SIGTERM. Disable, tell idle clients DISCONNECT, finish what is in flight."""
        core = self.core
        if core.draining:
            return
        core.draining = True
        core.wanted = BrokerState.DISABLED  # a joining broker that stops does not start serving
        in_flight = self.ledger.in_flight_count()
        out.append(Log("info", "broker_draining", {"in_flight": in_flight, "grace_ms": grace_ms}))
        if core.state is BrokerState.DISABLED:
            self.move_away(now, out)  # already disabled: move what came since
        else:
            self.change(BrokerInput.DRAIN, now, "shutdown", out)
        for routing_id in list(self.sessions.clients):
            if not self.ledger.client_busy(routing_id):
                self.move_client(routing_id, now, out)
        self.check_drained(out)

    def answered(self, pending: Pending, out: list[Effect]) -> None:
        """R19: a request was answered while draining: move its client once it is idle here."""
        if pending.origin is None and not self.ledger.client_busy(pending.client):
            self.move_client(pending.client, self.core.clock, out)
        self.check_drained(out)

    def check_drained(self, out: list[Effect]) -> None:
        if self.core.draining and not self.ledger.in_flight_count() and not self._drained_said:
            self._drained_said = True
            out.append(Drained())
