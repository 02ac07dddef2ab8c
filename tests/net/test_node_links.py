"""Peer links that survive a cut (docs/protocol.md §5.1, docs/operations.md "What each fault does
to a family"): a link keeps its routing id across reconnects and the peer ROUTER hands that id
over to the newest connection, so a link that reconnected is heard at once, with no new HELLO.

A real BrokerNode on its loop (tests/net/test_node.py's NodeThread); the other member's link is
played by DEALERs of the test that set the routing id as a broker's link does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from scale0.config.model import BrokerEntry
from scale0.core.effects import Channel
from scale0.net.lane import LANE_BUILT
from scale0.wire.peer import BrokerState, Hello, Table, TableMode, TableReq
from scale0.wire.registry import decode_from_broker, encode
from tests.net.test_node import LOOP_ONLY, WAIT_S, NodeThread, _network, _signature, ctx, signing

pytestmark = pytest.mark.usefixtures("broker_io")  # loop and lane (tests/conftest.py)

__all__ = ["ctx", "signing"]  # fixtures used here

LINK_ID = b"L" + bytes(range(1, 16))
INTERVAL_MS = 400
LIVENESS = 3


@pytest.fixture
def two(signing: tuple[Path, Path]) -> Iterator[NodeThread]:
    """Node "solo" of a family of two; "other" is not running (the test plays its link)."""
    other = BrokerEntry(
        identity="other",
        frontend="tcp://127.0.0.1:1",
        backend="tcp://127.0.0.1:2",
        peer="tcp://127.0.0.1:3",
        config_pub="tcp://127.0.0.1:4",
    )
    network = _network(default_heartbeat_interval_ms=INTERVAL_MS, liveness=LIVENESS)
    network = dataclasses.replace(network, brokers=(*network.brokers, other))
    thread = NodeThread(network, _signature(signing[0], network))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def _link(ctx: zmq.Context[Any], endpoint: str) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, LINK_ID)
    sock.connect(endpoint)
    return sock


def _answer(sock: zmq.Socket[bytes], kind: type) -> Any:
    """The first message of ``kind`` the node sends on ``sock`` (bounded wait)."""
    while sock.poll(int(WAIT_S * 1000)):
        message = decode_from_broker(
            sock.recv_multipart(), signature=b"S0B1", max_frame_bytes=1 << 20
        )
        if isinstance(message, kind):
            return message
    raise AssertionError(f"no {kind.__name__} within {WAIT_S} s")


def test_a_reconnected_link_keeps_its_routing_id_and_needs_no_new_hello(
    two: NodeThread, ctx: zmq.Context[Any]
) -> None:
    peer = two.endpoint(Channel.PEER)
    first = _link(ctx, peer)
    first.send_multipart(encode(Hello("other", "test", BrokerState.ACTIVE, 1, {}, TableMode.PULL)))
    assert _answer(first, Hello).broker_id == "solo"
    # The cut: the first connection is dead but nobody has closed it. The link reconnects with
    # the same routing id and goes on where it was (a TABLEREQ, no HELLO): the node hands the
    # routing id over to the new connection (without ROUTER_HANDOVER libzmq would refuse it,
    # and the answer would go down the dead one) and hears the link as the member it was.
    second = _link(ctx, peer)
    second.send_multipart(encode(TableReq("other", None)))
    table = _answer(second, Table)
    assert table.broker_id == "solo" and table.full
    assert two.call(lambda: two.node.broker.counters.get("peer_ignored", 0)) == 0  # type: ignore[union-attr]
    first.close(linger=0)
    second.close(linger=0)


#: The options are read off the link's socket by the loop's thread: with a lane the socket is
#: its thread's from the moment ``_connect_link`` has set them (phase 4b), not the loop's to
#: touch, so the options are read where the loop owns it; both take the one ``_connect_link``.
@LOOP_ONLY
def test_links_set_their_routing_id_heartbeat_and_reconnect_from_the_interval(
    two: NodeThread,
) -> None:
    def options() -> dict[str, Any]:
        sock = two.node._ports["link:other"].socket  # type: ignore[union-attr]
        sub = two.node._ports["config"].socket  # type: ignore[union-attr]
        names = ("HEARTBEAT_IVL", "HEARTBEAT_TIMEOUT", "RECONNECT_IVL", "RECONNECT_IVL_MAX")
        values = {name: sock.getsockopt(getattr(zmq, name)) for name in names}
        values["CONNECT_TIMEOUT"] = sock.getsockopt(zmq.CONNECT_TIMEOUT)
        values["routing_id"] = sock.getsockopt(zmq.ROUTING_ID)
        values["sub_heartbeat"] = sub.getsockopt(zmq.HEARTBEAT_IVL)
        return values

    got = two.call(options)
    assert got["HEARTBEAT_IVL"] == INTERVAL_MS and got["sub_heartbeat"] == INTERVAL_MS
    assert got["HEARTBEAT_TIMEOUT"] == (LIVENESS + 1) * INTERVAL_MS
    assert got["RECONNECT_IVL"] == got["RECONNECT_IVL_MAX"] == INTERVAL_MS // 2  # no backoff
    assert got["CONNECT_TIMEOUT"] == 1000
    routing_id = got["routing_id"]
    assert len(routing_id) == 16 and routing_id[:1] == b"L"


@pytest.mark.skipif(not LANE_BUILT, reason="the lane is C (scale0.net._zmqio.Lane): not built here")
@pytest.mark.parametrize("broker_io", ["lane"], indirect=True)
def test_a_link_connected_again_goes_to_the_lane_once_it_let_go_of_the_one_before(
    two: NodeThread,
) -> None:
    """Phase 4b: the lane owns our links; one connected again under the same id (what _reopen
    after a failed CURVE handshake, _rekey after new keys and a moved peer do) waits until the
    lane has let go of the one before (it refuses the id until released_links lists it), then
    is handed over; the old socket is closed, nothing fails."""
    node = two.node
    assert node is not None

    def link() -> Any:
        return node._lane_links.get("other")

    deadline = time.monotonic() + WAIT_S
    while two.call(link) is None:
        assert time.monotonic() < deadline, "the link never reached the lane"
        time.sleep(0.01)
    first = two.call(link)
    errors = two.call(lambda: node.stats()["net_internal_errors"])
    two.call(lambda: node._connect_link("other", first.endpoint))

    def settled() -> bool:
        now = node._lane_links.get("other")
        return (
            now is not None
            and now is not first
            and not node._lane_pending_links
            and not node._lane_releasing
        )

    while not two.call(settled):
        assert time.monotonic() < deadline, "the new link was never handed over"
        time.sleep(0.01)
    assert first.socket.closed
    assert two.call(lambda: node.stats()["net_internal_errors"]) == errors
