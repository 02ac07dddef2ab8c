"""A client or worker that checks the network config's signature itself (protocol.md §2.5).

Pure: the trusted keys are passed in as objects (``scale0.net.security.load_trusted_key``
reads them from a file or text). What it checks is the **client view** (§3.2), signed by the
config source with the family's key (``view_signature``, §6.2): never the whole config, which
carries the admins' scrypt hashes and goes to brokers only. Rules
(tests/session/test_trust.py names a test after each):

S1  A client or worker given a trusted signing key asks for the signed client view
    (CHECKCONFIG ``signed: true``) and uses a CONFIG only when all of these hold: it carries
    ``view_signature`` and ``config_sha256`` (a config whose source signed no view has none,
    and is refused naming ``view_signature``); its document parses in its ``config_type`` as
    the keys of a network config, typed by the schema; that view's canonical sha256 is the
    ``sha256`` option; the view names a ``family`` and a ``config_version`` equal to the
    option's; ``view_signature`` over ``client_view|family|config_version|config_sha256|sha256``
    verifies against a trusted key (docs/protocol.md §6.2); the view carries no ``admins``;
    and its family is the one verified before, if any.
S2  Versions only rise: a view older than the last verified one is refused (a replayed old
    view too: its signature binds its version); one of the same version is taken only if it
    belongs to the same config (same ``config_sha256``) or, as brokers settle a conflict
    (§6.3 rule 1, K4), to the config with the smaller ``config_sha256``.
S3  A refused config changes nothing: the last verified view (its brokers, endpoints and
    CURVE keys) stays in force. :class:`UntrustedConfig` says what is wrong, naming the
    version and the broker that sent it.
S4  What the owner learns is the verified view, exactly as signed: no ``admins``, nothing
    the config's ``client_view`` does not name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from scale0.config.canonical import tree_sha256
from scale0.config.errors import ConfigError
from scale0.config.formats import CONFIG_TYPE_FORMATS, parse
from scale0.config.model import NetworkConfig
from scale0.config.schema import typed_fields
from scale0.crypto.keys import SignatureError, key_id, verify_view
from scale0.session.errors import Scale0Error
from scale0.wire.client import Config
from scale0.wire.frames import ConfigType

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
    """A view that passed S1/S2: its version, its digest and its whole config's, its family,
    the key that signed it, and the view's typed tree."""

    version: int
    sha256: str
    config_sha256: str
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
        if message.view_signature is None or message.config_sha256 is None:
            missing = "view_signature" if message.view_signature is None else "config_sha256"
            raise UntrustedConfig(
                f"it carries no {missing}: the family's config was signed without its client "
                "view (sign it again with this version's scale0ctl config sign, or reload the "
                "config source; docs/operations.md)"
            )
        view = _view_tree(message)
        sha256 = tree_sha256(view)
        if sha256 != message.sha256:
            raise UntrustedConfig(
                f"its sha256 option {message.sha256[:12]}… is not the document's "
                f"({sha256[:12]}…): the document was altered"
            )
        family = view.get("family")
        claimed = view.get("config_version")
        if not isinstance(family, str) or type(claimed) is not int:
            raise UntrustedConfig("the view names no family or no config_version")
        if claimed != version:
            raise UntrustedConfig(
                f"config_version {version} in the options, {claimed} in the document"
            )
        try:
            signer = verify_view(
                message.view_signature, family, version, message.config_sha256, sha256, self.trusted
            )
        except SignatureError as exc:
            ids = ", ".join(self.key_ids)
            raise UntrustedConfig(f"view_signature: {exc}; trusted key_id {ids}") from None
        if "admins" in view:  # S4: no signer of ours puts them there
            raise UntrustedConfig("the view carries admins, which no client view may")
        if current is not None:
            if family != current.family:
                raise UntrustedConfig(
                    f"family {family!r} is not the verified family {current.family!r}"
                )
            # S2/K4: of two configs with one version, the smaller whole-config digest wins.
            whole = message.config_sha256
            if version == current.version and whole > current.config_sha256:
                raise UntrustedConfig(
                    f"another config of the verified config_version {version} "
                    f"(config_sha256 {current.config_sha256[:12]}… is kept: the smaller wins)"
                )
        return Verified(version, sha256, message.config_sha256, family, signer, view)


def _view_tree(message: Config) -> dict[str, Any]:
    """The CONFIG's document as the typed view tree the signer hashed (strict: a document
    that does not parse, or whose values the schema cannot type, is refused)."""
    try:
        tree: Any = parse(message.document, CONFIG_TYPE_FORMATS[message.config_type]).tree
    except ConfigError as exc:
        first = exc.problems[0] if exc.problems else "invalid"
        raise UntrustedConfig(f"the document does not parse: {first}") from None
    if not isinstance(tree, Mapping):
        raise UntrustedConfig("the document is not a mapping of network config keys")
    if message.config_type is ConfigType.JSON:
        return dict(tree)
    typed, problems = typed_fields(NetworkConfig, tree)
    if problems:
        first = problems[0]
        raise UntrustedConfig(f"the document does not type: {first.path}: {first.message}")
    return typed
