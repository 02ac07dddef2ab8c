"""The hub's switch, driven with numbers: forwarding, learning, loss and delay per direction."""

from __future__ import annotations

from typing import Any

import pytest

from scale0.chaos.switch import PACKET_OUTGOING, VNET_HDR_BYTES, Port, Switch

HDR = b"\x00" * VNET_HDR_BYTES
MAC = {name: bytes([2, 0, 0, 0, 0, i]) for i, name in enumerate(("p1", "p2", "p3"), 1)}
BROADCAST = b"\xff" * 6


class FakeSocket:
    """What Switch uses of an AF_PACKET socket: recvfrom, send, fileno."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.inbox: list[tuple[bytes, tuple[Any, ...]]] = []
        self.sent: list[bytes] = []

    def fileno(self) -> int:
        return self.fd

    def recvfrom(self, size: int) -> tuple[bytes, tuple[Any, ...]]:
        if not self.inbox:
            raise BlockingIOError
        return self.inbox.pop(0)

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)


def frame(src: str, dst: bytes, payload: bytes) -> bytes:
    return HDR + dst + MAC[src] + b"\x08\x00" + payload


def switch() -> tuple[Switch, dict[str, FakeSocket]]:
    socks = {name: FakeSocket(i) for i, name in enumerate(("p1", "p2", "p3"), 10)}
    return Switch([Port(n, s) for n, s in socks.items()], seed=1), socks  # type: ignore[arg-type]


def arrive(sw: Switch, socks: dict[str, FakeSocket], port: str, data: bytes, now: float) -> None:
    socks[port].inbox.append((data, (port, 3, 0)))
    sw.receive(sw.ports[port], now)


def test_broadcast_floods_then_the_switch_learns_where_each_mac_is() -> None:
    sw, socks = switch()
    arrive(sw, socks, "p1", frame("p1", BROADCAST, b"arp"), 0.0)
    assert socks["p2"].sent and socks["p3"].sent and not socks["p1"].sent
    arrive(sw, socks, "p2", frame("p2", MAC["p1"], b"to-1"), 0.0)
    assert socks["p1"].sent[-1].endswith(b"to-1")
    assert not socks["p3"].sent[-1].endswith(b"to-1")  # learned: not flooded


def test_its_own_sends_seen_again_are_not_forwarded() -> None:
    sw, socks = switch()
    socks["p1"].inbox.append((frame("p1", BROADCAST, b"echo"), ("p1", 3, PACKET_OUTGOING)))
    sw.receive(sw.ports["p1"], 0.0)
    assert not socks["p2"].sent and not socks["p3"].sent


def test_loss_is_per_port_and_direction() -> None:
    sw, socks = switch()
    arrive(sw, socks, "p1", frame("p1", BROADCAST, b"hello"), 0.0)
    arrive(sw, socks, "p2", frame("p2", BROADCAST, b"hello"), 0.0)
    assert sw.command({"port": "p1", "loss_out": 1.0}) == {"ok": True}
    before = len(socks["p1"].sent)
    arrive(sw, socks, "p2", frame("p2", MAC["p1"], b"lost"), 0.0)
    assert len(socks["p1"].sent) == before  # towards p1: dropped
    arrive(sw, socks, "p1", frame("p1", MAC["p2"], b"heard"), 0.0)
    assert socks["p2"].sent[-1].endswith(b"heard")  # from p1: through
    sw.command({"clear": True})
    arrive(sw, socks, "p2", frame("p2", MAC["p1"], b"back"), 0.0)
    assert socks["p1"].sent[-1].endswith(b"back")


def test_delay_holds_frames_in_order_until_they_are_due() -> None:
    sw, socks = switch()
    arrive(sw, socks, "p2", frame("p2", BROADCAST, b"hello"), 0.0)
    sw.command({"port": "p1", "delay_in_ms": 300})
    for i in range(3):
        arrive(sw, socks, "p1", frame("p1", MAC["p2"], b"d%d" % i), 1.0 + i * 0.01)
    assert sw.release(1.29) == pytest.approx(1.3)  # nothing due yet: the first is due at 1.0 + 0.3
    assert socks["p2"].sent == []
    assert sw.release(1.305) == pytest.approx(1.31)
    assert [f[-2:] for f in socks["p2"].sent] == [b"d0"]
    assert sw.release(1.35) is None  # nothing held any more
    assert [f[-2:] for f in socks["p2"].sent] == [b"d0", b"d1", b"d2"]


def test_bad_commands_are_refused_with_the_reason() -> None:
    sw, _ = switch()
    assert "unknown port" in str(sw.command({"port": "p9", "loss_in": 1}))
    assert "must be a number" in str(sw.command({"port": "p1", "loss_in": -1}))
    assert "must be a number" in str(sw.command({"port": "p1", "loss_in": True}))
    assert "unknown setting" in str(sw.command({"port": "p1", "jitter_ms": 5}))
    assert sw.command({"stats": True})["ports"]["p1"]["received"] == 0  # type: ignore[index]
