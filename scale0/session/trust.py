"""A client or worker that checks the network config's signature itself (protocol.md §2.5).

Pure: the trusted keys are passed in as objects (``scale0.net.security.load_trusted_key``
reads them from a file or text). Rules (tests/session/test_trust.py names a test after each):

S1  A client or worker given a trusted signing key asks for the whole signed network config
    (CHECKCONFIG ``signed: true``) and uses a CONFIG only when all of these hold: it carries a
    ``signature``; its document parses as a valid network config in its ``config_type``; the
    document's canonical sha256 is the ``sha256`` option; the ``config_version`` option is the
    document's; the signature over ``family|config_version|sha256`` verifies against a trusted
    key (docs/protocol.md §6.2); and its family is the one verified before, if any.
S2  Versions only rise: a config older than the last verified one is refused; one of the same
    version is taken only if it is the same config (same sha256) or, as brokers do with a
    conflict (§6.3 rule 1, K4), has the smaller sha256.
S3  A refused config changes nothing: the last verified config (its brokers, endpoints and
    CURVE keys) stays in force. :class:`UntrustedConfig` says what is wrong, naming the
    version and the broker that sent it.
S4  What the owner learns from a verified config is its typed tree without ``admins`` (the
    admins' entries are never used by a client or worker).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.config.canonical import config_sha256
from scale0.config.errors import ConfigError
from scale0.config.formats import CONFIG_TYPE_FORMATS
from scale0.config.loader import loads
from scale0.config.schema import to_tree
from scale0.crypto.keys import SignatureError, key_id, verify_config
from scale0.session.errors import Scale0Error
from scale0.wire.client import Config

__all__ = ["ConfigTrust", "UntrustedConfig", "Verified"]


class UntrustedConfig(Scale0Error):
    """A CONFIG that S1/S2 refuse; ``reason`` says what is wrong, ``version`` is the one offered.

    A request that finds no broker with a config it can trust fails with it at its deadline.
    """

    def __init__(
        self,
        reason: str,
        *,
        version: int | None = None,
        sender: str = "",
        service: str | None = None,
        request_id: bytes | None = None,
    ) -> None:
        self.reason = reason
        self.version = version
        self.sender = sender
        where = f" from {sender}" if sender else ""
        offered = f" config_version {version}" if version is not None else " config"
        super().__init__(
            f"untrusted{offered}{where}: {reason}", service=service, request_id=request_id
        )

    def for_request(self, service: str, request_id: bytes) -> UntrustedConfig:
        """The same refusal, as the error of one request."""
        return UntrustedConfig(
            self.reason,
            version=self.version,
            sender=self.sender,
            service=service,
            request_id=request_id,
        )


@dataclass(frozen=True, slots=True)
class Verified:
    """A config that passed S1/S2: its version, digest, the key that signed it, and its tree."""

    version: int
    sha256: str
    family: str
    key_id: str
    document: dict[str, Any]


class ConfigTrust:
    """The trusted signing keys and the last verified config (S1-S4)."""

    def __init__(self, trusted: Iterable[Ed25519PublicKey]) -> None:
        self.trusted = tuple(trusted)
        if not self.trusted:
            raise ValueError("a ConfigTrust needs at least one trusted key")
        self.current: Verified | None = None
        self.refused = 0

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(key_id(key) for key in self.trusted)

    def check(self, message: Config, *, sender: str = "") -> Verified:
        """S1, S2: the verified config (now current), or UntrustedConfig (nothing changes, S3)."""
        try:
            verified = self._judge(message)
        except UntrustedConfig as exc:
            self.refused += 1
            raise UntrustedConfig(
                exc.reason, version=message.config_version, sender=sender
            ) from None
        self.current = verified
        return verified

    def _judge(self, message: Config) -> Verified:
        current = self.current
        version = message.config_version
        if current is not None and version < current.version:
            raise UntrustedConfig(f"it is older than the verified config_version {current.version}")
        if message.signature is None:
            raise UntrustedConfig(
                "it is not signed (a broker sends the whole signed config only over CURVE, "
                "docs/protocol.md §2.5)"
            )
        try:
            network = loads(
                message.document,
                CONFIG_TYPE_FORMATS[message.config_type],
                kind="network",
                source="CONFIG document",
            )
        except ConfigError as exc:
            first = exc.problems[0] if exc.problems else "invalid"
            raise UntrustedConfig(f"the document is not a valid network config: {first}") from None
        sha256 = config_sha256(network)
        if sha256 != message.sha256:
            raise UntrustedConfig(
                f"its sha256 option {message.sha256[:12]}… is not the document's "
                f"({sha256[:12]}…): the document was altered"
            )
        if network.config_version != version:
            raise UntrustedConfig(
                f"config_version {version} in the options, {network.config_version} in the document"
            )
        try:
            signer = verify_config(
                message.signature, network.family, network.config_version, sha256, self.trusted
            )
        except SignatureError as exc:
            ids = ", ".join(self.key_ids)
            raise UntrustedConfig(f"signature: {exc}; trusted key_id {ids}") from None
        if current is not None:
            if network.family != current.family:
                raise UntrustedConfig(
                    f"family {network.family!r} is not the verified family {current.family!r}"
                )
            # S2/K4: of two configs with one version, the smaller digest wins the conflict.
            if version == current.version and sha256 > current.sha256:
                raise UntrustedConfig(
                    f"another config of the verified config_version {version} "
                    f"(sha256 {current.sha256[:12]}… is kept: the smaller wins)"
                )
        tree = to_tree(network, typed=True)
        tree.pop("admins", None)  # S4
        return Verified(version, sha256, network.family, signer, tree)
