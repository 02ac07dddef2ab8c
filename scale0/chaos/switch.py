"""The hub's Ethernet switch: frames between veth ports, with per-port loss and delay.

Run inside the hub's network namespace (``python -m scale0.chaos.switch p1 p2 p3``); the
partition harness (:mod:`scale0.chaos.lab`) starts it. It plays the part a Linux bridge plus
``tc netem`` would, because this project's CI kernel has no ``sch_netem`` (``tc qdisc add ...
netem`` answers "Specified qdisc kind is unknown"): a learning switch over AF_PACKET sockets,
one per hub-side veth end, that drops or holds back frames as told.

Frames are read and written with ``PACKET_VNET_HDR``: the kernel hands each frame with its
virtio-net header (checksum still to be filled, TCP segmentation still to be done) and takes it
back the same way, so TCP's offloads keep working across the switch without ethtool.

Control: one JSON object per line on stdin, one answer line on stdout::

    {"port": "p1", "loss_in": 1.0}     frames arriving from p1 (sent by that broker) dropped
    {"port": "p1", "loss_out": 0.3}    frames the switch sends out of p1 (to it) dropped, 30 %
    {"port": "p1", "delay_in_ms": 300} frames from p1 held back 300 ms (delay_out_ms: to p1)
    {"clear": true}                    every port back to no loss, no delay
    {"stats": true}                    counters: forwarded, dropped, delayed per port

Cutting a link is not the switch's business: the harness does it with ``ip link set ... down``.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import select
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Port", "Switch", "main"]

ETH_P_ALL: Final = 0x0003
SOL_PACKET: Final = 263
PACKET_VNET_HDR: Final = 15
PACKET_OUTGOING: Final = 4
VNET_HDR_BYTES: Final = 10
#: Large enough for a 64 KiB GSO frame and its virtio-net header.
FRAME_BUFFER: Final = 70_000
BROADCAST: Final = b"\xff" * 6


@dataclass
class Port:
    """One hub-side veth end and what the harness asked to do to its traffic."""

    name: str
    sock: socket.socket
    loss_in: float = 0.0
    loss_out: float = 0.0
    delay_in_s: float = 0.0
    delay_out_s: float = 0.0
    counters: dict[str, int] = field(
        default_factory=lambda: {"received": 0, "sent": 0, "dropped": 0, "delayed": 0, "errors": 0}
    )

    def clear(self) -> None:
        self.loss_in = self.loss_out = self.delay_in_s = self.delay_out_s = 0.0


#: Receive buffer per port: room for seconds of the family's traffic should the switch be
#: starved of CPU on a loaded machine (a full buffer drops frames, and TCP then backs off).
RCVBUF_BYTES: Final = 16 << 20
SO_RCVBUFFORCE: Final = 33


def open_port(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    try:  # root may exceed net.core.rmem_max
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RCVBUF_BYTES)
    sock.bind((name, ETH_P_ALL))
    sock.setblocking(False)
    return sock


class Switch:
    """A learning switch with per-port faults; time and randomness are injectable for tests."""

    def __init__(self, ports: list[Port], *, seed: int | None = None) -> None:
        self.ports = {port.name: port for port in ports}
        self._by_fd = {port.sock.fileno(): port for port in ports}
        self._macs: dict[bytes, Port] = {}
        self._held: list[tuple[float, int, str, bytes]] = []
        self._seq = 0
        self._random = random.Random(seed)  # noqa: S311 - simulated loss, not secrets

    # ---- control ----

    def command(self, order: dict[str, object]) -> dict[str, object]:
        if order.get("clear"):
            for port in self.ports.values():
                port.clear()
            return {"ok": True}
        if order.get("stats"):
            return {"ok": True, "ports": {n: dict(p.counters) for n, p in self.ports.items()}}
        name = order.get("port")
        if not isinstance(name, str) or name not in self.ports:
            return {"ok": False, "error": f"unknown port {name!r}; ports: {sorted(self.ports)}"}
        port = self.ports[name]
        for key, value in order.items():
            if key == "port":
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                return {"ok": False, "error": f"{key} must be a number >= 0, not {value!r}"}
            if key == "loss_in":
                port.loss_in = min(1.0, float(value))
            elif key == "loss_out":
                port.loss_out = min(1.0, float(value))
            elif key == "delay_in_ms":
                port.delay_in_s = float(value) / 1000
            elif key == "delay_out_ms":
                port.delay_out_s = float(value) / 1000
            else:
                return {"ok": False, "error": f"unknown setting {key!r}"}
        return {"ok": True}

    # ---- frames ----

    def receive(self, port: Port, now: float) -> None:
        """Read what ``port`` has waiting (bounded) and forward or hold each frame."""
        for _ in range(256):
            try:
                data, address = port.sock.recvfrom(FRAME_BUFFER)
            except BlockingIOError:
                return
            except OSError:  # the link went down under us
                port.counters["errors"] += 1
                return
            if address[2] == PACKET_OUTGOING:  # our own send, seen again
                continue
            port.counters["received"] += 1
            frame = data[VNET_HDR_BYTES:]
            if len(frame) < 14:
                continue
            self._macs[frame[6:12]] = port
            if port.loss_in and self._random.random() < port.loss_in:
                port.counters["dropped"] += 1
                continue
            target = self._macs.get(frame[0:6]) if frame[0:6] != BROADCAST else None
            outs = [target] if target is not None and target is not port else None
            if outs is None:
                outs = [p for p in self.ports.values() if p is not port]
            for out in outs:
                if out.loss_out and self._random.random() < out.loss_out:
                    out.counters["dropped"] += 1
                    continue
                delay = port.delay_in_s + out.delay_out_s
                if delay > 0:
                    self._seq += 1
                    heapq.heappush(self._held, (now + delay, self._seq, out.name, data))
                    out.counters["delayed"] += 1
                else:
                    self._send(out, data)

    def release(self, now: float) -> float | None:
        """Send the held frames that are due; return when the next one is (None: none held)."""
        while self._held and self._held[0][0] <= now:
            _due, _seq, name, data = heapq.heappop(self._held)
            self._send(self.ports[name], data)
        return self._held[0][0] if self._held else None

    def _send(self, port: Port, data: bytes) -> None:
        try:
            port.sock.send(data)
            port.counters["sent"] += 1
        except OSError:  # link down, queue full: the frame is lost, as on a wire
            port.counters["errors"] += 1

    def port_of(self, fd: int) -> Port:
        return self._by_fd[fd]


def main(argv: list[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv)
    if not names:
        print("usage: python -m scale0.chaos.switch PORT...", file=sys.stderr)
        return 2
    # The switch is the family's network: on a loaded machine it must not wait behind the
    # processes it carries traffic for (it only runs when frames arrive or fall due).
    with contextlib.suppress(OSError):
        os.nice(-10)
    switch = Switch([Port(name, open_port(name)) for name in names])
    poller = select.epoll()
    for port in switch.ports.values():
        poller.register(port.sock.fileno(), select.EPOLLIN)
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    poller.register(stdin, select.EPOLLIN)
    pending = b""
    print(json.dumps({"ready": True, "ports": names}), flush=True)
    while True:
        next_due = switch.release(time.monotonic())
        timeout = -1.0 if next_due is None else max(0.0, next_due - time.monotonic())
        for fd, _mask in poller.poll(timeout):
            if fd == stdin:
                try:
                    chunk = os.read(stdin, 65536)
                except BlockingIOError:
                    continue
                if not chunk:  # the harness went away: so do we
                    return 0
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    try:
                        order = json.loads(line)
                        answer = (
                            switch.command(order)
                            if isinstance(order, dict)
                            else {"ok": False, "error": "a command is a JSON object"}
                        )
                    except ValueError as exc:
                        answer = {"ok": False, "error": f"not JSON: {exc}"}
                    print(json.dumps(answer), flush=True)
            else:
                switch.receive(switch.port_of(fd), time.monotonic())


if __name__ == "__main__":
    raise SystemExit(main())
