"""A broker's state machines, written down as tables: its own state, each peer's link, and (in a
gossip family) each member's liveness.

Every (state, input) pair has an entry, so nothing is left to an ``if`` chain to decide by
omission; tests/core/test_states.py drives a real :class:`scale0.core.broker.Broker` through
every pair (Hypothesis picks the paths) and checks that it lands where the table says.

The broker's state is :class:`scale0.wire.peer.BrokerState`, the type HELLO and HEARTBEAT carry
(docs/protocol.md §6.4): there is one broker-state type, not a core one and a wire one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from scale0.wire.frames import JsonValue
from scale0.wire.gossip import MemberStatus
from scale0.wire.peer import BrokerState

__all__ = [
    "BROKER_TRANSITIONS",
    "MEMBER_TRANSITIONS",
    "PEER_TRANSITIONS",
    "BrokerInput",
    "Change",
    "MemberInput",
    "PeerInput",
    "PeerLink",
    "broker_next",
]

J, A, D = BrokerState.JOINING, BrokerState.ACTIVE, BrokerState.DISABLED


class BrokerInput(Enum):
    """What changes a broker's state (docs/protocol.md §6.4, docs/operations.md)."""

    JOIN_ACTIVE = "join_active"  # its first config applied; its broker file says enabled
    JOIN_DISABLED = "join_disabled"  # its first config applied; its broker file says disabled
    ENABLE = "enable"  # management `enable`
    DISABLE = "disable"  # management `disable`
    DRAIN = "drain"  # SIGTERM (R19): a disable that ends in a stop


#: (state, input) -> the next state, or None: refused (a joining broker has no config to serve
#: with, so `enable` and `disable` are answered 503 and change nothing). A later config keeps an
#: active or disabled broker as it is; a drain while joining has nothing to move.
BROKER_TRANSITIONS: Final[Mapping[tuple[BrokerState, BrokerInput], BrokerState | None]] = {
    (J, BrokerInput.JOIN_ACTIVE): A,
    (J, BrokerInput.JOIN_DISABLED): D,
    (J, BrokerInput.ENABLE): None,
    (J, BrokerInput.DISABLE): None,
    (J, BrokerInput.DRAIN): J,
    (A, BrokerInput.JOIN_ACTIVE): A,
    (A, BrokerInput.JOIN_DISABLED): A,
    (A, BrokerInput.ENABLE): A,
    (A, BrokerInput.DISABLE): D,
    (A, BrokerInput.DRAIN): D,
    (D, BrokerInput.JOIN_ACTIVE): D,
    (D, BrokerInput.JOIN_DISABLED): D,
    (D, BrokerInput.ENABLE): A,
    (D, BrokerInput.DISABLE): D,
    (D, BrokerInput.DRAIN): D,
}


def broker_next(state: BrokerState, change: BrokerInput) -> BrokerState | None:
    """The state ``change`` leads to from ``state`` (None: refused, nothing changes)."""
    return BROKER_TRANSITIONS[state, change]


@dataclass(frozen=True, slots=True)
class Change:
    """How a requested change of state went: ``code`` 200 (done or nothing to do) or 503."""

    code: int
    before: BrokerState
    after: BrokerState
    why: str = ""

    @property
    def changed(self) -> bool:
        return self.before is not self.after

    def view(self, identity: str) -> dict[str, JsonValue]:
        return {"broker": identity, "state": self.after.value, "changed": self.changed}


class PeerLink(Enum):
    """How this broker stands with one peer (docs/protocol.md §5.2).

    ``DOWN``: not heard within liveness x interval (or never, or it said DISCONNECT).
    ``UP``: heard (any message counts, F3), but our own link's HELLO is not answered yet, or the
    peer refused it: we take its table and answer it, but send it no work.
    ``LINKED``: heard, and it answered our HELLO: it may be sent work (F6) when it is active.
    """

    DOWN = "down"
    UP = "up"
    LINKED = "linked"


