"""The lane: a C thread that owns the broker's ROUTERs and links (docs/architecture.md).

Phase 3a of the lane (issue 14): the thread (``scale0.net._zmqio.Lane``, scale0/net/_lane.c)
waits in ``zmq_poll`` on both ROUTERs and takes every *plain* HEARTBEAT itself: a client's
is answered, a worker's only heard, and neither wakes the Python loop. Everything else goes
to the loop through one inproc PAIR pipe per channel, each message preceded by a header frame
(the connection's fd, and on a CURVE port the sender's key), in the order received; the loop's
sends to those two sockets go back through the same pipes. The take rule is the fast path of
:meth:`scale0.core.sessions.Sessions.heard_many`, read in C from the lane's copy of the
sessions, which Sessions keeps true through :class:`LaneMirror`; what the lane heard comes back
as :meth:`scale0.core.broker.Broker.heard_elsewhere` at the start of every round of the node.

Phase 3b: it also takes the requests of S0P and Majordomo clients to ready workers of their
protocol and their final REPLYs, sharing the ledger's C pool and holding the reply cache
(scale0/core/ledger.py "The lane"; docs/architecture.md "Phase 3b").

Phase 4: it also owns the peer ROUTER, where it takes other brokers' FORWARDs to our workers
and answers them (4a), and our links to the peers, where it forwards our S0P clients'
requests no worker of ours is ready for and takes the peers' answers (4b): the family tells it
its peer links (:meth:`LaneMirror.peers`) and the peers it may forward to
(:meth:`LaneMirror.forward_peers`); docs/architecture.md "Phase 4a", "Phase 4b".

This module holds what the node needs of it: whether it is built (:data:`LANE_BUILT`), the
lane and its pipes (:func:`open_lane`), the mirror that speaks to it in the core's channels,
and the header. It is on unless the broker's file says ``lane: false`` or ``SCALE0_LANE=0``
is set (the default since phase 3b), and only with the C batch calls (the pure-Python
fallback has no lane and runs as before).
"""

from __future__ import annotations

import os
from typing import Any, Final

import zmq

from scale0.core.effects import Channel
from scale0.net.frames_io import IMPLEMENTATION

__all__ = [
    "LANE_BUILT",
    "LANE_CHANNELS",
    "LaneMirror",
    "lane_heads",
    "lane_wanted",
    "open_lane",
]

#: The ROUTERs the lane owns, by its channel numbers: 0 the frontend, 1 the backend, 2 the peer
#: ROUTER (phase 4a); channel 3 is our links to the peers (DEALERs, phase 4b), one pipe for all.
LANE_CHANNELS: Final = (Channel.FRONTEND, Channel.BACKEND, Channel.PEER)
_CHANNELS: Final = (*LANE_CHANNELS, Channel.LINK)
_NUMBER: Final = {Channel.FRONTEND: 0, Channel.BACKEND: 1, Channel.PEER: 2}

_Lane: Any = None
if IMPLEMENTATION == "c":
    from scale0.net import _zmqio

    _Lane = getattr(_zmqio, "Lane", None)

#: Whether this install has the lane (the C extension, built with it, and not SCALE0_PURE).
LANE_BUILT: Final = _Lane is not None


def lane_wanted(configured: bool) -> bool:
    """The broker file's ``lane``, or ``SCALE0_LANE`` (1 on, 0 off) when set."""
    forced = os.environ.get("SCALE0_LANE")
    if forced in ("0", "1"):
        return forced == "1"
    return configured


