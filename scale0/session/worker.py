"""A worker's session with its broker without the socket: READY, leaving, stopping (W1-W3, W6).

Pure: ``now`` (monotonic) and ``wall`` (UNIX time, carried by READY and HEARTBEAT) are passed
in. ``scale0.net.worker`` opens the DEALER, sends :attr:`outbox`, hands each received message to
:meth:`WorkerSession.receive` and runs the REQUESTs it returns; the rules are in that module's
docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

from scale0.session.failover import Failover, Move
from scale0.session.link import BrokerLink, LinkEvent
from scale0.wire.worker import MAX_CAPACITY, Ready, WorkerIdRequest, WorkerRequest

__all__ = ["WorkerSession"]


class WorkerSession:
    """One worker's link to the broker in use and the choice of the next one.

    After :meth:`receive` or :meth:`tick`, :attr:`move` set means "leave now, connect to
    ``move.endpoint`` at ``move.at``" (W3, W6) and :attr:`stopped` means "stop serving" (401).
    :attr:`registered` is true while READY has gone out on the current connection.
    """

    def __init__(
        self,
        link: BrokerLink,
        failover: Failover,
        services: Sequence[str],
        capacity: int,
    ) -> None:
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be 1..{MAX_CAPACITY}")
        if not services:
            raise ValueError("a worker needs at least one service")
        self.link = link
        self.failover = failover
        self.services = tuple(services)
        self.capacity = capacity
        self.registered = False
        self.stopped = False
        self.move: Move | None = None

    @property
    def outbox(self) -> list[list[bytes]]:
        """Frames to send on the current socket, in order (the owner empties it)."""
        return self.link.outbox

    def ended(self) -> bool:
        """True once this connection is over: leaving (``move``) or stopped."""
        return self.move is not None or self.stopped

    def arrived(self, now: float) -> None:
        """A new DEALER is connected to ``failover.current``: start at W1."""
        self.move = None
        self.registered = False
        self.link.endpoint = self.failover.current
        self.link.reset(now)

    def receive(
        self, frames: Sequence[bytes], now: float, wall: float
    ) -> WorkerRequest | WorkerIdRequest | None:
        """One message from the broker; a REQUEST is returned for the owner to run."""
        link = self.link
        link.heard(now)
        message = link.decode(frames)
        if message is None:
            return None
        if self.ended():
            # Still queued from the broker we are leaving: one move per departure, and no new
            # work from it (it retries what it sent us elsewhere; W3, W4).
            return None
        if isinstance(message, WorkerRequest | WorkerIdRequest):
            link.note_work(now)  # W2: it holds a request: its interval again (§3.4)
            return message
        event = link.handle(message, now)
        if event is LinkEvent.NEGOTIATED:
            self.failover.negotiated(now)
            if link.config is not None:
                self.failover.learn(link.config.document)
            link.outbox.append(self.ready_frames(wall))
            self.registered = True
        elif event is LinkEvent.RECONNECT:
            self._leave(link.leave_reason, now, link.move_to)
        elif event is LinkEvent.STOP:
            self.stop()
        elif event is LinkEvent.REFUSED:
            self.registered = False
        return None

    def tick(self, now: float, wall: float, busy: bool = False) -> None:
        """Timers: heartbeats and renegotiation (W2, C3); a silent broker is left (W3).
        ``busy``: the worker holds a request now (it does not go idle, §3.4)."""
        self.link.busy = busy
        if self.move is None and not self.stopped and self.link.tick(now, wall):
            self._leave(self.link.silence_reason(), now, None)

    def stop(self) -> None:
        """Stop serving (W5): nothing more goes out but what the owner says itself."""
        self.stopped = True
        self.registered = False
        self.link.outbox.clear()

    def next_wakeup(self) -> float:
        """The monotonic time :meth:`tick` must next run (or the move is due)."""
        return self.move.at if self.move is not None else self.link.next_wakeup()

    def ready_frames(self, wall: float) -> list[bytes]:
        """READY with the services, the interval in force and our config_version (W1, W2)."""
        link = self.link
        return Ready(
            services=self.services,
            heartbeat=True,
            hbeatinterval_ms=max(1, round(link.interval_s * 1000)),
            time=wall,
            config_version=link.config_version,
            capacity=self.capacity,
            request_ids=True,  # W7: each REQUEST names its client and request (§4.3)
        ).to_frames()

    def _leave(self, reason: str, now: float, redirect: str | None) -> None:
        self.registered = False
        self.link.leave()
        self.move = self.failover.leave(reason, now, settle_s=self.link.settle_s, redirect=redirect)
