"""Several pure broker cores wired together in memory: peers, config PUB/SUB, one fake clock.

What one broker sends on a link reaches the peer's ROUTER, what it answers on its ROUTER comes
back on the sender's link, and a publication reaches every broker that subscribed to the
publisher. Rules can drop messages (lost publications, partitions), so tests can show what
repairs them, with numbers only: no sockets, no sleeps. A killed broker neither sends nor
receives; a paused one keeps what it is sent queued until it resumes (a stopped process).

The core's tests (tests/core/) and the scale simulator (scale0/sim/scale.py, ``tools/scale``)
drive the same fabric. Delivery takes no simulated time: times measured on it count protocol
rounds (intervals, liveness), not network latency.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from scale0.config.canonical import canonical_json, client_view_sha256, config_sha256
from scale0.config.model import BrokerEntry, NetworkConfig, PeerLink
from scale0.core.broker import Broker
from scale0.core.effects import (
    Channel,
    Close,
    ConfigOffered,
    Connect,
    Effect,
    Event,
    Publish,
    Received,
    Send,
    Shutdown,
    Start,
    Subscribe,
    Tick,
)
from scale0.core.replica import Offer
from scale0.crypto.keys import sign_config, sign_view
from scale0.wire.client import CheckConfig, ClientReply, ClientRequest
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType, Message
from scale0.wire.worker import Ready, WorkerReply, WorkerRequest

KEY = Ed25519PrivateKey.generate()
OTHER_KEY = Ed25519PrivateKey.generate()


def entry(name: str, n: int, *, source: bool = False, role: str = "active") -> BrokerEntry:
    base = 7000 + 10 * n
    return BrokerEntry(
        identity=name,
        frontend=f"tcp://127.0.0.1:{base}",
        backend=f"tcp://127.0.0.1:{base + 1}",
        peer=f"tcp://127.0.0.1:{base + 2}",
        config_pub=f"tcp://127.0.0.1:{base + 3}",
        config_source=source,
        role=role,  # type: ignore[arg-type]
    )


def family_config(
    names: tuple[str, ...] = ("a", "b", "c"),
    *,
    sources: tuple[str, ...] = ("a", "b"),
    version: int = 1,
    peers: tuple[PeerLink, ...] = (),
    **overrides: Any,
) -> NetworkConfig:
    return NetworkConfig(
        family="fam",
        config_version=version,
        brokers=tuple(entry(n, i, source=n in sources) for i, n in enumerate(names)),
        peers=peers,
        default_heartbeat_interval_ms=1000,
        liveness=3,
        request_timeout_ms=5000,
        max_retries=2,
        **overrides,
    )


def signed(network: NetworkConfig, key: Ed25519PrivateKey = KEY) -> tuple[str, str]:
    sha = config_sha256(network)
    return sha, sign_config(key, network.family, network.config_version, sha)


def view_signed(network: NetworkConfig, key: Ed25519PrivateKey = KEY) -> str:
    """The client view's signature (docs/protocol.md §6.2), as a config source makes it."""
    sha = config_sha256(network)
    view = client_view_sha256(network)
    return sign_view(key, network.family, network.config_version, sha, view)


def offer_of(
    network: NetworkConfig, *, origin: str = "admin", key: Ed25519PrivateKey = KEY
) -> Offer:
    sha, signature = signed(network, key)
    return Offer(
        config_type=ConfigType.JSON,
        document=canonical_json(network),
        sha256=sha,
        signature=signature,
        origin=origin,
        family=network.family,
        config_version=network.config_version,
        view_signature=view_signed(network, key),
    )


Drop = Callable[[str, str, object], bool]  # (from, to, message) -> drop it?


