"""Which broker a client or worker uses next: seed-only bootstrap and failover (protocol.md §3.9).

Pure, like the rest of :mod:`scale0.session`: no sockets, no clock reads, and the jitter of the
back-off comes from a function passed in (none by default: the full delay), so the tests drive
every rule with numbers. :class:`Failover` decides; the owners (the client and worker sessions,
and through them ``scale0.net.client`` / ``scale0.net.worker``) close and open the DEALERs it
names.

Rules (tests/net/test_failover.py names a test after each; tests/session/ has more):

V1  The known brokers start as the seed alone. Every CONFIG view (protocol.md §3.2; a CONFIGACK
    carries none and changes nothing) replaces them with the endpoints of its ``brokers[]``
    entries: ``frontend`` for clients, ``backend`` for workers, in the view's order, entries
    with ``role: standby`` after the active ones, duplicates dropped. The seed stays known,
    after the family's own list, when the view does not name it. A view without ``brokers``
    keeps the seed only.
V2  A view is read as the text formats shape it too: XML and ZPL give a list as
    ``{"broker": [...]}``, a lone entry as a mapping, and scalars as strings. An entry that is
    not a mapping, has no endpoint for the channel, or whose endpoint is not
    ``tcp://host:port`` is skipped with a warning; a ``brokers`` value that is no list at all
    counts as absent (warning). A bad view never raises.
V3  Triggers (the owner reports them with :meth:`Failover.leave`): the broker silent for
    ``liveness`` x heartbeat interval (a dead or restarted broker, or one that never answers
    CHECKCONFIG), a broker DISCONNECT (§3.6), DISCONNECTERROR 503 (§6.4: not accepting) and
    301 (§3.8). A 301 whose ``endpoint`` is missing or not ``tcp://host:port`` is handled as a
    503, with a warning.
V4  Where to: a 301's endpoint; otherwise the known endpoint after the one that failed, in V1's
    order and wrapping round, never the failed one unless it is the only one known. A current
    endpoint that is not known (a 301 sent us there) is followed by the first known one.
V5  When: the first move after a session that lasted (negotiated at least ``settle_s`` =
    liveness x interval before it ended) is immediate; each further move in a row waits
    ``initial * 2**(n-1)`` seconds, capped at ``cap``, times 0.5..1 from the jitter source.
V6  Every move adds one to :attr:`Failover.failovers` and logs one line: from, to, reason,
    delay. :attr:`Failover.current` is the endpoint in use (or about to be).
V7  CURVE (docs/operations.md "CURVE"): the seed's key is the one the owner was given; every
    other endpoint's is the ``curve_public_key`` of the view's entry that lists it (the view
    came over a CURVE link to a broker whose key we checked, and that broker serves only a
    config it verified; an owner given the family's signing key learns only from a view
    whose signature it verified itself, :mod:`scale0.session.trust`).
    :meth:`Failover.server_key` is None for an endpoint with no key known: the owner connects
    to it without CURVE. A key that is not 40 Z85 characters is skipped with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeGuard

from scale0.config.validate import check_endpoint
from scale0.crypto.curve import curve_key_problem

__all__ = [
    "BACKOFF_INITIAL_S",
    "BACKOFF_MAX_S",
    "Channel",
    "Failover",
    "FailoverView",
    "Jitter",
    "Move",
    "backoff_delay",
    "broker_endpoints",
    "no_jitter",
    "valid_endpoint",
]

log = logging.getLogger("scale0.failover")

BACKOFF_INITIAL_S: Final = 0.1
BACKOFF_MAX_S: Final = 5.0

#: Which endpoint of a broker entry the owner connects to.
Channel = Literal["frontend", "backend"]

#: A source of jitter: a float in [0, 1) per call (the libraries pass ``random.random``).
Jitter = Callable[[], float]


def no_jitter() -> float:
    """The default jitter source: always the full back-off (deterministic)."""
    return 1.0


def backoff_delay(
    attempt: int,
    initial: float = BACKOFF_INITIAL_S,
    cap: float = BACKOFF_MAX_S,
    jitter: Jitter = no_jitter,
) -> float:
    """Exponential back-off with jitter: ``initial * 2**attempt`` capped, times 0.5..1.0."""
    base = min(cap, initial * 2.0 ** min(attempt, 30))
    return base * (0.5 + min(max(jitter(), 0.0), 1.0) / 2)


def valid_endpoint(value: object) -> TypeGuard[str]:
    """True for ``tcp://host:port`` with a port 1..65535 (the config schema's own check)."""
    return isinstance(value, str) and not any(check_endpoint("endpoint", value))


def _entries(brokers: object) -> list[object] | None:
    """The entries of a view's ``brokers`` value in any format's shape; None if it has none."""
    if isinstance(brokers, Mapping):  # XML/ZPL: {"broker": [...]} or {"broker": {...}}
        brokers = brokers.get("broker", brokers if "identity" in brokers else None)
    if isinstance(brokers, Mapping):  # a lone entry
        return [brokers]
    if isinstance(brokers, list):
        return list(brokers)
    return None


