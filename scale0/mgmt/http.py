"""What every Scale0 HTTP server shares: security headers, the Host allow-list, binding.

The broker's management server (server.py) and the coordinator's status page (taskpage.py)
both answer only Host headers naming their own address (so a DNS-rebinding page cannot talk to
them) and send the same restrictive headers.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final

import tornado.netutil

__all__ = ["SECURITY_HEADERS", "allowed_hosts", "base_url", "bind"]

SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def allowed_hosts(address: str, port: int) -> frozenset[str]:
    """The Host headers a server answers: its address, plus localhost names on loopback."""
    names = {address}
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None and ip.is_loopback:
        names |= {"127.0.0.1", "localhost", "[::1]"}
    if ip is not None and ip.version == 6:
        names.add(f"[{address}]")
    return frozenset(f"{name}:{port}" for name in names)


def bind(address: str, port: int) -> tuple[list[socket.socket], int]:
    """Listening sockets on ``address:port`` (0 picks a port) and the port bound.

    Raises OSError when the address cannot be bound (the port is in use, ...).
    """
    sockets = tornado.netutil.bind_sockets(port, address, family=socket.AF_UNSPEC)
    return sockets, int(sockets[0].getsockname()[1])


def base_url(address: str, port: int, scheme: str = "http") -> str:
    """``http://address:port`` (``https`` for a TLS server; an IPv6 address in brackets)."""
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"
