"""CURVE on the broker's sockets and ZAP through pyzmq's own zmq.auth (docs/operations.md "CURVE").

A broker whose file names ``curve_secret_key`` makes each of its bound sockets a CURVE server
(ZAP domain ``frontend``, ``backend``, ``peer``, ``config``), and every socket that connects to
a broker whose network-config entry carries a ``curve_public_key`` a CURVE client of that key.
Who may connect is judged by :func:`scale0.core.trust.admits` (pure, rule T5), asked by
pyzmq's :class:`zmq.auth.asyncio.AsyncioAuthenticator` on the broker's own loop (Tornado 6
runs on asyncio), through its credentials-provider callback: no hand-written ZAP handler.
The one addition (:class:`_Authenticator`) notes each ZAP request's peer address, so a refusal
is logged with its sender, and logs a request for a domain we never set before pyzmq refuses it.

A CURVE ROUTER is read by :func:`scale0.net.frames_io.recv_batch_keyed` (the C batch, or its
pyzmq fallback), which gives each message's ``User-Id`` property: the sender's public key (Z85),
which the authenticator set after ZAP said yes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import zmq
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils.monitor import recv_monitor_message

from scale0.config.model import NetworkConfig
from scale0.core.trust import DOMAINS, admits
from scale0.crypto.curve import CurveKeyPair
from scale0.crypto.keys import PUBLIC_KEY_ALGORITHM, load_public_key, parse_public_key_text
from scale0.session.trust import ConfigTrust

__all__ = [
    "Gatekeeper",
    "HandshakeWatch",
    "load_trusted_key",
    "make_client",
    "make_server",
    "server_key_for",
    "trust_for",
]

_POLLIN: Final = int(zmq.POLLIN)

#: A trusted config-signing key as a client or worker takes it: the key, its one-line text
#: (``ed25519 <base64>``), or the path of a public key file (the format of ``trusted_keys``).
TrustedKey = Ed25519PublicKey | str | os.PathLike[str]


def load_trusted_key(value: TrustedKey) -> Ed25519PublicKey:
    """The Ed25519 public key ``value`` names (docs/protocol.md §2.5, rule S1).

    A string starting ``ed25519 `` is the key's text; any other string or path is a public key
    file, read like a broker's ``trusted_keys``. CryptoError names the file and what is wrong.
    """
    if isinstance(value, Ed25519PublicKey):
        return value
    if isinstance(value, str) and value.strip().startswith(PUBLIC_KEY_ALGORITHM + " "):
        return parse_public_key_text(value)
    return load_public_key(value)


def trust_for(value: TrustedKey | None) -> ConfigTrust | None:
    """The ConfigTrust of a client or worker given ``trusted_key`` (None: it trusts its seed)."""
    return None if value is None else ConfigTrust((load_trusted_key(value),))


#: Called with (event, fields) for every refusal: the node's JSON logger.
LogSink = Callable[[str, dict[str, object]], None]


def make_server(sock: zmq.Socket[Any], keys: CurveKeyPair, domain: str) -> None:
    """Make ``sock`` (before bind) a CURVE server whose connections ZAP judges in ``domain``."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret.encode("ascii"))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public.encode("ascii"))
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode("ascii"))


def make_client(sock: zmq.Socket[Any], keys: CurveKeyPair, server_key: str) -> None:
    """Make the next ``connect`` of ``sock`` a CURVE client of ``server_key``.

    libzmq copies the options at each connect, so one socket (the config SUB) may connect to
    several servers, each with its own key, by setting the key before each connect.
    """
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode("ascii"))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public.encode("ascii"))
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret.encode("ascii"))


def plain_client(sock: zmq.Socket[Any]) -> None:
    """Undo :func:`make_client` for the next ``connect`` (a server that speaks no CURVE).

    Setting ZMQ_CURVE_SERVER to 0 is libzmq's way back to the NULL mechanism (an empty
    server key is refused with EINVAL); on a socket that never had CURVE it changes nothing.
    """
    sock.setsockopt(zmq.CURVE_SERVER, 0)


def server_key_for(
    network: NetworkConfig, endpoint: str, seeds: Mapping[str, str] = {}
) -> str | None:
    """The CURVE key of the broker listening at ``endpoint``: its network-config entry's, else
    the broker file's ``seed_curve_keys`` for a seed; None: it speaks no CURVE."""
    for entry in network.brokers:
        if endpoint in (entry.frontend, entry.backend, entry.peer, entry.config_pub):
            return entry.serves_curve
    return seeds.get(endpoint)


