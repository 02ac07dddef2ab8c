"""The two state machines of a broker, written down as tables: its own state, and each peer's link.

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
from scale0.wire.peer import BrokerState

__all__ = [
    "BROKER_TRANSITIONS",
    "PEER_TRANSITIONS",
    "BrokerInput",
    "Change",
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
