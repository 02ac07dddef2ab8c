"""The guard: error scores and bans (R13), connections that never negotiate (R20), and the
slow-down of password guessing per ``auth_id`` (M1 of scale0/core/admin.py); docs/protocol.md §8.

A malformed message costs its sender a point within ``error_window_s``; over ``error_threshold``
points ban the sender for ``error_ban_s``: it is told DISCONNECTERROR 429 once, its session ends,
and the I/O layer drops what it sends unread until the ban ends (:meth:`Guard.is_banned`).
Management (scale0/core/admin.py) scores failed credentials the same way, by source address
(the sender key is the address, so a guesser who reconnects for every try is still one sender).

Connections (R20, R22): the I/O layer reports each frontend, backend and peer connection as it
opens (``Connected``, with its address) and ends; one that has not negotiated within
``negotiate_timeout_ms`` is hung up (``Hangup``), and so is the oldest one not negotiated yet
whenever more than ``max_unnegotiated`` wait in its pool (frontend and backend share one, the
peer port has its own, so a flood of client connections never pushes out a member's link before
its HELLO). What the guard keeps per connection is one small record, and connections that are
gone or hung up are forgotten at once.

The peer port (R22): a refused HELLO (401) or an undecodable message from a routing id that has
not said an accepted HELLO counts against the connection's source address (a stranger opens a
new connection, so a new routing id, for every try); over the threshold the address is banned,
and while the ban lasts only a HELLO is read from its connections that have not negotiated
(:meth:`Guard.peer_unread`), so a member on the same host still joins.

Guessing (:class:`AuthThrottle`): after ``AUTH_FREE_FAILURES`` failed logins as one configured
``auth_id`` (from anywhere), each further try as that ``auth_id`` waits 1, 2, 4... s after the
last failure, at most ``AUTH_DELAY_MAX_S``; earlier tries get 429 without a check. An address
that logged in as that ``auth_id`` within ``AUTH_KNOWN_S`` is not slowed down, so an attacker
cannot lock a real admin out from the admin's usual address, and delays a new address by at
most ``AUTH_DELAY_MAX_S``. A success, or ``AUTH_FAILURE_MEMORY_S`` without a failure, resets it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final

from scale0.core.context import PROTOCOL, Core
from scale0.core.effects import (
    Channel,
    Connected,
    Disconnected,
    Effect,
    Hangup,
    Log,
    Malformed,
    Send,
)
from scale0.core.timers import ConnDue
from scale0.wire.client import DisconnectError
from scale0.wire.frames import SIG_BROKER, SIG_CLIENT, Message
from scale0.wire.mdp import MDP_SIGNATURES, MDPW01, MDPW02, MdpWorkerDisconnect

__all__ = [
    "AUTH_DELAY_MAX_S",
    "AUTH_FAILURE_MEMORY_S",
    "AUTH_FREE_FAILURES",
    "AUTH_KNOWN_ADDRESSES",
    "AUTH_KNOWN_S",
    "AuthThrottle",
    "Conn",
    "Forget",
    "Guard",
    "address_key",
    "peer_address_key",
]

#: Ends a sender's session: (channel, routing_id, now, out, reason).
Forget = Callable[[Channel, bytes, float, list[Effect], str], None]

#: Failed logins as one auth_id before its tries are slowed down.
AUTH_FREE_FAILURES: Final = 5
#: The longest wait between two tries as one auth_id (the most an attacker can delay an admin).
AUTH_DELAY_MAX_S: Final = 30.0
#: An auth_id's failures are forgotten after this long without one.
AUTH_FAILURE_MEMORY_S: Final = 900.0
#: An address that logged in as an auth_id is not slowed down for it this long...
AUTH_KNOWN_S: Final = 86_400.0
#: ...and each auth_id remembers this many such addresses (the most recent).
AUTH_KNOWN_ADDRESSES: Final = 16


def address_key(address: str) -> bytes:
    """The sender key of an address (a NUL first byte, which no ZeroMQ routing id may have,
    keeps it apart from routing ids); the HTTP server and MANAGEMENTREQ share it (§8)."""
    return b"\x00addr:" + address.encode()


def peer_address_key(address: str) -> bytes:
    """The sender key of an address on the peer port (R22): a score and a ban of their own, so
    a stranger's garbage on the peer port never locks an admin on the same host out of
    management (whose key is :func:`address_key`), nor the reverse."""
    return b"\x00peer:" + address.encode()


@dataclass(slots=True)
class Conn:
    """One open frontend, backend or peer connection (R20, R22)."""

    address: str
    gen: int
    negotiated: bool = False


class AuthThrottle:
    """Failed logins per configured auth_id and the addresses each logged in from (M1)."""

    __slots__ = ("failures", "known")

    def __init__(self) -> None:
        self.failures: dict[str, tuple[int, float]] = {}  # auth_id -> (count, last failure)
        self.known: dict[str, OrderedDict[bytes, float]] = {}  # auth_id -> sender -> until

    def wait_s(self, auth_id: str, sender: bytes, now: float) -> float:
        """How long ``sender`` must still wait before trying ``auth_id`` (0: it may now)."""
        entry = self.failures.get(auth_id)
        if entry is None:
            return 0.0
        count, last = entry
        if now - last >= AUTH_FAILURE_MEMORY_S or count < AUTH_FREE_FAILURES:
            return 0.0
        known = self.known.get(auth_id)
        if known is not None and known.get(sender, 0.0) > now:
            return 0.0
        delay = min(2.0 ** (count - AUTH_FREE_FAILURES), AUTH_DELAY_MAX_S)
        return max(0.0, last + delay - now)

    def failed(self, auth_id: str, admins: Collection[str], now: float) -> None:
        """A failed login as ``auth_id``; only configured auth_ids are kept (bounded)."""
        if auth_id not in admins:
            return
        count, last = self.failures.get(auth_id, (0, now))
        if now - last >= AUTH_FAILURE_MEMORY_S:
            count = 0
        self.failures[auth_id] = (count + 1, now)

    def succeeded(self, auth_id: str, sender: bytes, now: float) -> None:
        self.failures.pop(auth_id, None)
        known = self.known.setdefault(auth_id, OrderedDict())
        known.pop(sender, None)
        known[sender] = now + AUTH_KNOWN_S
        while len(known) > AUTH_KNOWN_ADDRESSES:
            known.popitem(last=False)

    def sweep(self, now: float, admins: Collection[str]) -> None:
        for auth_id in [
            a for a, (_, t) in self.failures.items() if now - t >= AUTH_FAILURE_MEMORY_S
        ]:
            del self.failures[auth_id]
        for auth_id in list(self.known):
            known = self.known[auth_id]
            for sender in [s for s, until in known.items() if until <= now]:
                del known[sender]
            if not known or auth_id not in admins:
                del self.known[auth_id]
        for auth_id in [a for a in self.failures if a not in admins]:
            del self.failures[auth_id]


class Guard:
    """Error scores per sender, and the senders banned until when."""

    def __init__(self, core: Core, forget: Forget, linked: Callable[[bytes], bool]) -> None:
        self.core = core
        self._forget = forget
        self._linked = linked  # a peer ROUTER routing id whose HELLO was accepted (F2)
        self.errors: dict[bytes, deque[float]] = {}
        self.banned: dict[bytes, float] = {}
        self.conns: dict[tuple[Channel, int], Conn] = {}
        # Connections not negotiated yet, oldest first: frontend and backend (R20)...
        self.unnegotiated: OrderedDict[tuple[Channel, int], None] = OrderedDict()
        # ...and the peer port's, a pool of its own (R22).
        self.unnegotiated_peers: OrderedDict[tuple[Channel, int], None] = OrderedDict()
        self._gen = 0
        self.auth = AuthThrottle()

    def is_banned(self, routing_id: bytes, now: float) -> bool:
        until = self.banned.get(routing_id)
        if until is None:
            return False
        if now < until:
            return True
        del self.banned[routing_id]
        return False

    def malformed(self, event: Malformed, now: float, out: list[Effect]) -> None:
        """R13: DISCONNECTERROR 400/501 and the session ends; the sender's score goes up."""
        core = self.core
        if event.channel is Channel.CONFIG or event.channel is Channel.LINK:
            # No session and no reply route: PUB senders and our own links are not scored
            # (§6.1, §6.3 rule 1); the publication or answer is dropped and logged.
            key = "config_malformed" if event.channel is Channel.CONFIG else "peer_ignored"
            core.counters[key] += 1
            out.append(
                Log(
                    "warning",
                    "config_dropped" if event.channel is Channel.CONFIG else "peer_malformed",
                    {"code": event.error.code, "reason": str(event.error)},
                )
            )
            return
        core.counters["malformed"] += 1
        routing_id = event.routing_id
        if self.is_banned(routing_id, now):
            return
        if event.channel is Channel.PEER and not self._linked(routing_id):
            address = self.address(Channel.PEER, event.conn)
            if address is not None:  # R22: a stranger's garbage is scored by its address
                refusal = DisconnectError(
                    code=event.error.code, message=str(event.error), protocol=SIG_BROKER
                )
                self.peer_error(address, routing_id, refusal, now, out)
                return
        protocol = PROTOCOL.get(event.channel, SIG_BROKER)
        if self.count_error(event.channel, routing_id, routing_id, now, out):
            return
        message: Message | None = DisconnectError(
            code=event.error.code, message=str(event.error), protocol=protocol
        )
        if event.signature in (MDPW01, MDPW02) and event.channel is Channel.BACKEND:
            message = MdpWorkerDisconnect(protocol=event.signature)  # §2.4: in its version
        elif event.signature in MDP_SIGNATURES:
            message = None  # §2.4: a Majordomo client has no error command
        if message is not None:
            out.append(Send(event.channel, routing_id, message))
        self._forget(event.channel, routing_id, now, out, "malformed")  # §2.4: the session ends

    def count_error(
        self, channel: Channel, sender: bytes, reply_to: bytes, now: float, out: list[Effect]
    ) -> bool:
        """One error towards ``sender``'s score (R13, §8); True if it banned the sender.

        The ban is answered once, DISCONNECTERROR 429 to ``reply_to`` (the sender's routing id,
        or the waiting HTTP request), and ends the sender's session.
        """
        network = self.core.network
        window = self.errors.setdefault(sender, deque())
        window.append(now)
        while window and window[0] <= now - network.error_window_s:
            window.popleft()
        if len(window) <= network.error_threshold:
            return False
        self.core.counters["banned"] += 1
        self.banned[sender] = now + network.error_ban_s
        del self.errors[sender]
        self._forget(channel, sender, now, out, "banned")
        out.append(
            Log("warning", "sender_banned", {"sender": sender.hex(), "ban_s": network.error_ban_s})
        )
        protocol = PROTOCOL.get(channel, SIG_BROKER if channel is Channel.PEER else SIG_CLIENT)
        message = DisconnectError(
            code=429, message="too many errors: ignored for a while", protocol=protocol
        )
        out.append(Send(channel, reply_to, message))
        return True

    def peer_error(
        self, address: str, routing_id: bytes, refusal: Message, now: float, out: list[Effect]
    ) -> None:
        """R22: a refused HELLO or undecodable message on the peer port from ``routing_id``,
        which has not said an accepted HELLO, over a connection from ``address``: one error
        towards the address's score, and ``refusal`` sent unless the address is banned (then
        nothing is sent) or this error bans it (then DISCONNECTERROR 429 once)."""
        sender = peer_address_key(address)
        if self.is_banned(sender, now):
            self.core.counters["banned_dropped"] = self.core.counters.get("banned_dropped", 0) + 1
            return
        if self.count_error(Channel.PEER, sender, routing_id, now, out):
            # Its connections are not hung up here: they go as any that does not negotiate
            # (timeout, pool). Hanging up a connection while its sender is mid-message can
            # abort the sender's libzmq (session_base.cpp clean_pipes, seen with tools/fuzz).
            out.append(Log("warning", "peer_address_banned", {"address": address}))
            return
        out.append(Send(Channel.PEER, routing_id, refusal))

    def peer_unread(self, routing_id: bytes, conn: int, command: bytes, now: float) -> bool:
        """R22: drop this peer-port message unread? Only from a connection that has not
        negotiated, from a banned address, and not a HELLO: a member says HELLO first and is
        heard whatever its address (its host may be shared with whoever got banned)."""
        if command == b"HELLO" or self._linked(routing_id):
            return False
        record = self.conns.get((Channel.PEER, conn))
        if record is None or record.negotiated or not record.address:
            return False
        return self.is_banned(peer_address_key(record.address), now)

    def sweep(self, now: float) -> None:
        """Bound memory: forget old error scores and ended bans."""
        horizon = now - self.core.network.error_window_s
        for routing_id in [r for r, w in self.errors.items() if not w or w[-1] <= horizon]:
            del self.errors[routing_id]
        for routing_id in [r for r, until in self.banned.items() if until <= now]:
            del self.banned[routing_id]
        self.auth.sweep(now, {a.auth_id for a in self.core.network.admins})

    # ---- connections (R20) -----------------------------------------------------------------

    def _pool(self, channel: Channel) -> OrderedDict[tuple[Channel, int], None]:
        return self.unnegotiated_peers if channel is Channel.PEER else self.unnegotiated

    def connected(self, event: Connected, now: float, out: list[Effect]) -> None:
        """A new connection: it has ``negotiate_timeout_ms`` to negotiate; past
        ``max_unnegotiated`` waiting in its pool, the oldest waiting one is hung up."""
        network = self.core.network
        key = (event.channel, event.conn)
        pool = self._pool(event.channel)
        pool.pop(key, None)  # a reused number: the old connection is gone
        self._gen += 1
        self.conns[key] = Conn(event.address, self._gen)
        pool[key] = None
        self.core.timers.push(
            now + network.negotiate_timeout_ms / 1000, ConnDue(event.channel, event.conn, self._gen)
        )
        while len(pool) > network.max_unnegotiated:
            oldest = next(iter(pool))
            self.hangup(oldest, out, "unnegotiated_over_limit")

    def disconnected(self, event: Disconnected) -> None:
        key = (event.channel, event.conn)
        self.conns.pop(key, None)
        self._pool(event.channel).pop(key, None)

    def negotiated(self, channel: Channel, conn: int) -> None:
        """The connection ``conn`` has a session now (a peer's: its HELLO was accepted): it
        stays as long as it likes."""
        record = self.conns.get((channel, conn))
        if record is not None and not record.negotiated:
            record.negotiated = True
            self._pool(channel).pop((channel, conn), None)

    def conn_due(self, key: ConnDue, out: list[Effect]) -> None:
        """R20: a connection's time to negotiate is up."""
        record = self.conns.get((key.channel, key.conn))
        if record is not None and record.gen == key.gen and not record.negotiated:
            self.hangup((key.channel, key.conn), out, "unnegotiated_timeout")

    def hangup(self, key: tuple[Channel, int], out: list[Effect], reason: str) -> None:
        self._pool(key[0]).pop(key, None)
        self.conns.pop(key, None)
        self.core.counters[reason] = self.core.counters.get(reason, 0) + 1
        out.append(Hangup(key[0], key[1]))

    def address(self, channel: Channel, conn: int) -> str | None:
        """Where the connection ``conn`` comes from, if the I/O layer said (Connected)."""
        record = self.conns.get((channel, conn))
        return record.address or None if record is not None else None
