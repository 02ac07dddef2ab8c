"""The broker process's I/O: its ROUTER sockets, the one timer and the clock; decides nothing.

:class:`BrokerNode` binds the frontend and backend ROUTERs, turns what arrives into core events
(``Received`` / ``Malformed``), feeds ``Tick`` when the core's next deadline is due and
``Shutdown`` on stop, and performs the effects the core returns (``Send`` -> socket, ``Log`` ->
the JSON logger) in order. Every decision lives in :class:`scale0.core.broker.Broker`.

Hot path (docs/performance.md): every socket is a :class:`_Port` in one registry, and every
port's ZMQ FD is registered with the Tornado IOLoop. A wake-up, from whichever FD, runs rounds:
each round reads, in one batch per port (scale0.net.frames_io), what every *dirty* port has
waiting (up to the wake-up's budget), then sends what the round produced; rounds repeat until
no port is dirty. So a worker's REPLY and the client REQUEST it lets through are handled in one
wake-up, not two. A send may swallow a socket's FD edge, so a port sent on is dirty until a
batch read after that send ends on its empty socket (see ``_pump``); that is what lets the
loop sleep safely. A wake-up whose budget ran out schedules its own continuation so the timer
and other loop work still get their turn. All broker timers live in the core's heap; the node
keeps exactly one IOLoop timeout, for ``broker.next_deadline()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import zmq
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from tornado.ioloop import IOLoop

from scale0.config.lastgood import LastGood, write_last_good
from scale0.config.model import BrokerConfig, NetworkConfig
from scale0.core.broker import Broker
from scale0.core.effects import (
    Authenticate,
    Authenticated,
    Channel,
    Close,
    ConfigOffered,
    ConfigRead,
    Connect,
    Connected,
    Disconnected,
    Drain,
    Drained,
    Effect,
    Event,
    FanOut,
    Hangup,
    Log,
    Malformed,
    ManagementSubmit,
    Persist,
    Publish,
    ReadConfig,
    Received,
    RequestDone,
    Send,
    Shutdown,
    Start,
    Subscribe,
    Tick,
)
from scale0.core.ledger import CPoolLedger
from scale0.core.replica import Offer
from scale0.crypto.curve import CurveKeyPair
from scale0.net.admin import ManagementBridge
from scale0.net.eventlog import BrokerEventLog
from scale0.net.frames_io import (
    IMPLEMENTATION,
    IoKey,
    batch_fds,
    hot_items,
    io_key,
    recv_batch,
    recv_batch_keyed,
    send_batch,
    send_frames,
    track_connections,
)
from scale0.net.frames_io import events as socket_events
from scale0.net.lane import (
    LANE_BUILT,
    LANE_CHANNELS,
    LaneMirror,
    lane_heads,
    lane_wanted,
    open_lane,
)
from scale0.net.logs import LOGGER_NAME, level_number, log_event
from scale0.net.security import (
    HANDSHAKE_FAILED,
    Gatekeeper,
    HandshakeWatch,
    make_client,
    make_server,
    plain_client,
    server_key_for,
)
from scale0.trend.eventlog import EventLogWriter
from scale0.wire.admin import ManagementReply
from scale0.wire.configsync import TOPIC, decode_config_publication
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import CHECKED_NAMES, SIG_BROKER, SIG_CLIENT, SIG_WORKER, Message
from scale0.wire.hot import (
    HotItem,
    client_request_fields,
    heartbeat_fields,
    mdp_client_request_fields,
    mdp_worker_reply_fields,
    worker_reply_fields,
)
from scale0.wire.mdp import MDPC01, MDPC02, MDPW01, MDPW02
from scale0.wire.registry import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    PEER_SIGNATURES,
    decode_from_broker,
    decode_to_broker,
)

__all__ = ["BindError", "BrokerNode", "inbound_size_limit"]

T = TypeVar("T")

#: Messages read per wake-up (all sockets together) before the loop lets other work run.
DEFAULT_BATCH_SIZE: Final = 512
#: Send/receive high-water mark per peer pipe: bounds what one slow or flooding peer can queue.
DEFAULT_HWM: Final = 1_000
#: How long stop() lets queued DISCONNECTs drain before the sockets are dropped.
DEFAULT_FLUSH_MS: Final = 250

_logger = logging.getLogger(f"{LOGGER_NAME}.broker")


def inbound_size_limit(max_frame_bytes: int) -> int:
    """ZMQ_MAXMSGSIZE for the broker's sockets: a memory guard well above ``max_frame_bytes``.

    A frame between ``max_frame_bytes`` and this limit reaches the core as a 400 (§2.3); a frame
    beyond it is refused by libzmq itself, which drops the connection without buffering the
    frame, so a hostile peer cannot make the broker allocate gigabytes before it is judged.
    """
    return 2 * max_frame_bytes + 65_536


class BindError(Exception):
    """A broker socket could not bind; ``channel``, ``endpoint`` and ``reason`` say which/why."""

    def __init__(self, channel: Channel, endpoint: str, reason: str, errno_: int) -> None:
        self.channel = channel
        self.endpoint = endpoint
        self.reason = reason
        self.errno = errno_
        super().__init__(f"cannot bind the {channel.value} socket to {endpoint}: {reason}")


PortKind = Literal["router", "dealer", "sub", "monitor", "links"]

#: What a ROUTER's monitor reports (R20): a connection accepted, a connection ended.
_MONITOR_EVENTS: Final = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_POLLIN: Final = int(zmq.POLLIN)
_MONITOR_HEAD = struct.Struct("<HI")  # ZMTP monitor frame 1: event, value (the fd here)

#: A port's fast path: effects for a message it recognises (given the frames, the monotonic and
#: the wall clock), None to take the typed path.
FastPath = Callable[[list[bytes], float, float], "list[Effect] | None"]


@dataclass(slots=True)
class _Port:
    """One socket the loop reads: a bound ROUTER, a peer link (DEALER) or the config SUB.

    ``fast`` (optional) handles the port's hot message from raw frames; everything it declines,
    and everything on a port without one, goes decode -> ``Broker.handle``.
    """

    channel: Channel
    socket: zmq.Socket[bytes]
    fd: int
    signatures: Collection[bytes]
    endpoint: str
    kind: PortKind = "router"
    link: bytes = b""  # a DEALER's link id: the routing id its messages reach the core with
    closed: bool = False  # closed by an effect while the loop may still hold it
    fast: FastPath | None = None
    # CURVE server (net/security.py): read with each sender's key; the key last seen per
    # routing id, so the core hears of a routing id's key once (Authenticated), not per message.
    keyed: bool = False
    keys: dict[bytes, str] = field(default_factory=dict)
    io: IoKey = field(init=False)  # names the socket to recv_batch/send_batch (frames_io)
    # May have messages waiting that its FD will not announce (BrokerNode._pump): new, FD
    # fired, a message waits after a send on it, or its last batch stopped at the budget.
    # Cleared by a batch that ends on an empty socket.
    dirty: bool = True
    # A message for it waits in the round's outbox: when the outbox is sent (_flush) its
    # events are read, and it becomes dirty if a message waits.
    sending: bool = False
    # The loop's end of a lane pipe (scale0/net/lane.py) standing for the ROUTER: each message
    # read has a header frame first (its connection, its sender's key).
    lane: bool = False
    lane_read: int = 0  # messages read from the pipe, and the last count told the lane
    lane_marked: int = 0

    def __post_init__(self) -> None:
        self.io = io_key(self.socket)


class BrokerNode:
    """Runs one :class:`Broker` core on real sockets in a Tornado IOLoop.

    Life cycle: ``start()`` (binds, registers with the loop, logs ``broker_ready``; raises
    :class:`BindError`), then the loop runs; ``stop()`` (idempotent) tells the core ``Shutdown``,
    sends its DISCONNECTs, closes the sockets after a short flush and wakes :meth:`serve`.
    ``await node.serve()`` does start + wait-until-stopped; every method must be called on the
    loop's thread (from elsewhere use ``loop.add_callback(node.stop)``).
    """

    def __init__(
        self,
        broker_config: BrokerConfig,
        network: NetworkConfig | None,
        *,
        signature: str | None,
        view_signature: str | None = None,
        loop: IOLoop | None = None,
        boot_id: bytes | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        hwm: int = DEFAULT_HWM,
        flush_ms: int = DEFAULT_FLUSH_MS,
        trusted_keys: Sequence[Ed25519PublicKey] = (),
        data_dir: Path | None = None,
        reload: Callable[[], Offer] | None = None,
        event_log_dir: Path | None = None,
        curve: CurveKeyPair | None = None,
        serve_curve: bool = False,
    ) -> None:
        """``event_log_dir``: write the event log there (docs/trend.md), None: no event log.
        ``curve``: this broker's CURVE key pair, with which it connects to brokers that serve
        CURVE; ``serve_curve``: its own sockets serve CURVE too (needs ``curve``).
        With ``broker_config.lane`` the frontend and backend ROUTERs run in the C lane
        (scale0/net/lane.py) where it is built; ``SCALE0_LANE`` overrides it."""
        self.identity = broker_config.identity
        self._broker_config = broker_config
        self._data_dir = data_dir
        self._event_log_dir = event_log_dir
        #: The event log while the node runs with one (created by start(), closed by stop()).
        self.event_log: BrokerEventLog | None = None
        self._reload = reload  # reads and signs a config source's file (SIGHUP, reload_config)
        self._loop = loop
        self._batch_size = max(1, batch_size)
        self._hwm = hwm
        self._flush_ms = flush_ms
        self.broker = Broker(
            broker_config.identity,
            network,
            state=broker_config.state,
            boot_id=boot_id if boot_id is not None else os.urandom(8),
            signature=signature,
            view_signature=view_signature,
            now=time.monotonic(),
            trusted_keys=trusted_keys,
            family=broker_config.family,
            seeds=broker_config.seeds,
            config_subs=broker_config.config_sub_ports,
            config_source=broker_config.config_source,
            own_ports={
                "frontend": broker_config.frontend_port,
                "backend": broker_config.backend_port,
                "peer": broker_config.peer_port,
                "config_pub": broker_config.config_pub_port,
            },
        )
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        # Every socket the loop reads, by name: "frontend", "backend", "peer", "config" (SUB)
        # and "link:<id>" for each peer link; the PUB is only written to.
        self._ports: dict[str, _Port] = {}
        self._pub: zmq.Socket[bytes] | None = None
        self._subscribed: set[str] = set()
        self._continue_scheduled = False
        # Encoded messages of the current round: (port.io, first frame, the rest), see _flush().
        self._outbox: list[tuple[IoKey, bytes, list[bytes]]] = []
        self._endpoints: dict[Channel, str] = {}
        self._timer: object | None = None
        self._timer_deadline: float | None = None
        self._started = False
        self._stopped = False
        self._draining = False
        self._grace_timer: object | None = None
        self._closed = asyncio.Event()
        self._counters: dict[str, int] = {
            "received": 0,
            "malformed": 0,
            "banned_dropped": 0,
            "sent": 0,
            "send_dropped": 0,
            "internal_errors": 0,
            "wakeups": 0,
            "rounds": 0,
            "ticks": 0,
            "published": 0,
            "persist_failed": 0,
            "curve_refused": 0,  # ZAP said no (net/security.py)
            "curve_handshake_failed": 0,  # a CURVE/NULL handshake failed (HandshakeWatch)
            "hung_up": 0,
        }
        # Open frontend and backend connections by fd (their monitors' word), for Hangup.
        self._conn_channels: dict[int, Channel] = {}
        # Of them, those the fast path has not yet seen negotiated (one set lookup a message).
        self._fresh: set[int] = set()
        #: The message _perform encoded last, and its frames (see there).
        self._last_encoded: tuple[Message | None, list[bytes]] = (None, [])
        # Management (scale0/net/admin.py): credential checks off the loop, family fan-out,
        # and sinks for channels that are not sockets (the HTTP server, scale0/mgmt).
        self.broker.io_counters = self._counters
        self.management = ManagementBridge(self.feed, lambda: self.broker.network.admins, _logger)
        self._sinks: dict[Channel, Callable[[bytes, Message], None]] = {}
        # CURVE (scale0/net/security.py): our key pair, the seeds' keys, ZAP while we run.
        self._curve = curve
        seeds = broker_config.seeds
        self._seed_keys = dict(zip(seeds, broker_config.seed_curve_keys, strict=False))
        self._gate: Gatekeeper | None = None
        self._serve_curve = serve_curve and curve is not None
        self.broker.core.curve = self._serve_curve
        self.management.curve_for = self._management_curve
        self._watch: HandshakeWatch | None = None  # handshake failures (monitors), see start()
        self._used_keys: dict[str, str | None] = {}  # "link:<id>" / "sub:<endpoint>" -> key
        self._redo: set[str] = set()  # connections to open again after a failed handshake
        self._fail_logged: dict[str, float] = {}
        # The lane (scale0/net/lane.py): wanted, running (the C object, and the same spoken
        # to in the core's channels), the sockets it owns while it runs (closed after it
        # stops), and the config it was last told.
        self._lane_wanted = lane_wanted(broker_config.lane)
        self._lane: Any = None
        self._mirror: LaneMirror | None = None
        self._lane_sockets: list[zmq.Socket[bytes]] = []
        self._lane_told: tuple[int, float] | None = None
        # What the lane was last told it may do with requests (Broker.lane_serves), None: never
        # (a lane on a Python pool takes only HEARTBEATs)
        self._lane_serving: tuple[bool, float, int, bytes, int, bool] | None = None
        # The lane records each request it answers for the event log (its done ring)
        self._lane_records = False
        self._lane_requests = False
        # Phase 4b: the links the lane owns (their ports, not read by the loop), and those it
        # was told to let go of, closed once it says it has (released_links)
        self._lane_links: dict[str, _Port] = {}
        self._lane_releasing: list[tuple[bytes, zmq.Socket[bytes]]] = []
        # A link connected again while the lane still lets go of the one before (the same id:
        # it refuses a second until released_links lists it): handed over once it is released
        self._lane_pending_links: dict[str, _Port] = {}

    # ---- public ---------------------------------------------------------------------------

    def offer_config(self, offer: Offer, source: str) -> None:
        """Judge a network config (from the disk, the file on SIGHUP, an admin); F10."""
        self._feed(ConfigOffered(offer, source))
        if self._started:
            self._pump()  # its sends may have swallowed a socket's FD edge

    def log_problem(self, event: str, reason: str) -> None:
        self._log(logging.ERROR, event, {"reason": reason})

    @property
    def endpoints(self) -> dict[Channel, str]:
        """The endpoints actually bound (port 0 resolved), by channel; empty before start().

        Still answers after stop(), so a test can restart a broker on the same ports.
        """
        return dict(self._endpoints)

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    def stats(self) -> dict[str, int]:
        """The core's counters plus the node's own, prefixed ``net_``."""
        merged = dict(self.with_core(Broker.stats))
        merged.update({f"net_{key}": value for key, value in self._counters.items()})
        if self._lane is not None:
            merged.update({f"lane_{key}": value for key, value in self._lane.stats().items()})
        return merged

    def with_core(self, read: Callable[[Broker], T]) -> T:
        """``read(broker)`` on the loop thread, with the lane's lock held while a lane shares
        the core's pool (what the core reads is then what the lane has done, and the pool may
        be read: docs/architecture.md "Phase 3b"); what the lane heard and did is told to the
        core first, so the counters read include it."""
        lane = self._lane
        if lane is None:
            return read(self.broker)
        lane.lock()
        try:
            self._lane_heard()
            return read(self.broker)
        finally:
            lane.unlock()

    def add_sink(self, channel: Channel, sink: Callable[[bytes, Message], None]) -> None:
        """Deliver the core's sends on ``channel`` (not a socket) to ``sink(routing_id, msg)``."""
        self._sinks[channel] = sink

    def feed(self, event: Event) -> None:
        """Hand the core an event from outside the sockets (management); on the loop thread."""
        if self._stopped:
            return
        if self.event_log is not None and isinstance(event, ManagementSubmit) and event.session_ok:
            self.event_log.management_asked(event.channel, event.routing_id, event.request)
        self._feed(event)
        self._pump()  # its sends may have swallowed a socket's FD edge

    def start(self) -> None:
        """Bind the sockets, register them with the loop and arm the timer."""
        if self._started:
            raise RuntimeError("BrokerNode.start() called twice")
        if self._loop is None:
            self._loop = IOLoop.current()
        self._context = zmq.Context()
        config = self._broker_config
        self._watch = HandshakeWatch(self._loop, self._handshake_failed)
        try:
            self._start_gate()
            for channel, port_number, signatures, fast in (
                (Channel.FRONTEND, config.frontend_port, FRONTEND_SIGNATURES, self._fast_request),
                (Channel.BACKEND, config.backend_port, BACKEND_SIGNATURES, self._fast_reply),
                (Channel.PEER, config.peer_port, PEER_SIGNATURES, None),
            ):
                port = self._bind(channel, f"tcp://{config.bind_address}:{port_number}", signatures)
                port.fast = fast
                # Read before its ROUTER in each round: a connection is known before it speaks.
                self._ports["monitor:" + channel.value] = self._monitor(port)
                self._ports[channel.value] = port
            self._pub = self._bind_pub(f"tcp://{config.bind_address}:{config.config_pub_port}")
            self._ports["config"] = self._sub_port()
            if self._lane_wanted and LANE_BUILT:
                self._start_lane()
        except BaseException:
            self._close_sockets(linger_ms=0)
            raise
        if self._event_log_dir is not None:
            try:
                writer = EventLogWriter(self._event_log_dir, self.identity).start()
            except BaseException:
                self._close_sockets(linger_ms=0)
                raise
            self.event_log = BrokerEventLog(writer)
            self.broker.event_log = self.event_log.stats  # the core reports RequestDone now
            self.event_log.started()
            if self._lane is not None and self._lane_requests:  # and the lane, what it answers
                self._lane.record_done(True)
                self._lane_records = True
        self._started = True
        self._endpoints = {
            port.channel: port.endpoint
            for port in self._ports.values()
            if port.kind == "router"  # (not the monitors, nor the lane's links pipe)
        }
        self._endpoints.pop(Channel.CONFIG, None)
        self._config_pub_endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        loop = self._loop
        for port in self._ports.values():
            loop.add_handler(port.fd, _FdHandler(self, port), IOLoop.READ)
        self._log(
            logging.INFO,
            "broker_ready",
            {
                "endpoints": self.endpoint_names(),
                "state": self.broker.state,
                "family": self.broker.network.family,
                "config_version": self.broker.network.config_version,
                "pid": os.getpid(),
                "io": IMPLEMENTATION,  # "c" or "pyzmq" (scale0.net.frames_io)
                "pool": self.broker.ledger.pool,  # "c" or "python" (scale0.core.ledger)
                "lane": self._lane_state(),
                "lane_requests": self._lane_requests,  # it dispatches requests (phase 3b)
            },
        )
        self._feed(Start())
        # Messages may have queued between bind and add_handler: the FD edge is gone by now.
        self._schedule_continue()
        self._reschedule_timer()

    def stop(self) -> None:
        """Shutdown: DISCONNECT everyone (core effects), flush briefly, close; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._started:
                loop = self._loop
                assert loop is not None  # set by start()
                for port in self._ports.values():
                    loop.remove_handler(port.fd)
                if self._timer is not None:
                    loop.remove_timeout(self._timer)
                    self._timer = None
                if self._grace_timer is not None:
                    loop.remove_timeout(self._grace_timer)
                    self._grace_timer = None
                self._feed(Shutdown())
                self._log(logging.INFO, "broker_stopped", {"stats": self.stats()})
        finally:
            self.management.close()
            self._stop_gate()
            self._close_sockets(linger_ms=self._flush_ms)
            self._close_event_log()
            self._closed.set()

    def _close_event_log(self) -> None:
        """Last at a stop: worker_leave (shutdown), broker_stop, the writer's last file renamed."""
        events = self.event_log
        if events is None:
            return
        self.broker.event_log = None
        try:
            if not events.stopped():
                self._log(
                    logging.ERROR, "event_log_close_timeout", {"stats": events.writer.stats()}
                )
        except Exception:  # a full disk at the last rename: say so, the stop goes on
            self._counters["internal_errors"] += 1
            self._log(logging.ERROR, "event_log_close_failed", exc_info=True)

    def drain(self, grace_s: float) -> None:
        """Graceful stop (SIGTERM, SIGINT; docs/operations.md "Stopping a broker"): the core
        takes no new work and moves clients and workers away as their requests end (R18-R19);
        once nothing is in flight, or after ``grace_s``, :meth:`stop`. A second call stops at
        once. Idempotent after stop."""
        if self._stopped:
            return
        if not self._started or self._draining or grace_s <= 0:
            self.stop()
            return
        self._draining = True
        assert self._loop is not None  # set by start()
        self._grace_timer = self._loop.call_later(grace_s, self._drained, -1)
        self.feed(Drain(grace_ms=round(grace_s * 1000)))

    def _drained(self, unfinished: int) -> None:
        """Nothing is in flight any more (0), or the grace ran out (-1: count what is left)."""
        if self._stopped:
            return
        if unfinished < 0:
            unfinished = self.broker.stats()["in_flight"]
        if self._grace_timer is not None and self._loop is not None:
            self._loop.remove_timeout(self._grace_timer)
            self._grace_timer = None
        self._log(logging.INFO, "broker_drained", {"unfinished": unfinished})
        # Stop after this round: the core's last answers are still in the outbox.
        assert self._loop is not None
        self._loop.add_callback(self.stop)

    def endpoint_names(self) -> dict[str, str]:
        """Bound endpoints by name, as --endpoints-file writes them (config_pub included)."""
        names = {channel.value: endpoint for channel, endpoint in self._endpoints.items()}
        if self._started:
            names["config_pub"] = self._config_pub_endpoint
        return names

    async def serve(self) -> None:
        """Start (unless started) and return once :meth:`stop` has run."""
        if not self._started:
            self.start()
        await self._closed.wait()

    # ---- sockets --------------------------------------------------------------------------

    def _bind(self, channel: Channel, endpoint: str, signatures: Collection[bytes]) -> _Port:
        sock = self._bound_socket(
            zmq.ROUTER,
            channel,
            endpoint,
            # Off: a reply to a client that vanished is dropped, not an EHOSTUNREACH (§2).
            (zmq.ROUTER_MANDATORY, 0),
            (zmq.RCVHWM, self._hwm),
            (zmq.MAXMSGSIZE, inbound_size_limit(self.broker.max_frame_bytes)),
            # The peer port: a link that reconnects keeps its routing id (it sets one, see
            # _connect_link), and the new connection takes it over from the dead one.
            *([(zmq.ROUTER_HANDOVER, 1)] if channel is Channel.PEER else []),
        )
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        # A failed handshake (CURVE served here) is logged with no sender, told by the port's
        # connection monitor (_monitor): a socket has only one libzmq monitor.
        return _Port(channel, sock, _fd_of(sock), signatures, bound, keyed=self._serve_curve)

    def _monitor(self, port: _Port) -> _Port:
        """A PAIR that hears ``port``'s connections open and end (R20, docs/protocol.md §8.1).

        Its receive high-water mark is 0 (none): a flood of connections must not drop the
        events that keep the connection table true."""
        assert self._context is not None
        track_connections(port.socket)  # batch_fds names each message's connection
        address = f"inproc://scale0-monitor-{id(self)}-{port.channel.value}"
        events = _MONITOR_EVENTS | (HANDSHAKE_FAILED if port.keyed else 0)
        port.socket.monitor(address, events)
        sock: zmq.Socket[bytes] = self._context.socket(zmq.PAIR)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(address)
        return _Port(port.channel, sock, _fd_of(sock), (), address, kind="monitor")

    def _bind_pub(self, endpoint: str) -> zmq.Socket[bytes]:
        return self._bound_socket(zmq.PUB, Channel.CONFIG, endpoint)

    def _bound_socket(
        self, kind: int, channel: Channel, endpoint: str, *options: tuple[int, int]
    ) -> zmq.Socket[bytes]:
        """A socket of ``kind`` with linger 0, the send HWM and ``options``, bound to
        ``endpoint``; BindError (closing the socket) when it cannot bind."""
        assert self._context is not None
        sock: zmq.Socket[bytes] = self._context.socket(kind)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self._hwm)
            for option, value in options:
                sock.setsockopt(option, value)
            if self._serve_curve and self._curve is not None:
                make_server(sock, self._curve, channel.value)
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            # pyzmq's strerror repeats the address; the plain OS text reads better after ours.
            reason = os.strerror(exc.errno) if exc.errno else exc.strerror
            raise BindError(channel, endpoint, reason, exc.errno or 0) from None
        return sock

    def _sub_port(self) -> _Port:
        """The config SUB: connected later, to whatever the core asks (Subscribe effects)."""
        assert self._context is not None
        sock: zmq.Socket[bytes] = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self._hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, inbound_size_limit(self.broker.max_frame_bytes))
        sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self._fast_reconnect(sock)
        return _Port(Channel.CONFIG, sock, _fd_of(sock), (), "", kind="sub")

    def _connect_link(self, link: str, endpoint: str) -> None:
        """A DEALER to a peer's ROUTER (§5); IMMEDIATE so nothing queues for a dead peer."""
        assert self._context is not None and self._loop is not None
        self._close_link(link)
        sock: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        sock.setsockopt(zmq.RCVHWM, self._hwm)
        # Its own routing id, random (unguessable: the peer ROUTER hands a routing id over to
        # whoever connects with it) and never starting with 0 (libzmq's own): a reconnect after
        # a cut keeps it, so the peer hears the same link again (F3) instead of a stranger.
        sock.setsockopt(zmq.ROUTING_ID, b"L" + os.urandom(15))
        self._fast_reconnect(sock)
        sock.setsockopt(zmq.MAXMSGSIZE, inbound_size_limit(self.broker.max_frame_bytes))
        try:
            self._used_keys[f"link:{link}"] = self._curve_client(sock, endpoint, f"link:{link}")
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            if self._watch is not None:
                self._watch.unwatch(f"link:{link}")
            sock.close(linger=0)
            self._log(
                logging.ERROR,
                "link_failed",
                {"link": link, "endpoint": endpoint, "error": str(exc)},
            )
            return
        port = _Port(
            Channel.LINK,
            sock,
            _fd_of(sock),
            (SIG_BROKER,),
            endpoint,
            kind="dealer",
            link=link.encode(),
        )
        if self._lane is not None and "links" in self._ports:
            if any(name == link.encode() for name, _ in self._lane_releasing):
                self._lane_pending_links[link] = port  # (handed over once the old one is let go)
            else:
                self._lane_give_link(link, port)
        else:
            self._ports[f"link:{link}"] = port
            self._loop.add_handler(port.fd, _FdHandler(self, port), IOLoop.READ)
        self._log(logging.DEBUG, "link_connect", {"link": link, "endpoint": endpoint})

    def _fast_reconnect(self, sock: zmq.Socket[bytes]) -> None:
        """A link or the config SUB notices a dead connection and reconnects within about one
        heartbeat interval once the network is back (docs/operations.md, "What each fault does
        to a family"). Without this a connection cut for a few seconds stays open in TCP, whose
        retransmissions back off (0.2, 0.4 ... 6.4 s), and the family waited up to ~6 s after
        healing. ZMTP PINGs every interval (answered by the peer's libzmq I/O thread, whatever
        its broker is doing); nothing heard for (liveness + 1) intervals, one more than the
        core's own verdict (F3), so a peer is down and its requests routed again before the
        connection and what is queued on it go; then a new connection every ~interval
        (RECONNECT_IVL: half of it plus libzmq's random jitter below that, no backoff), each
        attempt given at most max(interval, 1 s) to connect (one SYN: a SYN sent into the cut
        would wait for TCP's next retry, 1, 3, 7 s later)."""
        network = self.broker.network
        interval_ms = network.default_heartbeat_interval_ms
        reconnect_ms = max(interval_ms // 2, 50)
        sock.setsockopt(zmq.HEARTBEAT_IVL, interval_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, (network.liveness + 1) * interval_ms)
        sock.setsockopt(zmq.RECONNECT_IVL, reconnect_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, reconnect_ms)
        sock.setsockopt(zmq.CONNECT_TIMEOUT, max(interval_ms, 1000))

    def _close_link(self, link: str) -> None:
        pending = self._lane_pending_links.pop(link, None)
        if pending is not None:  # never handed over: ours to close
            if self._watch is not None:
                self._watch.unwatch(f"link:{link}")
            pending.socket.close(linger=0)
            return
        lane_port = self._lane_links.pop(link, None)
        if lane_port is not None:  # the lane's: it lets go after what we said on it is out
            if self._watch is not None:
                self._watch.unwatch(f"link:{link}")
            self._flush()  # (our DISCONNECT into its pipe first)
            self._lane.remove_link(link.encode())
            self._lane_releasing.append((link.encode(), lane_port.socket))
            return
        port = self._ports.pop(f"link:{link}", None)
        if port is None:
            return
        if self._watch is not None:
            self._watch.unwatch(f"link:{link}")
        self._flush()  # what the core said on this link before closing it (DISCONNECT) goes out
        port.closed = True
        if self._loop is not None:
            self._loop.remove_handler(port.fd)
        # A short linger: a DISCONNECT said just before closing still goes out (§5.5).
        port.socket.close(linger=self._flush_ms)

    def _subscribe(self, endpoints: Iterable[str]) -> None:
        port = self._ports.get("config")
        if port is None:
            return
        wanted = set(endpoints)
        for endpoint in sorted(self._subscribed - wanted):
            # It may never have connected (a bad endpoint was logged when it was tried).
            with contextlib.suppress(zmq.ZMQError):
                port.socket.disconnect(endpoint)
        for endpoint in sorted(wanted - self._subscribed):
            try:
                self._used_keys[f"sub:{endpoint}"] = self._curve_client(
                    port.socket, endpoint, "config"
                )
                port.socket.connect(endpoint)
            except zmq.ZMQError as exc:
                self._log(
                    logging.ERROR, "subscribe_failed", {"endpoint": endpoint, "error": str(exc)}
                )
        self._subscribed = wanted
        port.dirty = True  # connect/disconnect process the socket's commands (see _pump)
        self._log(logging.INFO, "config_subscriptions", {"endpoints": sorted(wanted)})

    def _read_config(self, effect: ReadConfig) -> None:
        """reload_config: the config source's file, read and signed by ``reload`` (the CLI's)."""
        offer: Offer | None = None
        error: str | None = None
        if self._reload is None:
            error = "this broker has no network config file to read"
        else:
            try:
                offer = self._reload()
            except Exception as exc:  # a bad file or key: the admin gets the reason
                error = str(exc)
        self.feed(ConfigRead(effect.channel, effect.routing_id, effect.request_id, offer, error))

    def _persist(self, effect: Persist) -> None:
        if self._data_dir is None:
            return
        try:
            write_last_good(
                self._data_dir,
                LastGood(
                    effect.document,
                    effect.sha256,
                    effect.signature,
                    effect.origin,
                    effect.view_signature,
                ),
            )
        except OSError as exc:
            self._counters["persist_failed"] += 1
            self._log(logging.ERROR, "config_persist_failed", {"error": str(exc)})

    def _close_sockets(self, *, linger_ms: int) -> None:
        if self._watch is not None:
            self._watch.close()
        self._stop_lane()  # (it owns the ROUTERs until it has stopped)
        for port in self._ports.values():
            port.socket.close(linger=linger_ms)
        self._ports.clear()
        for sock in self._lane_sockets:
            sock.close(linger=linger_ms)
        self._lane_sockets.clear()
        if self._pub is not None:
            self._pub.close(linger=0)
            self._pub = None
        if self._context is not None:
            # term() waits for queued messages up to each socket's linger, then releases.
            self._context.term()
            self._context = None

    # ---- CURVE (scale0/net/security.py; docs/operations.md "CURVE") ------------------------

    def _start_gate(self) -> None:
        """ZAP before the first bind: with no handler bound, libzmq would admit every key."""
        if self._curve is None or self._context is None:
            return
        self._gate = Gatekeeper(self._context, lambda: self.broker.network, self._curve_refused)
        self._gate.start()

    def _curve_refused(self, event: str, fields: dict[str, object]) -> None:
        self._counters["curve_refused"] += 1
        self._log(logging.WARNING, event, fields)

    def _stop_gate(self) -> None:
        if self._gate is not None:
            self._gate.stop()
            self._gate = None

    def _curve_client(self, sock: zmq.Socket[bytes], endpoint: str, name: str) -> str | None:
        """Before a connect: CURVE if the broker at ``endpoint`` serves it (its config entry,
        or seed_curve_keys for a seed), with our own key pair; returns the server key used.
        Any connection CURVE touches is watched, so a failed handshake is tried again."""
        server_key = server_key_for(self.broker.network, endpoint, self._seed_keys)
        if server_key is None or self._curve is None:
            if server_key is not None:  # it will refuse us: say why, not fail in silence
                self._log(
                    logging.ERROR,
                    "curve_key_missing",
                    {"endpoint": endpoint, "reason": "it serves CURVE; set curve_secret_key"},
                )
            plain_client(sock)
        else:
            make_client(sock, self._curve, server_key)
        watch = self._watch
        curve_involved = server_key is not None or self._curve is not None
        if watch is not None and curve_involved and not watch.watching(name, sock):
            watch.watch(name, sock)
        return server_key

    def _management_curve(self, endpoint: str) -> tuple[CurveKeyPair, str] | None:
        """A management fan-out to a peer's frontend: CURVE when that broker serves it."""
        server_key = server_key_for(self.broker.network, endpoint, self._seed_keys)
        if server_key is None or self._curve is None:
            return None
        return self._curve, server_key

    def _handshake_failed(self, name: str, endpoint: str, event: str, detail: str) -> None:
        """A handshake failed (scale0/net/security.py HandshakeWatch): log it (at most every
        10 s per connection) and, for our own connections, open them again in a second with
        the key the running config names (libzmq does not retry them)."""
        self._counters["curve_handshake_failed"] = (
            self._counters.get("curve_handshake_failed", 0) + 1
        )
        key = f"{name} {endpoint}"
        now = time.monotonic()
        if now - self._fail_logged.get(key, -math.inf) >= 10.0:
            self._fail_logged[key] = now
            self._log(
                logging.WARNING,
                "curve_handshake_failed",
                {"socket": name, "endpoint": endpoint, "event": event, "detail": detail},
            )
        if name.startswith("link:") or name == "config":
            redo = f"{name} {endpoint}"
            if redo not in self._redo and self._loop is not None and not self._stopped:
                self._redo.add(redo)
                self._loop.call_later(1.0, self._reopen, name, endpoint)

    def _reopen(self, name: str, endpoint: str) -> None:
        self._redo.discard(f"{name} {endpoint}")
        if self._stopped:
            return
        if name.startswith("link:"):
            link = name.removeprefix("link:")
            port = (
                self._ports.get(name)
                or self._lane_links.get(link)
                or self._lane_pending_links.get(link)
            )
            if port is not None and port.endpoint == endpoint:
                self._connect_link(name.removeprefix("link:"), endpoint)
        elif endpoint in self._subscribed:
            port = self._ports.get("config")
            if port is None:
                return
            with contextlib.suppress(zmq.ZMQError):
                port.socket.disconnect(endpoint)
            try:
                self._used_keys[f"sub:{endpoint}"] = self._curve_client(
                    port.socket, endpoint, "config"
                )
                port.socket.connect(endpoint)
            except zmq.ZMQError as exc:
                self._log(
                    logging.ERROR, "subscribe_failed", {"endpoint": endpoint, "error": str(exc)}
                )
            port.dirty = True

    def _rekey(self) -> None:
        """A config applied: reopen links and subscriptions whose broker's CURVE key changed,
        and say when this broker's own entry asks for a CURVE setting its sockets lack."""
        network = self.broker.network
        links = [(name, port) for name, port in self._ports.items() if name.startswith("link:")]
        links += [(f"link:{link}", port) for link, port in self._lane_links.items()]
        links += [(f"link:{link}", port) for link, port in self._lane_pending_links.items()]
        for name, port in links:
            if name not in self._used_keys:
                continue
            if server_key_for(network, port.endpoint, self._seed_keys) != self._used_keys[name]:
                self._connect_link(name.removeprefix("link:"), port.endpoint)
        for endpoint in sorted(self._subscribed):
            used = self._used_keys.get(f"sub:{endpoint}")
            if server_key_for(network, endpoint, self._seed_keys) != used:
                self._reopen("config", endpoint)
        entry = self.broker.core.entry
        wanted = entry is not None and entry.serves_curve is not None
        if entry is not None and wanted != self._serve_curve:
            self._log(
                logging.WARNING,
                "curve_needs_restart",
                {
                    "curve_public_key": entry.curve_public_key,
                    "serving_curve": self._serve_curve,
                    "reason": "a broker's sockets take CURVE at start: restart it",
                },
            )

    def _note_keys(self, port: _Port, batch: list[list[bytes]], keys: list[str]) -> None:
        """Tell the core each routing id's CURVE key (``Authenticated``) before its messages
        are handled: once per connection, not per message (``port.keys`` remembers)."""
        known = port.keys
        if len(known) > 100_000:  # routing ids of connections long gone: start afresh
            known.clear()
        for frames, key in zip(batch, keys, strict=True):
            routing_id = frames[0]
            if known.get(routing_id) != key:
                known[routing_id] = key
                event = Authenticated(port.channel, routing_id, key)
                self._perform(self.broker.handle(event, time.monotonic(), time.time()))

    # ---- the lane (scale0/net/lane.py) -----------------------------------------------------

    def _start_lane(self) -> None:
        """The frontend and backend ROUTERs go to the lane: their ports read and write the
        loop's ends of its pipes from now on (each keeps its place, fast path and keys)."""
        assert self._context is not None
        front, back, peer = (self._ports[channel.value] for channel in LANE_CHANNELS)
        lane, ours, theirs = open_lane(
            self._context,
            (front.socket, back.socket, peer.socket),
            keyed=(front.keyed, back.keyed, peer.keyed),
            max_frame_bytes=self.broker.max_frame_bytes,
            hwm=self._hwm,
            name=str(id(self)),
        )
        for old, pipe in zip((front, back, peer), ours[:3], strict=True):
            port = _Port(
                old.channel, pipe, _fd_of(pipe), old.signatures, old.endpoint, keyed=old.keyed
            )
            port.fast = old.fast
            port.lane = True
            self._ports[old.channel.value] = port
            self._lane_sockets.append(old.socket)
        links = _Port(Channel.LINK, ours[3], _fd_of(ours[3]), (SIG_BROKER,), "", kind="links")
        links.lane = True  # (our links, phase 4b: [header, link id, frames...] from each)
        self._ports["links"] = links
        self._lane_sockets.extend(theirs)
        self._lane = lane
        self._mirror = LaneMirror(lane)
        lane.identity(self.broker.core.identity.encode())
        for name in [name for name in self._ports if name.startswith("link:")]:
            self._lane_take_link(name.removeprefix("link:"), self._ports.pop(name))
        self._lane_config()
        self.broker.mirror_sessions(self._mirror)
        self.broker.core.lane = lane.stats  # its counters in status and /metrics
        ledger = self.broker.ledger
        if isinstance(ledger, CPoolLedger):  # the lane dispatches requests too (phase 3b)
            lane.attach_pool(ledger.cpool)
            lane.lock()
            try:
                self.broker.attach_lane(lane)
            finally:
                lane.unlock()  # (not told it may serve yet: at the end of the first entry)
            lane.serve_forwards(True)  # peers' FORWARDs too, from the links it is told of (4a)
            self._lane_requests = True
        lane.start()

    def _stop_lane(self) -> None:
        """Stop the lane (it sends what the loop wrote to its pipes first); idempotent."""
        lane = self._lane
        if lane is None:
            return
        self._lane = self._mirror = None
        lane.stop()
        for port in self._lane_links.values():  # (it has stopped: ours to close)
            port.socket.close(linger=self._flush_ms)
        self._lane_links.clear()
        for _, sock in self._lane_releasing:
            sock.close(linger=self._flush_ms)
        self._lane_releasing.clear()
        for port in self._lane_pending_links.values():
            port.socket.close(linger=0)
        self._lane_pending_links.clear()
        self.broker.mirror_sessions(None)
        self.broker.core.lane = None
        if self._lane_requests:  # what it still holds is the ledger's now, the pool its own
            lane.lock()
            try:
                self._lane_drained(lane)  # (what it did since the last round: the last of it)
                self.broker.attach_lane(None)
                lane.attach_pool(None)
            finally:
                lane.unlock()
            self._lane_requests = self._lane_records = False

    def _lane_state(self) -> str:
        """What broker_ready says of the lane: "c" (running), "off" or "not built"."""
        if self._lane is not None:
            return "c"
        return "not built" if self._lane_wanted else "off"

    def _lane_config(self) -> None:
        """Tell the lane the running config's version and skew limit when they change."""
        network = self.broker.network
        told = (network.config_version, float(network.max_clock_skew_s))
        if told != self._lane_told:
            self._lane_told = told
            self._lane.configure(*told)

    def _lane_heard(self) -> None:
        """The HEARTBEATs the lane took since the last call, to the core before anything else;
        and what it did with requests (counters, metrics, the table the peers read)."""
        assert self._mirror is not None
        heard = self._mirror.heard()
        if heard:
            self.broker.heard_elsewhere(heard)
        if self._lane_requests:
            self._lane_drained(self._lane)

    def _lane_drained(self, lane: Any) -> None:
        """What the lane did with requests since the last call, to the core (counters,
        metrics, the table the peers read) and, with an event log, the records of the
        requests it answered."""
        requests, replies, latencies, changed, forwards, forwarded = lane.drain()
        if requests or replies or changed:
            now = time.monotonic()
            self.broker.lane_did(requests, replies, latencies, changed, now, forwards, forwarded)
        self._lane_moved(lane)
        if self._lane_records:
            self._lane_done(lane)

    def _lane_done(self, lane: Any) -> None:
        """The requests the lane answered since the last call, as the event log's ``request``
        records (RequestDone, as scale0/core/records.py makes them: one attempt; a peer's
        FORWARD's with no client, forwarded from that peer)."""
        events = self.event_log
        done = lane.done_drain()
        if events is None:
            return
        for service, worker, client, started, finished, size_in, size_out, status, via in done:
            events.request(  # (a peer's FORWARD: no client of ours, forwarded from ``via``)
                RequestDone(
                    service,
                    worker,
                    None if via else client,
                    via or None,
                    started,
                    finished,
                    size_in,
                    size_out,
                    status,
                    1,
                )
            )

    def _lane_moved(self, lane: Any) -> None:
        """How the lane moved its peers' free counts since the last call (phase 4b), to the
        family, and to the mirror's copy of what the lane holds."""
        deltas = lane.peer_deltas()
        if deltas:
            self.broker.lane_moved(deltas)
            assert self._mirror is not None
            for broker_id, service, delta in deltas:
                self._mirror.moved(broker_id, service, delta)

    def _lane_take_link(self, link: str, port: _Port) -> None:
        """The lane owns this link from now on (phase 4b): the loop stops reading it, what the
        core says on it goes through the links' pipe."""
        assert self._loop is not None
        self._loop.remove_handler(port.fd)
        self._lane_give_link(link, port)

    def _lane_give_link(self, link: str, port: _Port) -> None:
        """The lane's thread reads and writes this link's socket from now on."""
        self._lane.add_link(link.encode(), port.socket.underlying)
        self._lane_links[link] = port

    def _lane_release(self, link: bytes) -> None:
        """The lane let go of a link it was told to (``released_links``): close its socket
        (a short linger: a DISCONNECT said just before still goes out, §5.5)."""
        for index, (name, sock) in enumerate(self._lane_releasing):
            if name == link:
                del self._lane_releasing[index]
                sock.close(linger=self._flush_ms)
                break
        again = link.decode("utf-8", "replace")
        # Connected again meanwhile: its turn once no link of its id is left to let go
        if again in self._lane_pending_links and all(n != link for n, _ in self._lane_releasing):
            self._lane_give_link(again, self._lane_pending_links.pop(again))

    def _lane_unlock(self, lane: Any) -> None:
        """The end of an entry into the core while the lane is locked: tell the lane what it
        may do with requests now (what the core just did may have changed it: the broker's
        state, draining, the config), then let it go on."""
        try:
            if self._lane_requests:
                serving = self.broker.lane_serves(self._lane_records)
                if serving != self._lane_serving:
                    if not serving[0]:  # what the lane holds is the core's to move or answer
                        self.broker.adopt_lane()
                    lane.serve(*serving)
                    self._lane_serving = serving
                assert self._mirror is not None
                self._mirror.peers(self.broker.lane_peers())  # (what HELLOs and silence moved)
                self._lane_moved(lane)  # (so what the family tells next is what the lane has)
                self._mirror.forward_peers(self.broker.lane_forward_peers())
                if self._lane_releasing:  # (it lists only the links we told it to let go)
                    for link in lane.released_links():
                        self._lane_release(link)
        finally:
            lane.unlock()

    def _lane_marks(self, outbox: list[tuple[IoKey, bytes, list[bytes]]]) -> int:
        """Last in a round's sends: tell the lane, on each pipe read from, how many messages
        the loop has read from it (a "done" mark, one 8-byte frame, behind the round's answers
        in the pipe). Until a peer's last message passed to the loop is marked done, the lane
        passes that peer's HEARTBEATs too, so the peer gets its answers in the order it sent.
        The marks go out in the round's one send_batch, their pipes' events read after it
        (a pipe towards the lane has no limit: a mark is never refused). Returns how many."""
        marks = 0
        for port in self._ports.values():
            if port.lane and port.lane_read != port.lane_marked:
                port.lane_marked = port.lane_read
                outbox.append((port.io, port.lane_read.to_bytes(8, "little"), []))
                port.sending = True
                marks += 1
        return marks

    # ---- the loop: reading ----------------------------------------------------------------

    def _on_readable(self) -> None:
        """Any port's FD fired: one wake-up for all ports."""
        self._counters["wakeups"] += 1
        self._pump()

    def _schedule_continue(self) -> None:
        if not self._continue_scheduled and not self._stopped:
            self._continue_scheduled = True
            assert self._loop is not None
            self._loop.add_callback(self._continue)

    def _continue(self) -> None:
        self._continue_scheduled = False
        self._counters["wakeups"] += 1
        self._pump()

    def _pump(self) -> None:
        """:meth:`_pump_rounds`, holding the lane's lock while it runs (if a lane shares the
        ledger's pool, every decision of the core is atomic against the lane's)."""
        lane = self._lane
        if lane is None:
            self._pump_rounds()
            return
        lane.lock()
        try:
            self._pump_rounds()
        finally:
            self._lane_unlock(lane)

    def _pump_rounds(self) -> None:
        """Rounds over the dirty ports until none is dirty, or the budget is spent.

        The loop watches each port's ZMQ FD level-triggered, and libzmq keeps that FD readable
        while the socket has commands it has not processed. Only an operation on the socket
        itself (a send, a receive, an option) processes them, and may leave messages waiting
        that the FD no longer announces. So a port is read when it is ``dirty``: new, its FD
        fired, the node sent on it and its events said a message waits after the send
        (``_flush``), or its last batch stopped at the budget; a batch that ends on an empty
        socket (libzmq processed its commands) makes it clean, and the loop may sleep once
        every port is. A port nobody touched is not probed at every wake-up.
        """
        if self._stopped:
            return
        if self._lane is not None:
            self._lane_heard()
        budget = self._batch_size
        while True:
            self._counters["rounds"] += 1
            handled = 0
            ports = list(self._ports.values())
            for port in ports:
                if port.dirty:
                    handled += self._drain(port, budget - handled)
            self._flush()
            if not any(port.dirty for port in self._ports.values()):
                break  # every port ended on "nothing waiting" after its last send: sleep
            budget -= handled
            if budget <= 0:
                self._schedule_continue()
                break
        self._reschedule_timer()

    def _drain(self, port: _Port, limit: int) -> int:
        """Read up to ``limit`` messages from ``port`` in one batch and dispatch them; returns
        how many were read. Fewer than ``limit`` means the port had no more waiting, and its
        pending commands were processed (frames_io), which the empty round relies on."""
        if limit <= 0 or _is_closed(port):  # (closed by an effect: nothing more to read)
            return 0
        try:
            fds: list[int] | None = None
            if port.lane:
                batch = recv_batch(port.io, limit)
                port.lane_read += len(batch)
                fds, keys = lane_heads(batch, port.keyed)
                if port.keyed:
                    self._note_keys(port, batch, keys)
            elif port.keyed:
                batch, keys = recv_batch_keyed(port.io, limit)
                fds = batch_fds()  # before the core hears of the keys: nothing reads between
                self._note_keys(port, batch, keys)
            else:
                batch = recv_batch(port.io, limit)
        except zmq.ZMQError as exc:  # a socket-level failure: say so, keep the loop alive
            port.dirty = False  # not retried until its FD fires again
            self._counters["internal_errors"] += 1
            self._log(
                logging.ERROR, "socket_error", {"channel": port.channel.value, "error": str(exc)}
            )
            return 0
        port.dirty = len(batch) >= limit  # fewer: it ended on an empty socket (a send queued
        # for it, before or after this batch, makes it dirty again when it goes out: _flush)
        channel = port.channel
        # One reading of each clock per batch: a batch takes microseconds to handle.
        now = time.monotonic()
        wall = time.time()
        if port.kind == "router":
            # The connection of each message (R20, R22, §8): read right after its batch (a
            # list of our own: reading the monitor below is another batch).
            conns = list(batch_fds() if fds is None else fds)
            known = self._conn_channels
            signature = _BEAT_SIGNATURES.get(channel)
            if signature is not None and port.fast is not None:
                if any(conn >= 0 and conn not in known for conn in conns):
                    self._read_monitor(channel)  # as below, once for the whole batch
                self._drain_hot(port, channel, signature, batch, conns, now, wall)
                return len(batch)
            for frames, conn in zip(batch, conns, strict=False):
                if _is_closed(port):
                    break
                if conn >= 0 and conn not in known:
                    # Accepted after this round read the monitor: libzmq queued the event
                    # before the connection's first message, so it is there now. Without it
                    # the message would have no address, and a stranger's 401 no score.
                    self._read_monitor(channel)
                self._dispatch(port, channel, frames, now, wall, conn)
            return len(batch)
        for frames in batch:
            if _is_closed(port):  # an earlier message of the batch closed it: drop the rest
                break
            self._dispatch(port, channel, frames, now, wall)
        return len(batch)

    def _read_monitor(self, channel: Channel) -> None:
        """Handle what ``channel``'s connection monitor has queued now (R20, R22)."""
        monitor = self._ports.get("monitor:" + channel.value)
        if monitor is not None:
            while self._drain(monitor, self._batch_size) >= self._batch_size:
                pass

    def _drain_hot(
        self,
        port: _Port,
        channel: Channel,
        signature: bytes,
        batch: list[list[bytes]],
        conns: list[int],
        now: float,
        wall: float,
    ) -> None:
        """A client or worker batch: each run of plain HEARTBEATs, and each run of plain
        REQUESTs (frontend) or REPLYs (backend), read by hot_items (in C with the C batch
        calls), goes to the core in one call; every other message to :meth:`_dispatch`, in the
        order received. The same effects as a _dispatch of each (docs/performance.md)."""
        broker = self.broker
        items: list[HotItem]
        try:
            items = hot_items(batch, signature, broker.max_frame_bytes, CHECKED_NAMES)
        except Exception:  # (memory): every message its own way, as before the batch reader
            self._counters["internal_errors"] += 1
            self._log(logging.ERROR, "internal_error", {"channel": channel.value}, exc_info=True)
            items = list(batch)
        run: list[Any] = []
        kind = 0  # the run's: 1 HEARTBEATs (their time is a float), 2 REQUESTs or REPLYs
        fresh = self._fresh
        banned = broker.banned  # empty nearly always: no is_banned call per message then
        is_banned = broker.is_banned
        this = 0
        for item, conn in zip(items, conns, strict=False):
            read = item if type(item) is tuple else None
            if read is not None:
                if banned and is_banned(read[0], now):
                    self._counters["banned_dropped"] += 1  # dropped unread (§8)
                    continue
                this = 1 if type(read[1]) is float else 2
                if conn not in fresh:
                    if this != kind:
                        if run:
                            self._handled(channel, kind, run, now, wall)
                            run = []
                            if _is_closed(port):
                                return
                        kind = this
                    run.append(read)
                    continue
            if run:
                self._handled(channel, kind, run, now, wall)
                run = []
            if _is_closed(port):
                return
            if read is not None:  # R20: its connection is negotiated by this message
                self._handled(channel, this, [read], now, wall, conn)
            elif isinstance(item, list):
                self._dispatch(port, channel, item, now, wall, conn)
            if _is_closed(port):  # an effect closed it: drop the rest
                return
        if run:
            self._handled(channel, kind, run, now, wall)

    def _handled(
        self,
        channel: Channel,
        kind: int,
        run: list[Any],
        now: float,
        wall: float,
        conn: int = -1,
    ) -> None:
        """A run of one kind of hot_items tuple to the core at once: HEARTBEATs (``kind`` 1),
        REQUESTs or REPLYs (2, by ``channel``). Never raises."""
        try:
            self._counters["received"] += len(run)
            broker = self.broker
            if kind == 1:
                effects = broker.handle_heartbeats(channel, run, now, wall)
            elif channel is Channel.FRONTEND:
                effects = broker.handle_requests(run, now)
            else:
                effects = broker.handle_replies(run, now)
            if conn in self._fresh:
                self._negotiated(channel, run[0][0], conn)
            self._perform(effects)
        except Exception:
            self._counters["internal_errors"] += 1
            self._log(
                logging.ERROR,
                "internal_error",
                {"channel": channel.value, "messages": len(run)},
                exc_info=True,
            )

    def _dispatch(
        self,
        port: _Port,
        channel: Channel,
        frames: list[bytes],
        now: float,
        wall: float,
        conn: int = -1,
    ) -> None:
        """One message: ban check, fast path or decode + core, effects. Never raises."""
        if port.kind != "router":
            self._dispatch_other(port, frames)
            return
        try:
            broker = self.broker
            routing_id = frames[0]
            if broker.is_banned(routing_id, now):
                self._counters["banned_dropped"] += 1  # dropped unread (§8)
                return
            if (
                channel is Channel.PEER
                and conn in self._fresh
                and broker.peer_unread(routing_id, conn, frames[3] if len(frames) > 3 else b"", now)
            ):
                self._counters["banned_dropped"] += 1  # R22: only a HELLO is read from it
                return
            fast = port.fast
            if fast is not None:
                effects = fast(frames, now, wall)
                if effects is not None:
                    if conn in self._fresh:  # R20: a Majordomo client's first REQUEST opens
                        self._negotiated(channel, routing_id, conn)  # its session here
                    self._perform(effects)
                    return
            event: Event
            try:
                message = decode_to_broker(
                    frames[1:],
                    max_frame_bytes=broker.max_frame_bytes,
                    signatures=port.signatures,
                )
            except ProtocolError as error:
                self._counters["malformed"] += 1
                signature = frames[2] if len(frames) > 2 else b""  # frame 1: whose protocol
                event = Malformed(channel, routing_id, error, signature, conn)
            else:
                self._counters["received"] += 1
                event = Received(channel, routing_id, message, conn)
            self._perform(broker.handle(event, now, wall))
            if type(event) is Received and conn in self._fresh and channel is not Channel.PEER:
                # R20: the core marked it negotiated if its sender has a session now (a READY,
                # a CHECKCONFIG); so does the lane, which takes its HEARTBEATs from then on
                self._negotiated(channel, routing_id, conn)
        except Exception:
            self._counters["internal_errors"] += 1
            self._log(
                logging.ERROR,
                "internal_error",
                {"channel": channel.value, "frames": len(frames)},
                exc_info=True,
            )

    def _dispatch_other(self, port: _Port, frames: list[bytes]) -> None:
        """A peer link's answer or a config publication: decode, core, effects. Never raises."""
        link = port.link
        try:
            broker = self.broker
            event: Event
            if port.kind == "monitor":
                self._connection_event(port.channel, frames)
                return
            try:
                if port.kind == "sub":
                    published = decode_config_publication(
                        frames, max_frame_bytes=broker.max_frame_bytes
                    )
                    offer = Offer(
                        config_type=published.config_type,
                        document=published.document,
                        sha256=published.sha256,
                        signature=published.signature,
                        origin=published.origin,
                        family=published.family,
                        config_version=published.config_version,
                        view_signature=published.view_signature,
                    )
                    event = ConfigOffered(offer, "pub")
                else:
                    if port.kind == "links":  # the lane's pipe: [link id, frames...]
                        link, frames = frames[0], frames[1:]
                    message = decode_from_broker(
                        frames, signature=SIG_BROKER, max_frame_bytes=broker.max_frame_bytes
                    )
                    event = Received(Channel.LINK, link, message)
            except ProtocolError as error:
                self._counters["malformed"] += 1
                event = Malformed(port.channel, link, error)
            else:
                self._counters["received"] += 1
            self._perform(broker.handle(event, time.monotonic(), time.time()))
        except Exception:
            self._counters["internal_errors"] += 1
            self._log(
                logging.ERROR,
                "internal_error",
                {"channel": port.channel.value, "frames": len(frames)},
                exc_info=True,
            )

    # ---- connections (R20): what the monitors say, and hanging up ---------------------------

    def _connection_event(self, channel: Channel, frames: list[bytes]) -> None:
        if len(frames) < 1 or len(frames[0]) != _MONITOR_HEAD.size:
            return
        event, fd = _MONITOR_HEAD.unpack(frames[0])
        if event & HANDSHAKE_FAILED:  # CURVE served here: the value is an error, not an fd
            endpoint = frames[1].decode("utf-8", "replace") if len(frames) > 1 else ""
            self._handshake_failed(channel.value, endpoint, str(zmq.Event(event).name), str(fd))
            return
        now = time.monotonic()
        if event == zmq.EVENT_ACCEPTED:
            self._conn_channels[fd] = channel
            self._fresh.add(fd)
            connected = Connected(channel, fd, _peer_address(fd))
            self._perform(self.broker.handle(connected, now, time.time()))
        elif event == zmq.EVENT_DISCONNECTED:
            if self._conn_channels.get(fd) is channel:
                del self._conn_channels[fd]
                self._fresh.discard(fd)
                if self._mirror is not None:
                    self._mirror.gone(channel, fd)
            self._perform(self.broker.handle(Disconnected(channel, fd), now, time.time()))

    def _negotiated(self, channel: Channel, routing_id: bytes, conn: int) -> None:
        """A fast-path message from a connection not known to have negotiated: if its sender
        has a session now, the core marks the connection negotiated (R20), and so do we."""
        if self.broker.mark_negotiated(channel, routing_id, conn):
            self._fresh.discard(conn)
            if self._mirror is not None:
                self._mirror.negotiated(channel, conn)

    def _hangup(self, effect: Hangup) -> None:
        """Close a connection libzmq holds: shut its TCP socket down (the fd stays libzmq's;
        libzmq sees the end, closes it and reports it to the monitor)."""
        if self._conn_channels.get(effect.conn) is not effect.channel:
            return  # already gone: its number is not ours to touch
        del self._conn_channels[effect.conn]
        self._fresh.discard(effect.conn)
        if self._mirror is not None:
            self._mirror.gone(effect.channel, effect.conn)
        self._counters["hung_up"] += 1
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=effect.conn)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()

    # ---- the fast paths of the frontend and backend ports ----------------------------------

    def _fast_request(self, frames: list[bytes], now: float, wall: float) -> list[Effect] | None:
        """A plain client REQUEST or HEARTBEAT, or a Majordomo client REQUEST, read by
        scale0.wire.hot, to the core's lean entry points."""
        if len(frames) < 4:
            return None
        broker = self.broker
        signature = frames[2]
        if signature == SIG_CLIENT:
            fields = client_request_fields(frames, broker.max_frame_bytes)
            if fields is not None:
                self._counters["received"] += 1
                service, request_id, body = fields
                return broker.handle_request(frames[0], service, request_id, body, now)
            beat = heartbeat_fields(frames, SIG_CLIENT, broker.max_frame_bytes)
            if beat is not None:
                self._counters["received"] += 1
                sent, version, promise = beat
                return broker.handle_heartbeat(
                    Channel.FRONTEND, frames[0], sent, version, now, wall, promise
                )
        elif signature in (MDPC02, MDPC01):
            mdp = mdp_client_request_fields(frames, broker.max_frame_bytes)
            if mdp is not None:
                self._counters["received"] += 1
                reading, service, body = mdp
                return broker.handle_mdp_request(frames[0], reading, service, body, now)
        return None

    def _fast_reply(self, frames: list[bytes], now: float, wall: float) -> list[Effect] | None:
        """A plain worker REPLY or HEARTBEAT, or a Majordomo worker's final reply, read by
        scale0.wire.hot, to the core's lean entry points."""
        if len(frames) < 4:
            return None
        broker = self.broker
        signature = frames[2]
        if signature == SIG_WORKER:
            fields = worker_reply_fields(frames, broker.max_frame_bytes)
            if fields is not None:
                self._counters["received"] += 1
                ticket, status, body = fields
                return broker.handle_reply(frames[0], ticket, status, body, now)
            beat = heartbeat_fields(frames, SIG_WORKER, broker.max_frame_bytes)
            if beat is not None:
                self._counters["received"] += 1
                sent, version, promise = beat
                return broker.handle_heartbeat(
                    Channel.BACKEND, frames[0], sent, version, now, wall, promise
                )
        elif signature in (MDPW02, MDPW01):
            mdp = mdp_worker_reply_fields(frames, broker.max_frame_bytes)
            if mdp is not None:
                self._counters["received"] += 1
                ticket, body = mdp
                return broker.handle_mdp_reply(frames[0], ticket, body, now)
        return None

    # ---- the loop: the one timer ----------------------------------------------------------

    def _reschedule_timer(self) -> None:
        deadline = self.broker.next_deadline()
        if deadline == self._timer_deadline and (deadline is None or self._timer is not None):
            return
        armed = self._timer_deadline if self._timer is not None else None
        if armed is not None and (deadline is None or deadline >= armed):
            # The next deadline moved later (a request got its answer): the armed timer fires
            # early once, harmlessly, instead of being moved at every wake-up.
            return
        loop = self._loop
        assert loop is not None
        if self._timer is not None:
            loop.remove_timeout(self._timer)
            self._timer = None
        self._timer_deadline = deadline
        if deadline is not None and not self._stopped:
            # IOLoop.time() is time.time() in Tornado 6 (not monotonic); call_later with a
            # delay measured on the monotonic clock keeps the core's deadlines exact.
            delay = max(0.0, deadline - time.monotonic())
            self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline = None
        if self._stopped:
            return
        self._counters["ticks"] += 1
        lane = self._lane
        if lane is not None:
            self._lane_heard()  # before the sweep reads last_seen
            if self._lane_requests:  # the lane's requests past their deadline: answered now
                lane.lock()
                try:
                    self.broker.adopt_due(time.monotonic())
                    self._feed(Tick())
                finally:
                    self._lane_unlock(lane)
                self._pump()
                return
        self._feed(Tick())
        # The tick's sends may have swallowed a socket's FD edge: a pump reads the ports sent on.
        self._pump()

    def _feed(self, event: Event) -> None:
        lane = self._lane
        if lane is None:
            self._feed_locked(event)
            return
        lane.lock()
        try:
            self._lane_heard()  # (what the lane did first, as at a round's start)
            self._feed_locked(event)
        finally:
            self._lane_unlock(lane)

    def _feed_locked(self, event: Event) -> None:
        try:
            self._perform(self.broker.handle(event, time.monotonic(), time.time()))
        except Exception:
            self._counters["internal_errors"] += 1
            self._log(
                logging.ERROR, "internal_error", {"event": type(event).__name__}, exc_info=True
            )
        self._flush()

    # ---- effects --------------------------------------------------------------------------

    def _perform(self, effects: Iterable[Effect]) -> None:
        ports = self._ports
        outbox = self._outbox
        events = self.event_log
        # Management requests waiting for their answer (event log): empty nearly always.
        asked = events.asked if events is not None else None
        # The core sends one message object to many (the HEARTBEATs of a timer round, the
        # answers to a batch of client HEARTBEATs, each answered by a _perform of its own):
        # encoded once, its frames sent to each. Messages are frozen, and the one remembered
        # is held, so ``is`` cannot match a different message.
        last, last_frames = self._last_encoded
        # The port of the last Send's channel (a run's answers mostly go to one or two): its
        # lookup is skipped while the channel repeats. Never a link's (its port is per link).
        last_channel: Channel | None = None
        last_port: _Port | None = None
        for effect in effects:
            try:
                if type(effect) is Send:  # (no subclasses: frozen, slotted)
                    channel = effect.channel
                    message = effect.message
                    if asked and type(message) is ManagementReply and events is not None:
                        events.management_answered(channel, effect.routing_id, message)
                    if channel is last_channel:
                        port = last_port
                    elif channel is Channel.LINK:
                        port = ports.get("links")  # (the lane's links: its pipe, phase 4b)
                        if port is None:
                            link = effect.routing_id.decode("utf-8", "replace")
                            port = ports.get("link:" + link)
                    else:
                        port = ports.get(_PORT_NAMES[channel])
                        last_channel, last_port = channel, port
                    if port is None:
                        sink = self._sinks.get(channel)
                        if sink is not None:  # the HTTP server's waiting requests
                            sink(effect.routing_id, message)
                            continue
                    if port is None or self._context is None:
                        self._counters["send_dropped"] += 1
                        self._log(logging.DEBUG, "send_dropped", {"channel": channel.value})
                        continue
                    # Encode now (a bug shows up as this effect's failure); sent by _flush().
                    if message is not last:
                        last_frames = message.to_frames()  # (registry.encode, inline)
                        last = message
                    frames = last_frames
                    port.sending = True  # the send may swallow its FD's edge (see _flush)
                    if port.kind == "dealer":  # a peer link: no routing id to prepend
                        outbox.append((port.io, frames[0], frames[1:]))
                    else:
                        outbox.append((port.io, effect.routing_id, frames))
                elif isinstance(effect, RequestDone):
                    if events is not None:
                        events.request(effect)
                elif isinstance(effect, Hangup):
                    self._hangup(effect)
                elif isinstance(effect, Log):
                    self._log(level_number(effect.level), effect.event, effect.fields)
                    if events is not None:
                        events.log(effect)
                elif isinstance(effect, Connect):
                    self._connect_link(effect.link, effect.endpoint)
                elif isinstance(effect, Close):
                    self._close_link(effect.link)
                elif isinstance(effect, Publish):
                    if self._pub is not None:
                        frames = effect.config.to_frames()
                        send_frames(self._pub, frames[0], frames[1:])
                        self._counters["published"] += 1
                elif isinstance(effect, Subscribe):
                    self._subscribe(effect.endpoints)
                elif isinstance(effect, Persist):
                    self._persist(effect)
                    self._rekey()  # a config applied: brokers' CURVE keys may have changed
                elif isinstance(effect, Authenticate | FanOut):
                    if events is not None and isinstance(effect, Authenticate):
                        events.management_asked(effect.channel, effect.routing_id, effect.request)
                    self.management.perform(effect)
                elif isinstance(effect, ReadConfig):
                    self._read_config(effect)
                elif isinstance(effect, Drained):
                    self._drained(unfinished=0)
            except Exception:
                self._counters["internal_errors"] += 1
                self._log(
                    logging.ERROR,
                    "effect_failed",
                    {"effect": type(effect).__name__},
                    exc_info=True,
                )
        # Remembered once per call (a pair that always matches: a nested _perform, from an
        # effect's handler, reads and leaves a matching pair too).
        self._last_encoded = (last, last_frames)

    def _flush(self) -> None:
        """Send what the round produced, back to back, in the order the core asked for.

        Each message whose pipe was idle wakes libzmq's I/O thread; sent together, the later
        ones usually find it still awake, and messages to one peer leave in one TCP write.
        """
        outbox = self._outbox
        marks = 0
        if self._lane is not None:
            self._lane_config()
            marks = self._lane_marks(outbox)
        if not outbox:
            return
        self._outbox = []
        sent_on = [port for port in self._ports.values() if port.sending]
        try:
            sent, failed = send_batch(outbox)
        except Exception:  # a frame that is not bytes: a bug; the round's later sends are lost
            self._counters["internal_errors"] += 1
            self._log(logging.ERROR, "send_failed", {"messages": len(outbox)}, exc_info=True)
            for port in sent_on:
                port.sending = False
                port.dirty = True  # (what the sends did to its FD is not known: read it)
            return
        for port in sent_on:
            # A send may process an activate-read command that came after the port's last
            # batch, and then its FD never fires for what waits (the peer-silence defect). Asking
            # the socket for its events processes every command it has, and says whether a
            # message waits: the port is dirty only then (one option read, not a whole empty
            # round of reading), and its FD fires again for what comes later.
            port.sending = False
            if not port.dirty and not port.closed:
                try:
                    port.dirty = bool(socket_events(port.socket) & _POLLIN)
                except zmq.ZMQError:  # (closing): the next batch says what it is
                    port.dirty = True
        self._counters["sent"] += sent - marks  # (messages to peers, not the lane's marks)
        self._counters["send_dropped"] += len(failed)
        for code in failed:
            # EAGAIN: high-water mark reached on that peer; EHOSTUNREACH: a ROUTER peer gone.
            if code not in (errno.EAGAIN, errno.EHOSTUNREACH):
                self._counters["internal_errors"] += 1
                self._log(logging.ERROR, "send_failed", {"error": zmq.strerror(code)})

    def _log(
        self,
        level: int,
        event: str,
        fields: dict[str, object] | None = None,
        *,
        exc_info: bool = False,
    ) -> None:
        log_event(_logger, level, event, fields, broker=self.identity, exc_info=exc_info)