def broker_endpoints(document: Mapping[str, Any], channel: Channel) -> list[str] | None:
    """The ``channel`` endpoints a view lists (V1, V2); None when it lists no brokers at all."""
    if "brokers" not in document:
        return None
    entries = _entries(document["brokers"])
    if entries is None:
        log.warning("config view: 'brokers' is not a list (%.80r): ignored", document["brokers"])
        return None
    active: list[str] = []
    standby: list[str] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            log.warning("config view: brokers[%d] is not a table: skipped", index)
            continue
        endpoint = entry.get(channel)
        if endpoint is None:
            log.warning("config view: brokers[%d] has no %s endpoint: skipped", index, channel)
            continue
        if not valid_endpoint(endpoint):
            log.warning(
                "config view: brokers[%d].%s is not tcp://host:port (%.80r): skipped",
                index,
                channel,
                endpoint,
            )
            continue
        (standby if entry.get("role") == "standby" else active).append(endpoint)
    return list(dict.fromkeys(active + standby))


def broker_curve_keys(document: Mapping[str, Any], channel: Channel) -> dict[str, str]:
    """V7: endpoint -> ``curve_public_key`` of the view's entries that have one."""
    keys: dict[str, str] = {}
    entries = _entries(document.get("brokers"))
    for index, entry in enumerate(entries or ()):
        if not isinstance(entry, Mapping):
            continue
        endpoint, key = entry.get(channel), entry.get("curve_public_key")
        if key is None or not valid_endpoint(endpoint) or entry.get("curve_off") in (True, "true"):
            continue  # no key, or it serves no CURVE yet (curve_off)
        problem = curve_key_problem(key)
        if problem is not None:
            log.warning("config view: brokers[%d].curve_public_key: %s: skipped", index, problem)
            continue
        keys[endpoint] = key
    return keys


@dataclass(frozen=True, slots=True)
class Move:
    """Leave the current broker now; connect to ``endpoint`` at monotonic time ``at``."""

    endpoint: str
    at: float
    reason: str


class Failover:
    """The known brokers of one client or worker and the choice of the next one (V1-V6)."""

    def __init__(
        self,
        seed: str,
        channel: Channel,
        *,
        initial: float = BACKOFF_INITIAL_S,
        cap: float = BACKOFF_MAX_S,
        jitter: Jitter = no_jitter,
        seed_key: str | None = None,
    ) -> None:
        if initial <= 0 or cap < initial:
            raise ValueError("back-off needs 0 < initial <= cap")
        self.seed = seed
        self.channel: Channel = channel
        self.initial = initial
        self.cap = cap
        self._jitter = jitter
        self.endpoints: list[str] = [seed]
        self.seed_key = seed_key
        self.server_keys: dict[str, str] = {}  # V7, from the last view
        self.current = seed
        self.failovers = 0
        self.streak = 0  # moves in a row without a session that lasted (V5)
        self._negotiated_at: float | None = None
        self._learned: Mapping[str, Any] | None = None

    def learn(self, document: Mapping[str, Any]) -> None:
        """V1/V2: the known brokers from a CONFIG view (an empty one, CONFIGACK's, is ignored)."""
        if not document or document is self._learned:
            return  # CONFIGACK: nothing new (and the same view's warnings were logged once)
        self._learned = document
        self.server_keys = broker_curve_keys(document, self.channel)
        listed = broker_endpoints(document, self.channel)
        if not listed:
            if listed is not None:
                log.warning("config view: no usable %s endpoint, keeping the seed", self.channel)
            self.endpoints = [self.seed]
            return
        if self.seed not in listed:
            listed.append(self.seed)
        if listed != self.endpoints:
            log.info("known brokers (%s): %s", self.channel, ", ".join(listed))
        self.endpoints = listed

    def server_key(self, endpoint: str) -> str | None:
        """V7: the CURVE key of the broker at ``endpoint``; None: connect without CURVE."""
        if endpoint == self.seed and self.seed_key is not None:
            return self.seed_key
        return self.server_keys.get(endpoint)

    def negotiated(self, now: float) -> None:
        """The current broker answered CHECKCONFIG (V5 counts the session from here)."""
        self._negotiated_at = now

    def leave(
        self, reason: str, now: float, *, settle_s: float, redirect: str | None = None
    ) -> Move:
        """V3-V6: leave the current broker; where to go and when."""
        if self._negotiated_at is not None and now - self._negotiated_at >= settle_s:
            self.streak = 0
        self._negotiated_at = None
        if redirect is not None and not valid_endpoint(redirect):
            log.warning("301 to %.80r, which is not tcp://host:port: handled as 503", redirect)
            reason = f"{reason}; bad 301 endpoint, handled as 503"
            redirect = None
        target = redirect if redirect is not None else self._next()
        delay = 0.0
        if self.streak > 0:
            delay = backoff_delay(self.streak - 1, self.initial, self.cap, self._jitter)
        self.streak += 1
        self.failovers += 1
        log.warning(
            "leaving broker %s (%s): next %s in %.2f s (failover %d)",
            self.current,
            reason,
            target,
            delay,
            self.failovers,
        )
        self.current = target
        return Move(target, now + delay, reason)

    def _next(self) -> str:
        known: Sequence[str] = self.endpoints
        if self.current in known:
            start = known.index(self.current) + 1
            order = [*known[start:], *known[:start]]
        else:
            order = list(known)
        others = [endpoint for endpoint in order if endpoint != self.current]
        return others[0] if others else self.current


class FailoverView:
    """Where a client or worker stands in the family, read from its :class:`Failover` (V6)."""

    _failover: Failover

    @property
    def endpoint(self) -> str:
        """The broker in use (its frontend for a client, backend for a worker), or the one it
        is moving to."""
        return self._failover.current

    @property
    def brokers(self) -> list[str]:
        """The endpoints it knows: the seed, then what each CONFIG listed (V1)."""
        return list(self._failover.endpoints)

    @property
    def failovers(self) -> int:
        """How many times it left a broker for another (or the same one again)."""
        return self._failover.failovers