class Gatekeeper:
    """ZAP for one broker: pyzmq's asyncio authenticator, judging by the running config.

    ``network()`` gives the config in force at each handshake, so a new config (a key added,
    a grant ended) applies to the next connection at once. Refusals are counted in
    :attr:`refused` and logged (``curve_refused``: domain, peer address, key, reason).
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        network: Callable[[], NetworkConfig],
        log: LogSink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._network = network
        self._log = log
        self._clock = clock
        self.refused = 0
        self.admitted = 0
        self.address = ""  # of the ZAP request being judged (set by _Authenticator)
        self._auth = _Authenticator(self, context)

    def start(self) -> None:
        self._auth.start()
        for domain in DOMAINS:
            self._auth.configure_curve_callback(domain, self)

    def stop(self) -> None:
        self._auth.stop()

    def callback(self, domain: str, key: bytes) -> bool:
        """zmq.auth's credentials provider: may ``key`` (Z85) connect in ``domain``?"""
        text = key.decode("ascii", "replace")
        reason = admits(self._network(), domain, text, self._clock())
        if reason is None:
            self.admitted += 1
            return True
        self.refuse(domain, text, reason)
        return False

    def refuse(self, domain: str, key: str, reason: str) -> None:
        self.refused += 1
        self._log(
            "curve_refused",
            {"domain": domain, "address": self.address, "key": key, "reason": reason},
        )


class _Authenticator(AsyncioAuthenticator):
    """pyzmq's authenticator; notes the sender and logs an unknown domain, then lets pyzmq judge."""

    def __init__(self, gate: Gatekeeper, context: zmq.Context[Any]) -> None:
        super().__init__(context, log=logging.getLogger("scale0.zap"))
        self._gate = gate

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) >= 6:
            self._gate.address = msg[3].decode("utf-8", "replace")
            domain = msg[2].decode("utf-8", "replace")
            if domain not in DOMAINS:
                self._gate.refuse(domain, "", f"unknown ZAP domain {domain!r}")
        await super().handle_zap_message(msg)


#: The handshake failures a watch reports (libzmq's monitor events).
HANDSHAKE_FAILED: Final = int(
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)

#: Called with (watch name, endpoint, event name, detail) for every handshake that failed.
FailSink = Callable[[str, str, str, str], None]


class HandshakeWatch:
    """Handshake failures of watched sockets, read on the loop through libzmq monitors.

    libzmq never retries a connection whose handshake failed (a CURVE client meeting a NULL
    server, a key ZAP refused): whoever owns the socket must open it again, and a bound socket
    sees only the failure, never who failed. ``on_fail`` is told each one.
    """

    def __init__(self, loop: Any, on_fail: FailSink) -> None:
        self._loop = loop
        self._on_fail = on_fail
        self._watched: dict[str, tuple[zmq.Socket[Any], zmq.Socket[Any], int]] = {}

    def watch(self, name: str, sock: zmq.Socket[Any]) -> None:
        self.unwatch(name)
        monitor = sock.get_monitor_socket(HANDSHAKE_FAILED)
        fd = monitor.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._watched[name] = (sock, monitor, fd)
        self._loop.add_handler(fd, lambda _fd, _events: self._readable(name), 1)  # READ
        # A ZMQ FD only signals after the socket processed its commands once: ask ZMQ_EVENTS
        # now (and read what may already wait), or the first failure would go unnoticed.
        self._loop.add_callback(self._readable, name)

    def watching(self, name: str, sock: zmq.Socket[Any]) -> bool:
        """Whether ``sock`` is watched as ``name`` already."""
        entry = self._watched.get(name)
        return entry is not None and entry[0] is sock

    def unwatch(self, name: str) -> None:
        entry = self._watched.pop(name, None)
        if entry is None:
            return
        sock, monitor, fd = entry
        self._loop.remove_handler(fd)
        if not sock.closed:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
        monitor.close(linger=0)

    def close(self) -> None:
        for name in list(self._watched):
            self.unwatch(name)

    def _readable(self, name: str) -> None:
        entry = self._watched.get(name)
        if entry is None:
            return
        monitor = entry[1]
        for _ in range(100):  # bounded: the rest comes at the next wake-up
            try:
                if not int(monitor.getsockopt(zmq.EVENTS)) & _POLLIN:
                    return
                message = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            event = message.get("event")
            if not isinstance(event, int) or not event & HANDSHAKE_FAILED:
                continue
            endpoint = message.get("endpoint", b"")
            text = endpoint.decode("utf-8", "replace") if isinstance(endpoint, bytes) else ""
            self._on_fail(name, text, _event_name(event), _event_name(message.get("value")))
        self._loop.add_callback(self._readable, name)  # more may wait: read on, not now


def _event_name(value: object) -> str:
    name = getattr(value, "name", None)
    return str(name) if name is not None else str(value)