#: The signature of a plain HEARTBEAT on the ports whose batches are read for them.
_BEAT_SIGNATURES: Final[dict[Channel, bytes]] = {
    Channel.FRONTEND: SIG_CLIENT,
    Channel.BACKEND: SIG_WORKER,
}

_PORT_NAMES: Final[dict[Channel, str]] = {channel: channel.value for channel in Channel}
"""A channel's port name, by identity hash (an enum's ``.value`` is a descriptor call)."""


def _is_closed(port: _Port) -> bool:
    """Read the flag afresh (a call, so type narrowing from an earlier check does not stick)."""
    return port.closed


def _peer_address(fd: int) -> str:
    """The IP address at the other end of a connection (ZeroMQ's ``Peer-Address``); "" if the
    connection is already gone."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return ""
    try:
        peer = sock.getpeername()
    except OSError:
        return ""
    finally:
        sock.detach()
    return str(peer[0]) if isinstance(peer, tuple) else ""


def _fd_of(sock: zmq.Socket[bytes]) -> int:
    fd = sock.getsockopt(zmq.FD)
    if not isinstance(fd, int):  # pragma: no cover - libzmq always answers an int
        raise TypeError(f"ZMQ_FD is {fd!r}")
    return fd


class _FdHandler:
    """The IOLoop handler of a port's FD (a class, not a lambda, so it types and reads)."""

    __slots__ = ("node", "port")

    def __init__(self, node: BrokerNode, port: _Port) -> None:
        self.node = node
        self.port = port

    def __call__(self, fd: int, events: int) -> None:
        self.port.dirty = True
        self.node._on_readable()
