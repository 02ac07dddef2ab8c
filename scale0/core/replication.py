"""Config replication: offers judged by the replica; what an applied config does (F4, F10, F11).

A config is offered from the config SUB, a peer's CONFIG, the disk, the broker's file or an
admin; :class:`~scale0.core.replica.Replica` judges it (K1-K6). An applied config is persisted,
published by a config source, its plan performed (links, subscriptions), every client and worker
told FORCENEGOTIATE, and a joining broker becomes active (or disabled, as its file says).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.config.model import NetworkConfig
from scale0.core.context import Core
from scale0.core.effects import (
    Channel,
    ConfigOffered,
    Effect,
    Log,
    Persist,
    Publish,
    Send,
    Subscribe,
)
from scale0.core.peers import Peer
from scale0.core.ports import FamilyPort, LifecyclePort, SessionsPort
from scale0.core.replica import (
    Applied,
    Conflict,
    Offer,
    Refused,
    Replica,
    SignedConfig,
    Verdict,
    plan_change,
)
from scale0.core.states import BrokerInput
from scale0.core.timers import Periodic
from scale0.wire.client import CheckConfig, Config, ConfigAck
from scale0.wire.configsync import PublishedConfig
from scale0.wire.frames import SIG_BROKER, ConfigType, JsonValue, Message
from scale0.wire.peer import BrokerState

__all__ = ["Replication"]


class Replication:
    """The config replica of one broker and everything that follows a config applied."""

    family: FamilyPort
    lifecycle: LifecyclePort
    sessions: SessionsPort

    def __init__(
        self,
        core: Core,
        *,
        trusted_keys: Sequence[Ed25519PublicKey],
        family: str | None,
        current: SignedConfig | None,
        config_subs: Sequence[str],
        config_source: bool,
        own_ports: Mapping[str, int],
    ) -> None:
        self.core = core
        self.replica = Replica(core.identity, trusted_keys, family=family, current=current)
        self.config_source = config_source
        self._config_subs = tuple(config_subs)
        self._subscribed: tuple[str, ...] | None = None
        self._own_ports = dict(own_ports)

    def start(self, now: float, out: list[Effect]) -> None:
        """Links for the config we start with (F1)."""
        if self.replica.current is not None:
            network = self.core.network
            self.family.plan_links(network, plan_change(None, network, self.core.identity), out)

    def serve(self, now: float, out: list[Effect]) -> None:
        """A config source publishes now and every config_republish_s (F11)."""
        if self.config_source:
            self.publish(out)
            self.core.timers.push(now + self.core.network.config_republish_s, Periodic.REPUBLISH)

    def republish(self, now: float, out: list[Effect]) -> None:
        self.publish(out)
        self.core.timers.push(now + self.core.network.config_republish_s, Periodic.REPUBLISH)

    # ---- peers (F4, F11) -------------------------------------------------------------------

    def check_config_message(self) -> CheckConfig:
        version = self.replica.version
        return CheckConfig(
            config_type=ConfigType.JSON,
            config_version=version or None,
            client_id=self.core.identity,
            protocol=SIG_BROKER,
        )

    def newer_config(self, peer: Peer, version: int, out: list[Effect]) -> None:
        """F4: a peer runs a newer config: CHECKCONFIG it at once."""
        if version > self.replica.version and peer.linked:
            out.append(Send(Channel.LINK, peer.broker_id.encode(), self.check_config_message()))

    def peer_check_config(
        self, peer: Peer, routing_id: bytes, msg: CheckConfig, out: list[Effect]
    ) -> None:
        """F11: CONFIGACK or CONFIG with the whole config and its signature; 503 if not active."""
        current = self.replica.current
        if self.core.state is not BrokerState.ACTIVE or current is None or not current.signature:
            refusal = self.family.not_accepting(SIG_BROKER, Channel.PEER)
            out.append(Send(Channel.PEER, routing_id, refusal))
            return
        if msg.config_version == current.version:
            answer: Message = ConfigAck(
                config_version=current.version, client_id=peer.broker_id, protocol=SIG_BROKER
            )
        else:
            answer = Config(
                config_type=msg.config_type,
                config_version=current.version,
                sha256=current.sha256,
                client_id=peer.broker_id,
                document=self.core.whole_document(msg.config_type),
                signature=current.signature,
                view_signature=current.view_signature,
                protocol=SIG_BROKER,
            )
        out.append(Send(Channel.PEER, routing_id, answer))

    def config_answer(
        self, origin: str, msg: Config | ConfigAck, out: list[Effect], now: float, wall: float
    ) -> None:
        """A peer's (or seed's) answer to our CHECKCONFIG: a CONFIG is an offer."""
        if isinstance(msg, ConfigAck):
            return
        offer = Offer(
            config_type=msg.config_type,
            document=msg.document,
            sha256=msg.sha256,
            signature=msg.signature,
            origin=origin,
            config_version=msg.config_version,
            view_signature=msg.view_signature,
        )
        self.offered(ConfigOffered(offer, "peer"), now, wall, out)

    # ---- offers and what an applied config does (F10) --------------------------------------

    def offered(self, event: ConfigOffered, now: float, wall: float, out: list[Effect]) -> Verdict:
        counters = self.core.counters
        outcome = self.replica.offer(event.offer)
        where = {"source": event.source, "origin": event.offer.origin}
        if isinstance(outcome, Applied) and outcome.view_signed:
            self._view_signed(outcome, event.source, out)
        elif isinstance(outcome, Applied):
            self._applied(outcome, event.source, now, wall, out)
        elif isinstance(outcome, Conflict):
            counters["config_conflicts"] += 1
            details = {
                **where,
                "version": outcome.version,
                "kept": outcome.kept,
                "dropped": outcome.dropped,
            }
            out.append(Log("warning", "config_conflict", details))
        elif isinstance(outcome, Refused):
            counters["configs_refused"] += 1
            offer = event.offer
            details = {**where, "reason": outcome.reason, "version": offer.config_version}
            out.append(Log("warning", "config_refused", {**details, "sha256": offer.sha256}))
        return outcome

    def _view_signed(self, applied: Applied, source: str, out: list[Effect]) -> None:
        """K6: the running config gained its client view's signature; nothing else changes
        (the sessions keep their config: the view they hold is the one now signed)."""
        config = applied.config
        self.core.view_signature = config.view_signature
        details: dict[str, JsonValue] = {
            "source": source,
            "origin": config.origin,
            "version": config.version,
        }
        out.append(Log("info", "config_view_signed", details))
        if source != "disk" and config.signature:
            out.append(self._persist(config))
        if self.config_source:
            self.publish(out)

    @staticmethod
    def _persist(config: SignedConfig) -> Persist:
        return Persist(
            config.document(), config.sha256, config.signature, config.origin, config.view_signature
        )

    def _applied(
        self, applied: Applied, source: str, now: float, wall: float, out: list[Effect]
    ) -> None:
        """F10: the new config runs; everything around it follows."""
        core = self.core
        config = applied.config
        core.counters["configs_applied"] += 1
        if applied.conflict:
            core.counters["config_conflicts"] += 1
        was_joining = core.state is BrokerState.JOINING
        core.apply_network(config.network, config.signature or None, config.view_signature)
        details: dict[str, JsonValue] = {
            "source": source,
            "origin": config.origin,
            "version": config.version,
            "previous": applied.previous_version,
            "sha256": config.sha256,
            "changed": list(applied.plan.changed),
            "conflict": applied.conflict,
        }
        out.append(Log("warning" if applied.conflict else "info", "config_applied", details))
        if applied.plan.restart_needed:
            settings: list[JsonValue] = list(applied.plan.restart_needed)
            out.append(Log("warning", "config_needs_restart", {"settings": settings}))
        if core.member(core.identity) is None:
            out.append(Log("error", "not_a_member", {"version": config.version}))
        mismatches = self._endpoint_mismatches(config.network)
        if mismatches:
            # Clients and workers would be sent where this broker does not listen (issue 11 #7).
            problems: list[JsonValue] = list(mismatches)
            out.append(Log("error", "own_endpoint_mismatch", {"problems": problems}))
        if source != "disk" and config.signature:
            out.append(self._persist(config))
        self.family.plan_links(config.network, applied.plan, out)
        if was_joining:
            core.started = now  # give workers a request timeout to show up (R7)
            self.family.joined(out)
            joined = (
                BrokerInput.JOIN_DISABLED
                if core.wanted is BrokerState.DISABLED
                else BrokerInput.JOIN_ACTIVE
            )
            self.lifecycle.change(joined, now, "config", out)
        self.resubscribe(out)
        if self.config_source:
            self.publish(out)
        self.sessions.renegotiate_all(f"config_version {config.version} is current", out)
        self.family.say_hello(now, wall, out)

    def _endpoint_mismatches(self, network: NetworkConfig) -> list[str]:
        """Where this broker's entry names other ports than it bound (its file's, not 0)."""
        identity = self.core.identity
        entry = next((b for b in network.brokers if b.identity == identity), None)
        if entry is None:
            return []
        problems = []
        for channel, own in sorted(self._own_ports.items()):
            endpoint = getattr(entry, channel, None)
            if not own or not isinstance(endpoint, str):
                continue
            port = endpoint.rpartition(":")[2]
            if port.isdigit() and int(port) != own:
                problems.append(
                    f"{channel}_port is {own}, but brokers[{identity}].{channel} in config "
                    f"v{network.config_version} is {endpoint}"
                )
        return problems

    def resubscribe(self, out: list[Effect]) -> None:
        """Subscribe to every config source of the running config (and the file's endpoints)."""
        core = self.core
        mine = core.entry
        sources = [
            b.config_pub
            for b in core.network.brokers
            if b.config_source
            and b.identity != core.identity
            and (mine is None or b.config_pub != mine.config_pub)
        ]
        endpoints = tuple(sorted(set(self._config_subs) | set(sources)))
        if endpoints != self._subscribed:
            self._subscribed = endpoints
            out.append(Subscribe(endpoints))

    def publish(self, out: list[Effect]) -> None:
        current = self.replica.current
        if not self.config_source or current is None or not current.signature:
            return
        published = PublishedConfig(
            family=current.network.family,
            config_version=current.version,
            config_type=ConfigType.JSON,
            sha256=current.sha256,
            origin=self.core.identity,
            signature=current.signature,
            document=current.document(),
            view_signature=current.view_signature,
        )
        out.append(Publish(published))

    def fetch_config(self, out: list[Effect]) -> list[str]:
        """CHECKCONFIG on every linked peer (or seed, while joining) now; returns whom."""
        family = self.family
        check = self.check_config_message()
        asked: list[str] = []
        for broker_id, peer in family.peers.items():
            if peer.linked:
                out.append(Send(Channel.LINK, broker_id.encode(), check))
                asked.append(broker_id)
        for seed in family.seed_linked:
            out.append(Send(Channel.LINK, seed.encode(), check))
            asked.append(family.seed_names.get(seed, family.seeds.get(seed, seed)))
        return sorted(asked)

    def view(self) -> dict[str, JsonValue]:
        current = self.replica.current
        return {
            "state": self.core.state.value,
            "config_version": self.replica.version,
            "sha256": current.sha256 if current else None,
            "origin": current.origin if current else None,
            "view_signed": current is not None and current.view_signature is not None,
            "conflicts": [
                {"version": c.version, "kept": c.kept, "dropped": c.dropped, "origin": c.origin}
                for c in self.replica.conflicts
            ],
        }
