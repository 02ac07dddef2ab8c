"""The guard: error scores and bans (R13, docs/protocol.md §8).

A malformed message costs its sender a point within ``error_window_s``; over ``error_threshold``
points ban the sender for ``error_ban_s``: it is told DISCONNECTERROR 429 once, its session ends,
and the I/O layer drops what it sends unread until the ban ends (:meth:`Guard.is_banned`).
Management (scale0/core/admin.py) scores failed credentials the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from scale0.core.context import PROTOCOL, Core
from scale0.core.effects import Channel, Effect, Log, Malformed, Send
from scale0.wire.client import DisconnectError
from scale0.wire.frames import SIG_BROKER, SIG_CLIENT, Message
from scale0.wire.mdp import MDP_SIGNATURES, MDPW01, MDPW02, MdpWorkerDisconnect

__all__ = ["Forget", "Guard"]

#: Ends a sender's session: (channel, routing_id, now, out, reason).
Forget = Callable[[Channel, bytes, float, list[Effect], str], None]


class Guard:
    """Error scores per sender, and the senders banned until when."""

    def __init__(self, core: Core, forget: Forget) -> None:
        self.core = core
        self._forget = forget
        self.errors: dict[bytes, deque[float]] = {}
        self.banned: dict[bytes, float] = {}

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

    def sweep(self, now: float) -> None:
        """Bound memory: forget old error scores and ended bans."""
        horizon = now - self.core.network.error_window_s
        for routing_id in [r for r, w in self.errors.items() if not w or w[-1] <= horizon]:
            del self.errors[routing_id]
        for routing_id in [r for r, until in self.banned.items() if until <= now]:
            del self.banned[routing_id]
