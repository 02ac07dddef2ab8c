"""What every part of one broker shares: who it is, the config it runs, its state, clock and timers.

The broker (scale0/core/broker.py) is a façade over rooms that each own one concept: sessions
(negotiation), dispatch (requests and workers), the guard (error scores and bans), the family
(links, tables, forwarding), replication (the config) and the lifecycle (its state). They all
read and write this one :class:`Core`; none of them keeps a copy of what is here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from scale0.config.canonical import (
    canonical_json,
    client_view_sha256,
    client_view_tree,
    config_sha256,
)
from scale0.config.formats import CONFIG_TYPE_FORMATS, render
from scale0.config.model import BrokerEntry, NetworkConfig
from scale0.config.schema import to_tree
from scale0.core.effects import Channel
from scale0.core.metrics import Metrics
from scale0.core.timers import RequestDue, TimerHeap, TimerKey
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.peer import BrokerState

__all__ = ["COUNTERS", "PROTOCOL", "Core"]

#: The broker's counters, defined once in docs/management.md ("Counters").
COUNTERS = (
    "requests",
    "replies",
    "errors_404",
    "errors_503",
    "errors_504",
    "retries",
    "cache_hits",
    "duplicates_joined",
    "malformed",
    "banned",
    "dropped",
    "workers_lost",
    "forwarded",
    "forwards_served",
    "peers_lost",
    "peer_ignored",
    "configs_applied",
    "configs_refused",
    "config_conflicts",
    "config_malformed",
)

#: The signature a client or worker channel speaks (the peer channels speak SIG_BROKER).
PROTOCOL: Mapping[Channel, bytes] = {Channel.FRONTEND: SIG_CLIENT, Channel.BACKEND: SIG_WORKER}


class SeqSource(Protocol):
    """A counter shared with the C lane (scale0.core.ports.LanePort's numbering)."""

    def next_seq(self) -> int: ...

    def seq_from(self, number: int) -> None: ...


class Core:
    """One broker's identity, running config (with its serialized forms), state and clock."""

    def __init__(
        self,
        identity: str,
        network: NetworkConfig,
        signature: str | None,
        *,
        view_signature: str | None = None,
        state: BrokerState,
        wanted: BrokerState,
        boot_id: bytes,
        now: float,
    ) -> None:
        self.identity = identity
        self.state = state
        #: The state a joining broker takes once its first config applies (its broker file's).
        self.wanted = wanted
        #: Drain (SIGTERM) ran: the broker is disabled and stops once nothing is in flight.
        self.draining = False
        #: The node's event log counters while it writes one (docs/trend.md): RequestDone on.
        self.event_log: Mapping[str, int] | None = None
        #: The C lane's counters while it runs (scale0/net/lane.py; the node sets it): read by
        #: ``status`` only, a call into the lane each time.
        self.lane: Callable[[], Mapping[str, int]] | None = None
        self.boot_id = boot_id
        self.timers: TimerHeap[TimerKey] = TimerHeap()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.metrics = Metrics()
        #: The ``now`` of the event being handled (for latency metrics).
        self.clock = now
        #: The UNIX time of the last event handled with one (key grants' ``until``, T2).
        self.wall = 0.0
        #: Its sockets serve CURVE (set by the node): a connection whose key is not known is
        #: judged as the key "" (the ``*`` grants only), never as "no CURVE, no rules".
        self.curve = False
        #: The CURVE key of each routing id on the peer ROUTER (Authenticated): HELLO checks it.
        self.peer_keys: dict[bytes, str] = {}
        #: When the broker started serving (a joining broker: when it joined), for R7's grace.
        self.started = now
        self._seq = 0
        #: Where request numbers come from while the C lane numbers requests too (share_seq)
        self.seq_source: SeqSource | None = None
        self._ticket_seq = 0
        self.apply_network(network, signature, view_signature)

    # ---- the config it runs ----------------------------------------------------------------

    def apply_network(
        self, network: NetworkConfig, signature: str | None, view_signature: str | None = None
    ) -> None:
        self.network = network
        self.signature = signature
        #: The client view's signature (§6.2), sent with the view to a ``signed`` CHECKCONFIG.
        self.view_signature = view_signature
        self.sha256 = config_sha256(network)
        self.max_frame_bytes = network.max_frame_bytes
        self.interval_s = network.default_heartbeat_interval_ms / 1000
        self.timeout_s = network.request_timeout_ms / 1000
        self.entry = self.member(self.identity)
        #: The services this broker routes (the config's and its entry's lists), None: all.
        self.routes: frozenset[str] | None = None
        for allowed in (network.services, self.entry.services if self.entry else "all"):
            if allowed != "all":
                names = frozenset(allowed)
                self.routes = names if self.routes is None else self.routes & names
        self._views: dict[ConfigType, bytes] = {}
        self._wholes: dict[ConfigType, bytes] = {}
        self._view_sha256: str | None = None

    def member(self, identity: str) -> BrokerEntry | None:
        """The running config's entry for broker ``identity``, if it is a member."""
        return next((b for b in self.network.brokers if b.identity == identity), None)

    def client_view(self, config_type: ConfigType) -> bytes:
        """The part of the network config clients and workers see, serialized (cached)."""
        document = self._views.get(config_type)
        if document is None:
            typed = config_type is ConfigType.JSON
            tree = to_tree(self.network, typed=typed)
            keys = client_view_tree(self.network)  # the keys signed (never admins)
            view = {key: tree[key] for key in keys if key in tree}
            document = render(view, CONFIG_TYPE_FORMATS[config_type], kind="network")
            self._views[config_type] = document
        return document

    @property
    def client_view_sha256(self) -> str:
        """sha256 of the client view's canonical JSON, whatever format carries it (§3.2)."""
        if self._view_sha256 is None:
            self._view_sha256 = client_view_sha256(self.network)
        return self._view_sha256

    def whole_document(self, config_type: ConfigType) -> bytes:
        """The whole config in ``config_type``, as a peer's CONFIG carries it (cached)."""
        document = self._wholes.get(config_type)
        if document is None:
            if config_type is ConfigType.JSON:
                document = canonical_json(self.network)
            else:
                tree = to_tree(self.network, typed=False)
                document = render(tree, CONFIG_TYPE_FORMATS[config_type], kind="network")
            self._wholes[config_type] = document
        return document

    # ---- numbering -------------------------------------------------------------------------

    def next_seq(self) -> RequestDue:
        """A new request's number among those this broker holds (its timer key)."""
        source = self.seq_source
        if source is not None:
            return RequestDue(source.next_seq())
        self._seq += 1
        return RequestDue(self._seq)

    def share_seq(self, source: SeqSource | None) -> None:
        """Number requests from ``source`` from now on, after every number given so far (the
        C lane's counter, which numbers the requests it takes in the same order, so that the
        deadlines of requests it hands over fire in the order they came); None: from our own
        counter again, past every number the source gave. Tickets are numbered from it too:
        the lane's tickets and ours are then one sequence, so the byte order of a worker's
        tickets (``Ledger.tickets_of``, R8's retries) is the order they were issued, whoever
        issued them."""
        old = self.seq_source
        if old is not None:
            self._seq = self._ticket_seq = max(self._seq, self._ticket_seq, old.next_seq())
        if source is not None:
            source.seq_from(max(self._seq, self._ticket_seq))
        self.seq_source = source

    def next_ticket(self) -> bytes:
        """A ticket for one dispatch or forward: unique across this broker's boots."""
        source = self.seq_source
        if source is not None:
            return self.boot_id + source.next_seq().to_bytes(8, "big")
        self._ticket_seq += 1
        return self.boot_id + self._ticket_seq.to_bytes(8, "big")
