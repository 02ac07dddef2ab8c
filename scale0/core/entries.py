"""The façade's hot-path entry points (docs/performance.md, docs/architecture.md).

The same rules as ``Broker.handle(Received(...))`` for the messages of every request and every
heartbeat, fed the fields ``scale0.wire.hot`` reads from raw frames, so no message or event
object is built; each ends in the one copy of the rules in the rooms (scale0/core/dispatch.py,
sessions.py, majordomo.py), as the typed path does. :class:`scale0.core.broker.Broker`
inherits them: this is the façade in a second file, not a room (it may read the rooms).
"""

from __future__ import annotations

from collections.abc import Sequence

from scale0.core.context import Core
from scale0.core.dispatch import Dispatch
from scale0.core.effects import Channel, Effect
from scale0.core.majordomo import Majordomo, Reading
from scale0.core.sessions import Sessions
from scale0.wire.hot import Beat

__all__ = ["HotEntries"]

#: The few Majordomo readings (§10), each made a Reading once (the fast path gives tuples).
_READINGS: dict[tuple[bytes, bool, bool], Reading] = {}


class HotEntries:
    """The raw-frame entry points of the broker façade; the façade sets the four rooms."""

    core: Core
    dispatch: Dispatch
    majordomo: Majordomo
    sessions: Sessions

    def handle_request(
        self,
        routing_id: bytes,
        service: str,
        request_id: bytes,
        body: tuple[bytes, ...],
        now: float,
    ) -> list[Effect]:
        """``handle(Received(FRONTEND, routing_id, ClientRequest(service, request_id, body)))``."""
        self.core.clock = now
        out: list[Effect] = []
        speaks = self.majordomo.speaks
        if speaks:
            speaks.pop((Channel.FRONTEND, routing_id), None)  # an S0P REQUEST: it speaks S0P
        self.dispatch.client_request(routing_id, service, request_id, body, now, out)
        if speaks:
            self.majordomo.translate(out)
        return out

    def handle_reply(
        self, routing_id: bytes, ticket: bytes, status: int, body: tuple[bytes, ...], now: float
    ) -> list[Effect]:
        """Exactly ``handle(Received(BACKEND, routing_id, WorkerReply(ticket, status, body)))``."""
        self.core.clock = now
        out: list[Effect] = []
        speaks = self.majordomo.speaks
        if speaks:
            speaks.pop((Channel.BACKEND, routing_id), None)  # an S0P REPLY: it speaks S0P
        self.dispatch.worker_reply(routing_id, ticket, status, body, now, out)
        if speaks:
            self.majordomo.translate(out)
        return out

    def handle_requests(
        self, requests: Sequence[tuple[bytes, str, bytes, tuple[bytes, ...]]], now: float
    ) -> list[Effect]:
        """Exactly :meth:`handle_request` for each ``(routing_id, service, request_id, body)``
        of ``requests``, in order, their effects in one list: a run of plain REQUESTs that one
        batch receive read (docs/performance.md, "Runs of REQUESTs and REPLYs in one call")."""
        if self.majordomo.speaks:  # a Majordomo peer here: one at a time, as handle_request
            out: list[Effect] = []
            for routing_id, service, request_id, body in requests:
                out += self.handle_request(routing_id, service, request_id, body, now)
            return out
        self.core.clock = now
        out = []
        client_request = self.dispatch.client_request
        for routing_id, service, request_id, body in requests:
            client_request(routing_id, service, request_id, body, now, out)
        return out

    def handle_replies(
        self, replies: Sequence[tuple[bytes, bytes, int, tuple[bytes, ...]]], now: float
    ) -> list[Effect]:
        """Exactly :meth:`handle_reply` for each ``(routing_id, ticket, status, body)`` of
        ``replies``, in order, their effects in one list (a run of plain REPLYs)."""
        if self.majordomo.speaks:
            out: list[Effect] = []
            for routing_id, ticket, status, body in replies:
                out += self.handle_reply(routing_id, ticket, status, body, now)
            return out
        self.core.clock = now
        out = []
        worker_reply = self.dispatch.worker_reply
        for routing_id, ticket, status, body in replies:
            worker_reply(routing_id, ticket, status, body, now, out)
        return out

    def handle_heartbeat(
        self,
        channel: Channel,
        routing_id: bytes,
        sent: float,
        config_version: int,
        now: float,
        wall: float,
        interval_ms: int = 0,
    ) -> list[Effect]:
        """Exactly ``handle(Received(channel, routing_id, Heartbeat(sent, config_version,
        interval_ms=interval_ms or None, protocol=PROTOCOL[channel])), now, wall)`` for a
        client's (FRONTEND) or a worker's (BACKEND) HEARTBEAT: the liveness traffic of
        thousands of idle connections."""
        self.core.clock = now
        out: list[Effect] = []
        speaks = self.majordomo.speaks
        if speaks:
            speaks.pop((channel, routing_id), None)  # an S0P HEARTBEAT: it speaks S0P
        self.sessions.heard(channel, routing_id, sent, config_version, now, wall, out, interval_ms)
        if speaks:
            self.majordomo.translate(out)
        return out

    def handle_heartbeats(
        self,
        channel: Channel,
        beats: Sequence[Beat],
        now: float,
        wall: float,
    ) -> list[Effect]:
        """Exactly :meth:`handle_heartbeat` for each ``(routing_id, sent, config_version,
        interval_ms)`` of ``beats`` in order, their effects in one list: a run of HEARTBEATs
        that one batch receive read (docs/performance.md, "Liveness")."""
        self.core.clock = now
        out: list[Effect] = []
        speaks = self.majordomo.speaks
        if speaks:  # a Majordomo peer here: one at a time, as handle_heartbeat does
            for routing_id, sent, config_version, interval_ms in beats:
                out += self.handle_heartbeat(
                    channel, routing_id, sent, config_version, now, wall, interval_ms
                )
            return out
        self.sessions.heard_many(channel, beats, now, wall, out)
        return out

    def handle_mdp_request(
        self,
        routing_id: bytes,
        reading: tuple[bytes, bool, bool],
        service: str,
        body: tuple[bytes, ...],
        now: float,
    ) -> list[Effect]:
        """Exactly ``handle(Received(FRONTEND, routing_id, MdpClientRequest(service, body,
        protocol=, delimited=, majortomo=)))``, the three given as ``reading`` (§10)."""
        self.core.clock = now
        out: list[Effect] = []
        majordomo = self.majordomo
        known = _READINGS.get(reading)
        if known is None:
            known = _READINGS[reading] = Reading._make(reading)
        majordomo.request(routing_id, known, service, body, now, out)
        if majordomo.speaks:
            majordomo.translate(out)
        return out

    def handle_mdp_reply(
        self, routing_id: bytes, ticket: bytes, body: tuple[bytes, ...], now: float
    ) -> list[Effect]:
        """Exactly ``handle(Received(BACKEND, routing_id, MdpWorkerReply(ticket, body)))``:
        a Majordomo worker's final reply, status 200 (D2)."""
        self.core.clock = now
        out: list[Effect] = []
        self.dispatch.worker_reply(routing_id, ticket, 200, body, now, out)
        if self.majordomo.speaks:
            self.majordomo.translate(out)
        return out