class LaneMirror:
    """A lane, spoken to in the core's channels: :class:`scale0.core.ports.MirrorPort` (the
    sessions' copy in C), R20's connections, what it heard, and the peer links whose FORWARDs
    it may take (:meth:`peers`)."""

    __slots__ = ("_forward_peers", "_lane", "_peers")

    def __init__(self, lane: Any) -> None:
        self._lane = lane
        self._peers: dict[bytes, bytes] = {}
        self._forward_peers: dict[bytes, tuple[bool, bool, dict[str, int]]] = {}

    def note(
        self,
        channel: Channel,
        routing_id: bytes,
        promise_ms: int,
        gap_s: float,
        last_seen: float,
        majordomo: int,
        client_id: bytes,
        open: bool,
    ) -> None:
        number = _NUMBER.get(channel)
        if number is not None:
            self._lane.note(
                number, routing_id, promise_ms, gap_s, last_seen, majordomo, client_id, open
            )

    def forget(self, channel: Channel, routing_id: bytes) -> None:
        number = _NUMBER.get(channel)
        if number is not None:
            self._lane.forget(number, routing_id)

    def negotiated(self, channel: Channel, fd: int) -> None:
        """R20: the connection ``fd`` has negotiated (the lane may take its HEARTBEATs)."""
        number = _NUMBER.get(channel)
        if number is not None:
            self._lane.negotiated(number, fd)

    def gone(self, channel: Channel, fd: int) -> None:
        """The connection ``fd`` has closed."""
        number = _NUMBER.get(channel)
        if number is not None:
            self._lane.gone(number, fd)

    def heard(self) -> list[tuple[Channel, bytes, float]]:
        """The HEARTBEATs (and peers' FORWARDs) the lane took since the last call: (channel,
        routing id, when)."""
        return [(_CHANNELS[number], rid, when) for number, rid, when in self._lane.heard()]

    def peers(self, peers: dict[bytes, bytes]) -> None:
        """The peer links whose FORWARDs the lane may take now (routing id -> broker id, the
        family's ``lane_peers``): the lane is told what changed since the last call."""
        told = self._peers
        if peers == told:
            return
        for routing_id in told.keys() - peers.keys():
            self._lane.forget(2, routing_id)
        for routing_id, broker_id in peers.items():
            if told.get(routing_id) != broker_id:
                self._lane.note(2, routing_id, 0, 0.0, 0.0, 0, broker_id, True)
        self._peers = dict(peers)

    def forward_peers(self, peers: dict[bytes, tuple[bool, bool, dict[str, int]]]) -> None:
        """The peers the lane may forward to (the family's ``lane_forward_peers``: per broker
        id, usable, understands FORWARDWITH, free slots per service), each told when it
        differs from what the lane holds now. Call it only once what the lane moved since
        its last ``peer_deltas`` is applied (``Broker.lane_moved``): the lane's own counts then
        equal the family's unless the family changed them."""
        told = self._forward_peers
        for broker_id in told.keys() - peers.keys():
            self._lane.forget_peer(broker_id)
        for broker_id, (usable, forward_with, free) in peers.items():
            if told.get(broker_id) != (usable, forward_with, free):
                self._lane.peer(broker_id, usable, forward_with, free)
        self._forward_peers = {b: (u, w, dict(f)) for b, (u, w, f) in peers.items()}

    def moved(self, broker_id: bytes, service: str, delta: int) -> None:
        """The lane moved a free count by ``delta`` (its ``peer_deltas``): what it holds."""
        told = self._forward_peers.get(broker_id)
        if told is not None:
            told[2][service] = told[2].get(service, 0) + delta


def open_lane(
    context: zmq.Context[zmq.Socket[bytes]],
    routers: tuple[zmq.Socket[bytes], zmq.Socket[bytes], zmq.Socket[bytes]],
    *,
    keyed: tuple[bool, bool, bool],
    max_frame_bytes: int,
    hwm: int,
    name: str,
) -> tuple[Any, list[zmq.Socket[bytes]], list[zmq.Socket[bytes]]]:
    """A lane (not started) on the frontend, backend and peer ``routers`` (``keyed``: which
    carry CURVE keys), and the pipes: the loop's ends (in that order, then the links' pipe,
    phase 4b) and the lane's. Towards the loop a pipe holds ``hwm`` messages (then the lane
    stops reading that ROUTER: backpressure as without a lane);
    towards the lane it has no limit (a round's sends are bounded by the round, and the
    ROUTER's per-peer limit applies behind it)."""
    if _Lane is None:
        raise RuntimeError("the lane is not built (scale0.net._zmqio without Lane)")
    ours: list[zmq.Socket[bytes]] = []
    theirs: list[zmq.Socket[bytes]] = []
    try:
        for channel in _CHANNELS:
            address = f"inproc://scale0-lane-{name}-{channel.value}"
            lane_end: zmq.Socket[bytes] = context.socket(zmq.PAIR)
            theirs.append(lane_end)
            lane_end.setsockopt(zmq.LINGER, 0)
            lane_end.setsockopt(zmq.SNDHWM, hwm)
            lane_end.setsockopt(zmq.RCVHWM, 0)
            lane_end.bind(address)
            loop_end: zmq.Socket[bytes] = context.socket(zmq.PAIR)
            ours.append(loop_end)
            loop_end.setsockopt(zmq.LINGER, 0)
            loop_end.setsockopt(zmq.SNDHWM, 0)
            loop_end.setsockopt(zmq.RCVHWM, hwm)
            loop_end.connect(address)
        lane = _Lane(
            routers[0].underlying,
            routers[1].underlying,
            theirs[0].underlying,
            theirs[1].underlying,
            keyed[0],
            keyed[1],
            max_frame_bytes,
            peer=routers[2].underlying,
            peer_pipe=theirs[2].underlying,
            keyed_peer=keyed[2],
            link_pipe=theirs[3].underlying,
        )
    except BaseException:
        for sock in ours + theirs:
            sock.close(linger=0)
        raise
    return lane, ours, theirs


def lane_heads(batch: list[list[bytes]], keyed: bool) -> tuple[list[int], list[str]]:
    """Take each message's header frame off (in place): the connection fds, and on a keyed
    port the senders' keys ("" when none or not UTF-8, as recv_batch_keyed says them)."""
    fds: list[int] = []
    keys: list[str] = []
    for frames in batch:
        head = frames.pop(0) if frames else b""
        fds.append(int.from_bytes(head[:4], "little", signed=True) if len(head) >= 4 else -1)
        if keyed:
            try:
                keys.append(head[4:].decode("utf-8"))
            except UnicodeDecodeError:
                keys.append("")
    return fds, keys
