"""Drive the pure broker with numbers: a fake clock, typed messages in, effects out."""

from __future__ import annotations

import dataclasses
from typing import Any

from scale0.config.model import BrokerEntry, NetworkConfig
from scale0.core.broker import Broker
from scale0.core.effects import Channel, Effect, Malformed, Received, Send, Shutdown, Tick
from scale0.wire.client import CheckConfig, ClientReply, ClientRequest, Heartbeat
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType, Message
from scale0.wire.worker import Ready, WorkerReply, WorkerRequest

FRONT = Channel.FRONTEND
BACK = Channel.BACKEND

NETWORK = NetworkConfig(
    family="test",
    config_version=3,
    brokers=(
        BrokerEntry(
            identity="b1",
            frontend="tcp://127.0.0.1:7001",
            backend="tcp://127.0.0.1:7002",
            peer="tcp://127.0.0.1:7003",
            config_pub="tcp://127.0.0.1:7004",
            config_source=True,
        ),
    ),
    default_heartbeat_interval_ms=1000,
    liveness=3,
    max_clock_skew_s=30.0,
    error_threshold=3,
    error_window_s=10.0,
    error_ban_s=60.0,
    request_timeout_ms=5000,
    max_retries=1,
    max_queued_requests=100,
)


class Harness:
    """One broker, a clock that moves only when told, and helpers to play clients and workers."""

    def __init__(self, state: str = "active", **network: Any) -> None:
        self.now = 1000.0
        self.wall = 1_700_000_000.0
        self.network = dataclasses.replace(NETWORK, **network)
        self.broker = Broker(
            "b1", self.network, state=state, boot_id=b"BOOT", signature=None, now=self.now
        )

    # -- feeding events ------------------------------------------------------------------------

    def send(self, channel: Channel, rid: bytes, message: Message) -> list[Effect]:
        return self.broker.handle(Received(channel, rid, message), self.now, self.wall)

    def garbage(self, channel: Channel, rid: bytes, code: int = 400) -> list[Effect]:
        error = ProtocolError(code, "frame 2: garbage")
        return self.broker.handle(Malformed(channel, rid, error), self.now, self.wall)

    def advance(self, seconds: float) -> list[Effect]:
        self.now += seconds
        self.wall += seconds
        return self.broker.handle(Tick(), self.now, self.wall)

    def shutdown(self) -> list[Effect]:
        return self.broker.handle(Shutdown(), self.now, self.wall)

    # -- playing parts --------------------------------------------------------------------------

    def client(self, rid: bytes, client_id: str | None = None) -> list[Effect]:
        return self.send(
            FRONT,
            rid,
            CheckConfig(
                config_type=ConfigType.JSON,
                config_version=3,
                client_id=client_id,
                protocol=SIG_CLIENT,
            ),
        )

    def worker(
        self,
        rid: bytes,
        services: tuple[str, ...] = ("echo",),
        *,
        capacity: int = 1,
        interval_ms: int = 1000,
        heartbeat: bool = True,
        every_effect: bool = False,
    ) -> list[Effect]:
        """CHECKCONFIG then READY; READY's effects, or (``every_effect``) both messages': a
        CHECKCONFIG repeated within an interval counts an error (R21), and a ban it ends in
        moves the worker's requests elsewhere."""
        negotiated = self.send(
            BACK,
            rid,
            CheckConfig(config_type=ConfigType.JSON, config_version=3, protocol=SIG_WORKER),
        )
        return (negotiated if every_effect else []) + self.send(
            BACK,
            rid,
            Ready(
                services=services,
                heartbeat=heartbeat,
                hbeatinterval_ms=interval_ms,
                time=self.wall,
                config_version=3,
                capacity=capacity,
            ),
        )

    def request(
        self, rid: bytes, request_id: bytes, service: str = "echo", body: bytes = b"hi"
    ) -> list[Effect]:
        return self.send(
            FRONT, rid, ClientRequest(service=service, request_id=request_id, body=(body,))
        )

    def reply(
        self, rid: bytes, ticket: bytes, body: bytes = b"ok", status: int = 200
    ) -> list[Effect]:
        return self.send(BACK, rid, WorkerReply(ticket=ticket, status=status, body=(body,)))

    def heartbeat(
        self,
        channel: Channel,
        rid: bytes,
        *,
        version: int = 3,
        skew: float = 0.0,
        promise: int | None = None,
    ) -> list[Effect]:
        """A HEARTBEAT; ``promise``: its ``interval_ms`` (idle beating, §3.4)."""
        protocol = SIG_CLIENT if channel is FRONT else SIG_WORKER
        return self.send(
            channel,
            rid,
            Heartbeat(
                time=self.wall + skew,
                config_version=version,
                interval_ms=promise,
                protocol=protocol,
            ),
        )


def sends(effects: list[Effect], channel: Channel | None = None) -> list[tuple[bytes, Message]]:
    return [
        (e.routing_id, e.message)
        for e in effects
        if isinstance(e, Send) and (channel is None or e.channel is channel)
    ]


def dispatched(effects: list[Effect]) -> list[tuple[bytes, WorkerRequest]]:
    """(worker routing id, WorkerRequest) for every request handed to a worker."""
    return [(r, m) for r, m in sends(effects, BACK) if isinstance(m, WorkerRequest)]


def replies(effects: list[Effect]) -> list[tuple[bytes, ClientReply]]:
    return [(r, m) for r, m in sends(effects, FRONT) if isinstance(m, ClientReply)]


def only(items: list[Any]) -> Any:
    assert len(items) == 1, items
    return items[0]
