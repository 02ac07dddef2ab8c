"""Who may connect, serve and call by CURVE key: the network config's grants, judged (pure).

Rules (docs/config.md "CURVE and who may serve and call what", docs/operations.md "CURVE";
tests/core/test_trust.py names a test after each):
 T1  An empty ``workers`` (``clients``) list restricts nothing: every key may serve (call)
     every service.
 T2  A key named by some grant gets the union of the services of its grants whose ``until``
     has not passed (``until`` is a UNIX time; the grant holds up to and including it), and
     never the ``*`` grants: once all its grants have ended it may do nothing.
 T3  A key named by no grant gets the ``*`` grants' services; with no ``*`` grant, nothing.
 T4  A service pattern is a name in which ``*`` matches any characters (``reports.*``); ``all``
     matches every service.
 T5  ZAP (who may connect, per socket): the frontend admits a key that may call something
     and a broker of the family (management asked of the whole family comes to each frontend),
     the backend one that may serve something, the peer ROUTER and the config PUB only the
     ``curve_public_key`` of a broker of the family; any other ZAP domain is refused.
 T6  A broker that has no config yet (joining: no members known) admits every key on its
     peer ROUTER and config PUB: it has nothing to judge by, nothing to protect (no config,
     no admins), and libzmq never retries a connection ZAP refused, so refusing its future
     peers' links now would cut them off for good. Membership is checked by HELLO (F2) and
     every config by its signature (K1-K6), as without CURVE.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Final, Literal

from scale0.config.model import KeyGrant, NetworkConfig

__all__ = ["ANY", "DOMAINS", "Allowed", "admits", "allowed", "may"]

#: What a key may do: every service, or these patterns (an empty tuple: nothing).
Allowed = tuple[str, ...] | Literal["all"]
ANY: Final = "*"
#: The ZAP domain of each of a broker's CURVE sockets (T5).
DOMAINS: Final = ("frontend", "backend", "peer", "config")


def allowed(grants: Sequence[KeyGrant], key: str, wall: float) -> Allowed:
    """T1-T3: the services ``key`` may serve or call at UNIX time ``wall``."""
    if not grants:
        return "all"
    named = [g for g in grants if g.key == key]
    chosen = named if named else [g for g in grants if g.key == ANY]
    patterns: list[str] = []
    for grant in chosen:
        if grant.until is not None and wall > grant.until:
            continue
        if grant.services == "all":
            return "all"
        patterns.extend(grant.services)
    return tuple(dict.fromkeys(patterns))


@lru_cache(maxsize=1024)
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")) + r"\Z")


def may(services: Allowed, service: str) -> bool:
    """T4: whether ``service`` is one of ``services``."""
    if services == "all":
        return True
    for pattern in services:
        if pattern == service or ("*" in pattern and _pattern(pattern).match(service)):
            return True
    return False


def admits(network: NetworkConfig, domain: str, key: str, wall: float) -> str | None:
    """T5: None when ``key`` may connect to the socket of ``domain``, else why not."""
    if domain in {"frontend", "backend"}:
        grants = network.clients if domain == "frontend" else network.workers
        if allowed(grants, key, wall):
            return None
        if domain == "frontend" and any(e.curve_public_key == key for e in network.brokers):
            return None
        what = "clients" if domain == "frontend" else "workers"
        return f"no grant in {what} admits this key (or its grants have ended)"
    if domain in {"peer", "config"}:
        if not network.brokers:  # T6
            return None
        if any(entry.curve_public_key == key for entry in network.brokers):
            return None
        return "not the curve_public_key of a broker of the family"
    return f"unknown ZAP domain {domain!r}"
