"""The peer mesh's data: what a broker knows of each peer, and the heartbeat table it shares.

Pure bookkeeping for scale0.core.broker (docs/protocol.md §5): a :class:`Peer` per other member
of the family (link state, liveness, its advertised table), and :class:`LocalTable`, this
broker's own table with a sequence number and a short history of deltas, so a puller that is a
little behind gets only what changed (TABLEREQ ``since_seq``) and one far behind gets it all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from scale0.core.states import PEER_TRANSITIONS, PeerInput, PeerLink
from scale0.wire.frames import JsonValue
from scale0.wire.gossip import MemberStatus
from scale0.wire.peer import BrokerState, TableMode, TableService, TableWorker

__all__ = ["LocalTable", "Peer", "PeerStatus"]

#: Table versions a broker keeps deltas for; a puller further behind gets a full table.
TABLE_HISTORY = 64

PeerStatus = Literal["down", "up"]


@dataclass(slots=True, eq=False)
class Peer:
    """One other broker of the family as this broker sees it."""

    broker_id: str
    endpoint: str  # its peer ROUTER, where our DEALER (link) connects
    wants: TableMode  # how we receive its table (the config's PeerLink, else pull)
    pull: bool  # whether we receive its table at all (a link exists, or none are configured)
    link: PeerLink = PeerLink.DOWN  # scale0/core/states.py: DOWN, UP, LINKED
    routing_id: bytes | None = None  # its DEALER's identity at our peer ROUTER, after HELLO
    push_to: bool = False  # it asked (HELLO table_mode push) for our table on every change
    state: BrokerState = BrokerState.JOINING
    config_version: int = 0
    last_seen: float = float("-inf")
    table_seq: int = 0  # the version of its table we hold
    table: dict[str, list[TableWorker]] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)  # service -> free slots, our estimate
    forwarded: set[bytes] = field(default_factory=set)  # our tickets it holds
    understands: frozenset[str] = frozenset()  # its last HELLO's ``understands`` (§5.1)
    # A gossip family only (scale0/core/gossip.py): its liveness as members gossip it, at which
    # incarnation, and the services it offers with their capacity (its last alive row).
    gossip: bool = False
    member: MemberStatus = MemberStatus.ALIVE
    incarnation: int = 0
    offered: tuple[tuple[str, int], ...] = ()

    def step(self, event: PeerInput) -> PeerLink:
        """Move the link state by the table (scale0/core/states.py); returns the state before."""
        before = self.link
        self.link = PEER_TRANSITIONS[before, event]
        return before

    @property
    def status(self) -> PeerStatus:
        """ "up" when heard within liveness x interval (F3), else "down"."""
        return "down" if self.link is PeerLink.DOWN else "up"

    @property
    def linked(self) -> bool:
        """Its HELLO came back on our link: we may send it work."""
        return self.link is PeerLink.LINKED

    def apply_table(self, seq: int, full: bool, rows: Iterable[TableService]) -> None:
        if full:
            self.table = {}
        for row in rows:
            if row.workers:
                self.table[row.service] = list(row.workers)
            else:
                self.table.pop(row.service, None)
        self.table_seq = seq
        self.free = {s: sum(w.capacity for w in ws) for s, ws in self.table.items()}

    def apply_slots(self, slots: Mapping[str, int], in_flight: Mapping[str, int]) -> None:
        """F16: the free slots of each service it offers are the count it sent us (what it
        would hold of ours at once) less our requests it holds or has not received yet;
        negative when it holds more of ours than it can run (then we wait for its answers)."""
        self.free = {s: slots.get(s, 0) - in_flight.get(s, 0) for s in self.table}

    def apply_services(
        self, offered: tuple[tuple[str, int], ...], in_flight: Mapping[str, int]
    ) -> None:
        """A gossip family: its alive row's services are its whole table, one entry a service
        (worker_id: the peer, capacity: its workers' capacity for it), free but for our
        requests it holds or has not received yet (G10)."""
        self.offered = offered
        self.table = {s: [TableWorker(self.broker_id, c, 0.0)] for s, c in offered}
        self.free = {s: c - in_flight.get(s, 0) for s, c in offered}

    def forget_table(self) -> None:
        self.table = {}
        self.free = {}
        self.table_seq = 0
        self.offered = ()

    def offers(self, service: str) -> bool:
        return service in self.table

    def usable(self) -> bool:
        """It may be sent work: alive, answered our HELLO, and active."""
        return (
            self.link is PeerLink.LINKED
            and self.state is BrokerState.ACTIVE
            and self.member is not MemberStatus.DEAD
        )

    def view(self, also_forwarded: int = 0) -> dict[str, JsonValue]:
        """What management shows of this peer (``also_forwarded``: our requests it holds that
        the lane forwarded, phase 4b)."""
        view: dict[str, JsonValue] = {
            "broker_id": self.broker_id,
            "endpoint": self.endpoint,
            "status": self.status,
            "linked": self.linked,
            "state": self.state.value,
            "config_version": self.config_version,
            "table_seq": self.table_seq,
            "table_mode": self.wants.value if self.pull else None,
            "services": {s: len(ws) for s, ws in sorted(self.table.items())},
            "forwarded": len(self.forwarded) + also_forwarded,
        }
        if self.gossip:
            view["member"] = self.member.value
            view["incarnation"] = self.incarnation
        return view


class LocalTable:
    """This broker's heartbeat table as shared with peers: rows per service, seq and deltas.

    The broker marks services dirty as its workers change; :meth:`commit` turns the dirty set
    into one new ``table_seq`` (so a burst of changes is one version, one delta).
    """

    def __init__(self) -> None:
        self.seq = 0
        self.rows: dict[str, tuple[TableWorker, ...]] = {}
        self._dirty: set[str] = set()
        self._history: deque[tuple[int, frozenset[str]]] = deque(maxlen=TABLE_HISTORY)

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def mark(self, services: Iterable[str]) -> None:
        self._dirty.update(services)

    def commit(self, rows: Mapping[str, tuple[TableWorker, ...]]) -> tuple[TableService, ...]:
        """Take the current rows of the dirty services; returns the delta (empty = removed)."""
        changed = frozenset(self._dirty)
        self._dirty.clear()
        delta: list[TableService] = []
        for service in sorted(changed):
            workers = rows.get(service, ())
            if workers:
                self.rows[service] = workers
            else:
                self.rows.pop(service, None)
            delta.append(TableService(service, workers))
        if delta:
            self.seq += 1
            self._history.append((self.seq, changed))
        return tuple(delta)

    def full(self) -> tuple[TableService, ...]:
        return tuple(TableService(s, w) for s, w in sorted(self.rows.items()))

    def since(self, seq: int) -> tuple[TableService, ...] | None:
        """The rows changed after version ``seq``, or None when that is too old to tell."""
        if seq == self.seq:
            return ()
        if seq > self.seq or not self._history or self._history[0][0] > seq + 1:
            return None
        services: set[str] = set()
        for version, changed in self._history:
            if version > seq:
                services |= changed
        return tuple(TableService(s, self.rows.get(s, ())) for s in sorted(services))
