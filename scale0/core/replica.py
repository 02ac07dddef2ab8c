"""Config replication: which network config a broker runs, and whether an offered one replaces it.

Pure (docs/protocol.md §6.3): an offered config is parsed and validated, its sha256 recomputed
from the document, its signature verified against the trusted keys, and only then compared by
``config_version``: higher wins; equal with another sha256 is a conflict that every broker
settles the same way, by keeping the smaller sha256. An offer that fails any check changes
nothing and says why. Cheap repeats (the republish every ``config_republish_s``) are recognised
by version and sha256 before anything is parsed or verified.

Rules (tests/core/test_replica.py names a test after each):
 K1  A config applies only if it parses and validates, its sha256 matches its document, its
     signature verifies against a trusted key, and its family is ours (once we have one).
 K2  A higher config_version replaces the running config; a lower one is refused as stale.
 K3  An equal version with the same sha256 is the running config: nothing happens (also when
     the offer named no version, or carries another valid signature).
 K4  An equal version with another sha256 is a conflict: the smaller sha256 is kept, by every
     broker, whichever arrived first; the conflict is recorded (bounded) for management.
 K5  Applying a config yields a plan: peers to connect and close, and the changes that cannot
     take effect without a restart (this broker's own endpoints), never silently ignored.
 K6  A ``view_signature`` (the client view's signature, docs/protocol.md §6.2) that comes with
     a config must verify against a trusted key, or the whole offer is refused (K1). A config
     without one still applies (a source that signs no view). The running config offered again
     with a view_signature it lacks gains it (verified), so the family converges on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.config.canonical import canonical_json, client_view_sha256, config_sha256
from scale0.config.errors import ConfigError
from scale0.config.formats import CONFIG_TYPE_FORMATS
from scale0.config.loader import loads
from scale0.config.model import BrokerEntry, NetworkConfig
from scale0.crypto.keys import SignatureError, verify_config, verify_view
from scale0.wire.frames import ConfigType

__all__ = [
    "Applied",
    "Conflict",
    "Offer",
    "Plan",
    "Refused",
    "Replica",
    "SignedConfig",
    "Unchanged",
    "Verdict",
    "plan_change",
]

#: Conflicts remembered for management; older ones are dropped.
MAX_CONFLICTS = 32


@dataclass(frozen=True, slots=True)
class SignedConfig:
    """A verified network config with its digest, its signature and who it came from."""

    network: NetworkConfig
    sha256: str
    signature: str
    origin: str
    view_signature: str | None = None  # the client view's, K6; None: the source made none

    @property
    def version(self) -> int:
        return self.network.config_version

    def document(self) -> bytes:
        """The canonical JSON document: what is published, persisted and sent to peers."""
        return canonical_json(self.network)


@dataclass(frozen=True, slots=True)
class Offer:
    """A config as it arrived (config PUB, a peer's CONFIG, a file, or set_config)."""

    config_type: ConfigType
    document: bytes
    sha256: str
    signature: str | None
    origin: str
    family: str | None = None  # the family the sender claims (PUB options), if any
    config_version: int | None = None  # the version the sender claims, if any
    view_signature: str | None = None  # the client view's signature, if it came with one


@dataclass(frozen=True, slots=True)
class Plan:
    """What applying a config changes around the broker (K5)."""

    connect: dict[str, str] = field(default_factory=dict)  # broker_id -> peer endpoint
    close: tuple[str, ...] = ()  # broker_ids no longer in the family
    restart_needed: tuple[str, ...] = ()  # settings of this broker that need a restart
    changed: tuple[str, ...] = ()  # top-level keys that differ


@dataclass(frozen=True, slots=True)
class Applied:
    config: SignedConfig
    previous_version: int
    plan: Plan
    conflict: bool = False  # True when it won an equal-version conflict (K4)
    view_signed: bool = False  # True when only a view_signature was added (K6)


@dataclass(frozen=True, slots=True)
class Unchanged:
    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


@dataclass(frozen=True, slots=True)
class Conflict:
    """An equal-version rival that lost (the running config has the smaller sha256)."""

    version: int
    kept: str
    dropped: str
    origin: str


#: How the replica judged an offer (K1-K6); management answers with it (set_config, reload).
Verdict = Applied | Unchanged | Refused | Conflict


def _peers(network: NetworkConfig, identity: str) -> dict[str, BrokerEntry]:
    return {b.identity: b for b in network.brokers if b.identity != identity}


def plan_change(old: NetworkConfig | None, new: NetworkConfig, identity: str) -> Plan:
    """The effects of moving from ``old`` to ``new`` for the broker ``identity`` (K5)."""
    before = _peers(old, identity) if old is not None else {}
    after = _peers(new, identity)
    connect = {
        bid: entry.peer
        for bid, entry in after.items()
        if bid not in before or before[bid].peer != entry.peer
    }
    close = tuple(sorted(bid for bid in before if bid not in after))
    restart: list[str] = []
    mine_old = next((b for b in old.brokers if b.identity == identity), None) if old else None
    mine_new = next((b for b in new.brokers if b.identity == identity), None)
    if mine_old is not None and mine_new is not None:
        for name in ("frontend", "backend", "peer", "config_pub"):
            if getattr(mine_old, name) != getattr(mine_new, name):
                restart.append(f"brokers[{identity}].{name}")
    changed: tuple[str, ...] = ()
    if old is not None:
        changed = tuple(
            name
            for name in NetworkConfig.__dataclass_fields__
            if getattr(old, name) != getattr(new, name)
        )
    return Plan(connect, close, tuple(restart), changed)


class Replica:
    """The running network config of one broker and the rules that replace it (K1-K6)."""

    def __init__(
        self,
        identity: str,
        trusted: Sequence[Ed25519PublicKey],
        *,
        family: str | None = None,
        current: SignedConfig | None = None,
    ) -> None:
        self.identity = identity
        self._trusted = tuple(trusted)
        self.family = current.network.family if current is not None else family
        self.current = current
        self.conflicts: deque[Conflict] = deque(maxlen=MAX_CONFLICTS)
        self.counters: dict[str, int] = dict.fromkeys(
            ("applied", "unchanged", "refused", "conflicts"), 0
        )

    @property
    def version(self) -> int:
        return self.current.version if self.current is not None else 0

    def is_current(self, version: int, sha256: str) -> bool:
        current = self.current
        return current is not None and current.version == version and current.sha256 == sha256

    def offer(self, offer: Offer) -> Verdict:
        outcome = self._judge(offer)
        key = {
            Applied: "applied",
            Unchanged: "unchanged",
            Refused: "refused",
            Conflict: "conflicts",
        }[type(outcome)]
        self.counters[key] += 1
        return outcome

    def _judge(self, offer: Offer) -> Verdict:
        current = self.current
        # K3, cheaply: a republish of what we run is recognised before any parsing.
        if (
            current is not None
            and offer.config_version == current.version
            and offer.sha256 == current.sha256
        ):
            if offer.view_signature is not None and current.view_signature is None:
                return self._add_view_signature(current, offer.view_signature)
            return Unchanged(f"config_version {current.version} is already running")
        if offer.family is not None and self.family is not None and offer.family != self.family:
            return Refused(f"family {offer.family!r} is not ours ({self.family!r})")
        claimed = offer.config_version
        if claimed is not None and current is not None and claimed < current.version:
            return Refused(  # K2, before the costly checks
                f"config_version {offer.config_version} is older than the running {current.version}"
            )
        try:
            network = loads(
                offer.document,
                CONFIG_TYPE_FORMATS[offer.config_type],
                kind="network",
                source=f"config from {offer.origin}",
            )
        except ConfigError as exc:
            first = exc.problems[0] if exc.problems else "invalid"
            more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
            return Refused(f"the document is not a valid network config: {first}{more}")
        sha256 = config_sha256(network)
        if sha256 != offer.sha256:
            return Refused(f"sha256 {offer.sha256[:12]}… does not match the document's")
        if offer.config_version is not None and offer.config_version != network.config_version:
            return Refused(
                f"config_version {offer.config_version} in the options, "
                f"{network.config_version} in the document"
            )
        if self.family is not None and network.family != self.family:
            return Refused(f"family {network.family!r} is not ours ({self.family!r})")
        if offer.signature is None:
            return Refused("the config is not signed")
        try:
            verify_config(
                offer.signature, network.family, network.config_version, sha256, self._trusted
            )
        except SignatureError as exc:
            return Refused(f"signature: {exc}")
        if offer.view_signature is not None:
            problem = self._view_problem(network, sha256, offer.view_signature)
            if problem is not None:
                return Refused(problem)
        candidate = SignedConfig(
            network, sha256, offer.signature, offer.origin, offer.view_signature
        )
        if current is None or candidate.version > current.version:
            return self._apply(candidate, conflict=False)
        if candidate.version < current.version:
            return Refused(
                f"config_version {candidate.version} is older than the running {current.version}"
            )
        if candidate.sha256 == current.sha256:
            # K3 again, for an offer that named no version (a saved config, some peers): the
            # same document, however signed, is the running config, not a conflict with it.
            if candidate.view_signature is not None and current.view_signature is None:
                return self._apply_view_signature(current, candidate.view_signature)
            return Unchanged(f"config_version {current.version} is already running")
        # K4: equal version, other digest. Everybody keeps the smaller sha256.
        if candidate.sha256 < current.sha256:
            self.conflicts.append(
                Conflict(candidate.version, candidate.sha256, current.sha256, offer.origin)
            )
            return self._apply(candidate, conflict=True)
        lost = Conflict(current.version, current.sha256, candidate.sha256, offer.origin)
        self.conflicts.append(lost)
        return lost

    def _view_problem(self, network: NetworkConfig, sha256: str, signature: str) -> str | None:
        """K6: why a view_signature does not hold for ``network`` (None: it does)."""
        try:
            verify_view(
                signature,
                network.family,
                network.config_version,
                sha256,
                client_view_sha256(network),
                self._trusted,
            )
        except SignatureError as exc:
            return f"view_signature: {exc}"
        return None

    def _add_view_signature(self, current: SignedConfig, signature: str) -> Verdict:
        """K6: the running config offered again with the view_signature it lacks."""
        problem = self._view_problem(current.network, current.sha256, signature)
        if problem is not None:
            return Refused(problem)
        return self._apply_view_signature(current, signature)

    def _apply_view_signature(self, current: SignedConfig, signature: str) -> Applied:
        self.current = SignedConfig(
            current.network, current.sha256, current.signature, current.origin, signature
        )
        return Applied(self.current, current.version, Plan(), view_signed=True)

    def _apply(self, candidate: SignedConfig, *, conflict: bool) -> Applied:
        previous = self.current
        self.current = candidate
        self.family = candidate.network.family
        plan = plan_change(previous.network if previous else None, candidate.network, self.identity)
        return Applied(candidate, previous.version if previous else 0, plan, conflict)