class Fabric:
    """Brokers by name, their in-memory wiring, and what their clients and workers were sent."""

    def __init__(
        self,
        network: NetworkConfig,
        *,
        joining: tuple[str, ...] = (),
        keep_effects: bool = True,
        view_signed: bool = True,
    ) -> None:
        """``view_signed`` False: the brokers start from a config whose source signed no client
        view (docs/protocol.md §6.2), as a config source older than the view signature did."""
        self.now = 1000.0
        self.wall = 1_700_000_000.0
        self.network = network
        self.brokers: dict[str, Broker] = {}
        self.links: dict[str, dict[str, str]] = {}  # broker -> link id -> peer broker name
        self.subs: dict[str, tuple[str, ...]] = {}
        self.pub_of = {b.config_pub: b.identity for b in network.brokers}
        self.peer_of = {b.peer: b.identity for b in network.brokers}
        self.drops: list[Drop] = []
        self.down: set[str] = set()  # brokers that neither send nor receive (killed/stopped)
        self.paused: dict[str, list[Event]] = {}  # paused broker -> its events, queued
        self.settle_limit = 100_000  # events one settle may deliver before it is a livelock
        self.keep_effects = keep_effects  # False: effects are performed, not kept (long runs)
        self.queue: deque[tuple[str, Event]] = deque()
        self.outbox: dict[str, list[Send]] = {}  # broker -> Sends to clients/workers
        self.effects: dict[str, list[Effect]] = {}
        self.seeds: dict[str, tuple[str, ...]] = {}
        self._ids = 0  # request ids of request_with
        self.view_signed = view_signed
        for entry_ in network.brokers:
            name = entry_.identity
            self.add(name, None if name in joining else network)

    def add(
        self,
        name: str,
        network: NetworkConfig | None,
        *,
        seeds: tuple[str, ...] = (),
        key: Ed25519PrivateKey = KEY,
    ) -> Broker:
        source = any(b.identity == name and b.config_source for b in self.network.brokers)
        signature = signed(network, key)[1] if network is not None else None
        view_signature = None
        if network is not None and self.view_signed:
            view_signature = view_signed(network, key)
        broker = Broker(
            name,
            network,
            state="active",
            boot_id=name.encode()[:4].ljust(4, b"_"),
            signature=signature,
            view_signature=view_signature,
            now=self.now,
            trusted_keys=(KEY.public_key(),),
            family="fam",
            seeds=seeds,
            config_source=source,
        )
        self.brokers[name] = broker
        self.links[name] = {}
        self.subs[name] = ()
        self.outbox[name] = []
        self.effects[name] = []
        self.seeds[name] = seeds
        return broker

    # ---- driving ------------------------------------------------------------------------------

    def start(self, *names: str) -> None:
        for name in names or tuple(self.brokers):
            self.feed(name, Start())
        self.settle()

    def feed(self, name: str, event: Event) -> None:
        self.queue.append((name, event))

    def settle(self, limit: int | None = None) -> None:
        for _ in range(limit or self.settle_limit):
            if not self.queue:
                return
            name, event = self.queue.popleft()
            if name in self.down:
                continue
            held = self.paused.get(name)
            if held is not None:
                if not isinstance(event, Tick):  # a stopped process's timers do not pile up
                    held.append(event)
                continue
            self._perform(name, self._handle(name, event))
        raise AssertionError("the fabric did not settle")

    def _handle(self, name: str, event: Event) -> list[Effect]:
        """One event into one broker (a subclass may measure it)."""
        return self.brokers[name].handle(event, self.now, self.wall)

    def advance(self, seconds: float, step: float = 0.05) -> None:
        """Move time on in steps, ticking every broker and delivering between steps."""
        start, wall = self.now, self.wall
        steps = max(1, math.ceil(seconds / step - 1e-9))
        for i in range(1, steps + 1):
            # Exact times (no float drift): a test that moves 3 s sees exactly 3 s.
            self.now = start + seconds * i / steps
            self.wall = wall + seconds * i / steps
            for name in self.brokers:
                self.feed(name, Tick())
            self.settle()

    def kill(self, name: str) -> None:
        self.down.add(name)

    def pause(self, name: str) -> None:
        """``name`` stops handling events; what it is sent waits in its queue (SIGSTOP)."""
        self.paused.setdefault(name, [])

    def resume(self, name: str) -> None:
        """``name`` handles, in order, every event queued while it was paused (SIGCONT)."""
        for event in self.paused.pop(name, []):
            self.feed(name, event)
        self.feed(name, Tick())
        self.settle()

    def shutdown(self, name: str) -> None:
        self.feed(name, Shutdown())
        self.settle()
        self.down.add(name)

    def restart(self, name: str, network: NetworkConfig | None) -> Broker:
        self.down.discard(name)
        broker = self.add(name, network, seeds=self.seeds[name])
        self.start(name)
        return broker

    # ---- wiring -------------------------------------------------------------------------------

    def _dropped(self, src: str, dst: str, message: object) -> bool:
        return dst in self.down or any(rule(src, dst, message) for rule in self.drops)

    def _perform(self, name: str, effects: list[Effect]) -> None:
        if self.keep_effects:
            self.effects[name].extend(effects)
        for effect in effects:
            if isinstance(effect, Connect):
                target = self.peer_of.get(effect.endpoint)
                if target is not None:
                    self.links[name][effect.link] = target
            elif isinstance(effect, Close):
                self.links[name].pop(effect.link, None)
            elif isinstance(effect, Subscribe):
                self.subs[name] = effect.endpoints
            elif isinstance(effect, Publish):
                self._publish(name, effect)
            elif isinstance(effect, Send):
                self._send(name, effect)

    def _publish(self, name: str, effect: Publish) -> None:
        config = effect.config
        for other, endpoints in self.subs.items():
            if other == name or self._dropped(name, other, config):
                continue
            if any(self.pub_of.get(e) == name for e in endpoints):
                offer = Offer(
                    config_type=config.config_type,
                    document=config.document,
                    sha256=config.sha256,
                    signature=config.signature,
                    origin=config.origin,
                    family=config.family,
                    config_version=config.config_version,
                    view_signature=config.view_signature,
                )
                self.feed(other, ConfigOffered(offer, "pub"))

    def _send(self, name: str, effect: Send) -> None:
        if effect.channel is Channel.LINK:
            target = self.links[name].get(effect.routing_id.decode())
            if target is None or self._dropped(name, target, effect.message):
                return
            # Our link's routing id at the target's ROUTER: one per (sender, boot).
            rid = f"{name}@{id(self.brokers[name])}".encode()
            self.feed(target, Received(Channel.PEER, rid, effect.message))
        elif effect.channel is Channel.PEER:
            sender = effect.routing_id.decode().split("@")[0]
            if self._dropped(name, sender, effect.message):
                return
            link = next((k for k, v in self.links[sender].items() if v == name), None)
            if link is not None:
                self.feed(sender, Received(Channel.LINK, link.encode(), effect.message))
        else:
            self.outbox[name].append(effect)

    # ---- clients and workers ------------------------------------------------------------------

    def worker(
        self, name: str, rid: bytes, services: tuple[str, ...] = ("echo",), capacity: int = 1
    ) -> None:
        version = self.brokers[name].network.config_version
        self.feed(
            name,
            Received(
                Channel.BACKEND,
                rid,
                CheckConfig(
                    config_type=ConfigType.JSON, config_version=version, protocol=SIG_WORKER
                ),
            ),
        )
        self.feed(
            name,
            Received(
                Channel.BACKEND,
                rid,
                Ready(
                    services=services,
                    heartbeat=False,  # never expired for silence: tests move time freely
                    hbeatinterval_ms=1000,
                    time=self.wall,
                    config_version=version,
                    capacity=capacity,
                ),
            ),
        )
        self.settle()

    def client(self, name: str, rid: bytes) -> None:
        version = self.brokers[name].network.config_version
        self.feed(
            name,
            Received(
                Channel.FRONTEND,
                rid,
                CheckConfig(
                    config_type=ConfigType.JSON, config_version=version, protocol=SIG_CLIENT
                ),
            ),
        )
        self.settle()

    def request(self, name: str, rid: bytes, request_id: bytes, service: str = "echo") -> None:
        message = ClientRequest(service=service, request_id=request_id, body=(b"hi",))
        self.feed(name, Received(Channel.FRONTEND, rid, message))
        self.settle()

    def request_with(self, name: str, rid: bytes, service: str, *body: bytes) -> None:
        """A client REQUEST with ``body`` (a fresh request id each time)."""
        self._ids += 1
        message = ClientRequest(service=service, request_id=b"q%d" % self._ids, body=body)
        self.feed(name, Received(Channel.FRONTEND, rid, message))
        self.settle()

    def take(
        self, name: str, kind: type[Message], channel: Channel | None = None
    ) -> list[tuple[bytes, Any]]:
        """Remove and return what ``name`` sent its clients/workers of type ``kind``."""
        kept: list[Send] = []
        taken: list[tuple[bytes, Any]] = []
        for send in self.outbox[name]:
            if isinstance(send.message, kind) and (channel is None or send.channel is channel):
                taken.append((send.routing_id, send.message))
            else:
                kept.append(send)
        self.outbox[name] = kept
        return taken

    def serve(self, name: str) -> int:
        """Every worker of ``name`` answers every request it was given; returns how many."""
        served = 0
        for rid, message in self.take(name, WorkerRequest):
            reply = WorkerReply(ticket=message.ticket, status=200, body=(b"done",))
            self.feed(name, Received(Channel.BACKEND, rid, reply))
            served += 1
        self.settle()
        return served

    def replies(self, name: str) -> list[tuple[bytes, ClientReply]]:
        return self.take(name, ClientReply, Channel.FRONTEND)


def replace(network: NetworkConfig, **changes: Any) -> NetworkConfig:
    return dataclasses.replace(network, **changes)
