"""One DEALER link to a broker without the socket: negotiation, heartbeats, liveness, refusals.

Shared by the client and the worker sessions (rules C1, C3 and C5 of
:mod:`scale0.session.requests`, W1-W3 of :mod:`scale0.session.worker`). Pure: ``now`` (a
monotonic clock, for timers) and ``wall`` (UNIX time, carried by HEARTBEAT) are passed in, and
the back-off's jitter comes from a function passed in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from enum import Enum
from typing import Final

from scale0.session.failover import Jitter, backoff_delay, no_jitter
from scale0.session.trust import ConfigTrust, UntrustedConfig
from scale0.session.view import ClientConfig, parse_config_document
from scale0.wire.client import (
    CheckConfig,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import ConfigType, Message
from scale0.wire.registry import decode_from_broker

__all__ = ["DEFAULT_LIVENESS", "MAX_FRAME_BYTES", "BrokerLink", "LinkEvent"]

log = logging.getLogger("scale0.client")

#: Frames we accept from our own broker (its own max_frame_bytes bounds what it relays anyway).
MAX_FRAME_BYTES: Final = 1 << 30
DEFAULT_LIVENESS: Final = 3


class LinkEvent(Enum):
    """What a control message means for the owner of a :class:`BrokerLink`."""

    NEGOTIATED = "negotiated"  # CONFIG/CONFIGACK: (re)send what waits (client) / READY (worker)
    RECONNECT = "reconnect"  # DISCONNECT, 301, 503: leave this broker (``link.leave_reason``)
    REFUSED = "refused"  # DISCONNECTERROR: ``link.refusal`` says which
    STOP = "stop"  # 401: give up


class BrokerLink:
    """The state of one DEALER link to a broker: C1, C3 and C5.

    The owner calls :meth:`reset` for each new socket, :meth:`heard` for every message
    received, :meth:`handle` for control messages and :meth:`tick` on timers, and sends
    whatever :attr:`outbox` collects. ``now`` is always a monotonic time in seconds.
    """

    def __init__(
        self,
        protocol: bytes,
        *,
        config_type: ConfigType = ConfigType.JSON,
        client_id: str | None = None,
        heartbeat_interval_s: float = 1.0,
        jitter: Jitter = no_jitter,
        trust: ConfigTrust | None = None,
    ) -> None:
        if heartbeat_interval_s <= 0:
            raise ValueError("heartbeat interval must be positive")
        self.protocol = protocol
        self.config_type = config_type
        self.client_id = client_id
        self.requested_interval_s = heartbeat_interval_s
        self.interval_s = heartbeat_interval_s
        self.liveness = DEFAULT_LIVENESS
        self.config: ClientConfig | None = None
        self.negotiated = False
        self.outbox: list[list[bytes]] = []
        self.last_heard = 0.0
        self.next_heartbeat = math.inf
        self.retry_at: float | None = None  # renegotiate at this time (back-off after refusal)
        self.refusal: DisconnectError | None = None  # last DISCONNECTERROR since NEGOTIATED
        self.move_to: str | None = None  # 301's endpoint, unchecked (failover.py V3 checks it)
        self.leave_reason = ""  # why the last RECONNECT leaves the broker (for the log, V6)
        self.negotiated_at = 0.0
        self.checkconfig_sent_at = -math.inf
        self._jitter = jitter
        self._refusals = 0
        #: S1-S4 (scale0.session.trust): check every CONFIG's signature before using it.
        self.trust = trust
        self.untrusted: UntrustedConfig | None = None  # the last CONFIG refused (S3)
        self.endpoint = ""  # the broker in use, to name it in an untrusted config's error
        # Idle beating (docs/protocol.md §3.4): the config's idle interval (0: off, or a broker
        # that does not know it), whether the owner holds work now (set by the owner), when it
        # last did, whether our last HEARTBEAT promised the idle interval, and the interval the
        # broker's last HEARTBEAT promised (0: ours).
        self.idle_interval_s = 0.0
        self.busy = False
        self.last_work = 0.0
        self.idle = False
        self.broker_interval_s = 0.0

    @property
    def config_version(self) -> int:
        return self.config.version if self.config is not None else 0

    def reset(self, now: float) -> None:
        """A new socket: start negotiating, and give the broker a full liveness period."""
        self.outbox.clear()
        self.last_heard = now
        self.broker_interval_s = 0.0
        self.negotiate(now)

    def resume(self, now: float) -> None:
        """The owner did no I/O for a while (idle blocking client): do not count it as silence."""
        self.last_heard = max(self.last_heard, now)
        if self.negotiated:
            self.next_heartbeat = now

    def negotiate(self, now: float) -> None:
        """Queue CHECKCONFIG (C1); nothing but CHECKCONFIG goes out until it is answered."""
        self.checkconfig_sent_at = now
        self.negotiated = False
        self.retry_at = None
        self.next_heartbeat = math.inf
        self.outbox.append(
            CheckConfig(
                self.config_type,
                self.config_version or None,
                self.client_id,
                signed=self.trust is not None,
                protocol=self.protocol,
            ).to_frames()
        )

    def leave(self) -> None:
        """The owner leaves this broker (C7, W3): nothing more goes out until :meth:`reset`."""
        self.move_to = None
        self.negotiated = False
        self.next_heartbeat = math.inf
        self.retry_at = None
        self.outbox.clear()

    def heard(self, now: float) -> None:
        """Any message from the broker counts as a heartbeat (§3.4)."""
        self.last_heard = now

    def note_work(self, now: float) -> None:
        """The owner has work now (a request sent or received, a reply): not idle for
        ``liveness`` intervals from now; an idle link beats at its interval again (§3.4)."""
        self.last_work = now
        if self.idle:
            self.idle = False
            self.next_heartbeat = min(self.next_heartbeat, now + self.interval_s)

    @property
    def expect_s(self) -> float:
        """The broker's interval we hold it to: ours, or longer if its last HEARTBEAT promised
        so (§3.4); it is dead after ``liveness`` of them."""
        return max(self.interval_s, self.broker_interval_s)

    def handle(self, message: Message, now: float) -> LinkEvent | None:
        """Act on a control message; returns what the owner must do, if anything."""
        if isinstance(message, Config) and self.trust is not None:
            return self._checked(message, now)
        if isinstance(message, Config):
            self.config = ClientConfig(
                message.config_version,
                message.client_id,
                message.config_type,
                message.sha256,
                parse_config_document(message.config_type, message.document),
            )
            return self._negotiated(message.client_id, now)
        if isinstance(message, ConfigAck) and self.trust is not None:
            if self.config is None or self.config.version != message.config_version:
                # S3: we asked with our verified version; an ack of another one is no config.
                return self._untrusted(
                    UntrustedConfig(
                        f"CONFIGACK of config_version {message.config_version}, which we never "
                        "verified",
                        version=message.config_version,
                        sender=self.endpoint,
                    )
                )
            return self._negotiated(message.client_id, now)
        if isinstance(message, ConfigAck):
            if self.config is None or self.config.version != message.config_version:
                self.config = ClientConfig(
                    message.config_version, message.client_id, self.config_type
                )
            return self._negotiated(message.client_id, now)
        if isinstance(message, Heartbeat):
            if message.hbeatinterval_ms is not None:
                self._raise_interval(message.hbeatinterval_ms / 1000)
            self.broker_interval_s = (message.interval_ms or 0) / 1000
            return None
        if isinstance(message, ForceNegotiate):
            # Several messages sent before our CHECKCONFIG (a HEARTBEAT and a REQUEST after an
            # idle spell) each earn one; a CHECKCONFIG younger than an interval answers them all.
            if self.negotiated or now - self.checkconfig_sent_at >= self.interval_s:
                log.info("broker asks to renegotiate: %s", message.reason)
                self.negotiate(now)
            return None
        if isinstance(message, Disconnect):
            self.negotiated = False
            self.next_heartbeat = math.inf
            self.leave_reason = "broker said DISCONNECT"
            return LinkEvent.RECONNECT
        if isinstance(message, DisconnectError):
            return self._refused(message, now)
        return None

    def _checked(self, message: Config, now: float) -> LinkEvent:
        """S1-S3: use the CONFIG only if it verifies; otherwise leave this broker."""
        assert self.trust is not None
        try:
            verified = self.trust.check(message, sender=self.endpoint)
        except UntrustedConfig as exc:
            return self._untrusted(exc)
        self.untrusted = None
        self.config = ClientConfig(
            verified.version,
            message.client_id,
            message.config_type,
            verified.sha256,
            verified.document,
        )
        return self._negotiated(message.client_id, now)

    def _untrusted(self, error: UntrustedConfig) -> LinkEvent:
        # S3: the verified config stays; a broker that hands us a config we cannot trust is
        # left like one that refuses us (503), so failover (V3) tries the next known broker.
        log.error("%s; keeping the last verified config", error)
        self.untrusted = error
        self.negotiated = False
        self.next_heartbeat = math.inf
        self.leave_reason = f"untrusted config: {error.reason}"
        return LinkEvent.RECONNECT

    def _negotiated(self, client_id: str, now: float) -> LinkEvent:
        self.client_id = client_id
        self.negotiated = True
        self.retry_at = None
        self.refusal = None
        self.negotiated_at = now
        if self.config is not None:
            default_ms = self.config.number("default_heartbeat_interval_ms")
            if default_ms is not None and default_ms > 0:
                self._raise_interval(default_ms / 1000)
            liveness = self.config.number("liveness")
            if liveness is not None and liveness >= 1:
                self.liveness = int(liveness)
            idle_ms = self.config.number("idle_heartbeat_interval_ms")
            self.idle_interval_s = idle_ms / 1000 if idle_ms is not None and idle_ms > 0 else 0.0
        self.last_work = now
        self.idle = False
        self.next_heartbeat = now + self.interval_s
        return LinkEvent.NEGOTIATED

    def _raise_interval(self, interval_s: float) -> None:
        self.interval_s = max(self.requested_interval_s, interval_s)

    def _refused(self, error: DisconnectError, now: float) -> LinkEvent:
        # Every DISCONNECTERROR ends the session at the broker (§3.8).
        log.warning("broker refused: %d %s", error.code, error.message)
        self.negotiated = False
        self.next_heartbeat = math.inf
        self.refusal = error
        if error.code in (301, 503):
            # §3.8/§6.4: go where we are told, or to another broker of the family (V3).
            self.move_to = error.endpoint if error.code == 301 else None
            self.leave_reason = f"DISCONNECTERROR {error.code} {error.message}"
            return LinkEvent.RECONNECT
        if error.code == 401:
            return LinkEvent.STOP
        if error.code == 426:
            self.negotiate(now)
            return LinkEvent.REFUSED
        if error.code == 409:
            self.client_id = None  # "picks another id": let the broker assign one
        # 400, 403, 409, 412, 429, 501 and anything unknown: back off, then CHECKCONFIG.
        # Backing off even where §3.8 allows an immediate retry keeps a worker whose READY
        # the broker refuses (400) from looping at full speed.
        self.retry_at = now + backoff_delay(self._refusals, jitter=self._jitter)
        self._refusals += 1
        return LinkEvent.REFUSED

    def tick(self, now: float, wall: float) -> bool:
        """Fire due timers (renegotiation, heartbeat); True when the broker counts as dead."""
        if self.retry_at is not None and now >= self.retry_at:
            self.negotiate(now)
        if self.negotiated and now - self.negotiated_at > self.liveness * self.interval_s:
            self._refusals = 0  # a session that lasted: the next refusal starts back-off afresh
        if self.busy:
            self.last_work = now
        if self.negotiated and now >= self.next_heartbeat:
            # §3.4: idle for liveness intervals, it beats at the idle interval, promising it.
            idle = (
                self.idle_interval_s > self.interval_s
                and not self.busy
                and now - self.last_work >= self.liveness * self.interval_s
            )
            promise = round(self.idle_interval_s * 1000) if idle else None
            self.outbox.append(
                Heartbeat(
                    wall, self.config_version, interval_ms=promise, protocol=self.protocol
                ).to_frames()
            )
            self.idle = idle
            self.next_heartbeat = now + (self.idle_interval_s if idle else self.interval_s)
        return now - self.last_heard > self.liveness * self.expect_s

    def silence_reason(self) -> str:
        """Why :meth:`tick` said the broker is dead, for the failover log line (V6)."""
        state = "answered nothing" if self.negotiated else "did not answer CHECKCONFIG"
        return f"{state} for {self.liveness * self.expect_s:.3g} s"

    @property
    def settle_s(self) -> float:
        """How long a session must have lasted for the next move to be immediate (V5)."""
        return self.liveness * self.interval_s

    def next_wakeup(self) -> float:
        """The monotonic time of the next timer :meth:`tick` must see."""
        wake = self.last_heard + self.liveness * self.expect_s
        if self.negotiated:
            wake = min(wake, self.next_heartbeat)
        if self.retry_at is not None:
            wake = min(wake, self.retry_at)
        return wake

    def decode(self, frames: Sequence[bytes]) -> Message | None:
        """Decode a message from the broker; None (logged, §2.4) when it is garbage."""
        try:
            return decode_from_broker(
                frames, signature=self.protocol, max_frame_bytes=MAX_FRAME_BYTES
            )
        except ProtocolError as exc:
            log.warning("undecodable message from broker dropped: %s", exc)
            return None