class PeerInput(Enum):
    """What moves a peer's link state."""

    HEARD = "heard"  # any message from it, on its link or ours (F3)
    HELLO_ANSWERED = "hello_answered"  # its HELLO came back on our link (F1)
    REFUSED = "refused"  # DISCONNECTERROR on our link: it will not take our HELLO (F2)
    SILENT = "silent"  # liveness x interval without a word (F3)
    LOST = "lost"  # DISCONNECT (F12), a restart (new HELLO, F2), clock skew (F4), removal


U, L, X = PeerLink.UP, PeerLink.LINKED, PeerLink.DOWN

#: (link state, input) -> the next link state. Silence drops a peer only from ``UP`` or
#: ``LINKED``; a refusal takes back only the link, not what we heard of the peer.
PEER_TRANSITIONS: Final[Mapping[tuple[PeerLink, PeerInput], PeerLink]] = {
    (X, PeerInput.HEARD): U,
    (X, PeerInput.HELLO_ANSWERED): L,
    (X, PeerInput.REFUSED): X,
    (X, PeerInput.SILENT): X,
    (X, PeerInput.LOST): X,
    (U, PeerInput.HEARD): U,
    (U, PeerInput.HELLO_ANSWERED): L,
    (U, PeerInput.REFUSED): U,
    (U, PeerInput.SILENT): X,
    (U, PeerInput.LOST): X,
    (L, PeerInput.HEARD): L,
    (L, PeerInput.HELLO_ANSWERED): L,
    (L, PeerInput.REFUSED): U,
    (L, PeerInput.SILENT): X,
    (L, PeerInput.LOST): X,
}


class MemberInput(Enum):
    """What moves a member's liveness in a gossip family (scale0/core/gossip.py, G1-G9).

    A row's news is classified by its incarnation against ours first (G3: stale rows are no
    input at all), so every input here is one that counts.
    """

    ALIVE_NEWER = "alive_newer"  # a row (or the member itself) says alive at a higher incarnation
    SUSPECT_NEWS = "suspect_news"  # a row says suspect, at an incarnation that counts (G3)
    DEAD_NEWS = "dead_news"  # a row says dead, at an incarnation that counts (G3)
    PROBE_FAILED = "probe_failed"  # our probe and the indirect ones got no ACK in an interval
    SUSPICION_EXPIRED = "suspicion_expired"  # suspect for the whole suspicion timeout
    LEFT = "left"  # DISCONNECT, a restart (new HELLO), clock skew, removed from the config


AL, SU, DE = MemberStatus.ALIVE, MemberStatus.SUSPECT, MemberStatus.DEAD

#: (status, input) -> the next status (G2). Only a higher incarnation brings a member back
#: (refutation, or a restart); a suspicion that ran out is death; nothing but news revives.
MEMBER_TRANSITIONS: Final[Mapping[tuple[MemberStatus, MemberInput], MemberStatus]] = {
    (AL, MemberInput.ALIVE_NEWER): AL,
    (AL, MemberInput.SUSPECT_NEWS): SU,
    (AL, MemberInput.DEAD_NEWS): DE,
    (AL, MemberInput.PROBE_FAILED): SU,
    (AL, MemberInput.SUSPICION_EXPIRED): AL,
    (AL, MemberInput.LEFT): DE,
    (SU, MemberInput.ALIVE_NEWER): AL,
    (SU, MemberInput.SUSPECT_NEWS): SU,
    (SU, MemberInput.DEAD_NEWS): DE,
    (SU, MemberInput.PROBE_FAILED): SU,
    (SU, MemberInput.SUSPICION_EXPIRED): DE,
    (SU, MemberInput.LEFT): DE,
    (DE, MemberInput.ALIVE_NEWER): AL,
    (DE, MemberInput.SUSPECT_NEWS): DE,
    (DE, MemberInput.DEAD_NEWS): DE,
    (DE, MemberInput.PROBE_FAILED): DE,
    (DE, MemberInput.SUSPICION_EXPIRED): DE,
    (DE, MemberInput.LEFT): DE,
}
