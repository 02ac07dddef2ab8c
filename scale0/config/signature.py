"""Detached signature files of a network config: their JSON form, making one, checking one.

A signature file (``network.yaml.sig`` by default) is one JSON object::

    {"family": "demo", "config_version": 1, "sha256": "<64 hex>",
     "signature": "<128 hex digits: ed25519 signature>", "key_id": "<16 hex>",
     "view_signature": "<128 hex digits>"}

The signature covers ``family|config_version|sha256`` (scale0.crypto.keys.signed_bytes), where
``sha256`` is the config's canonical hash, so one signature holds for the config in every format.
``view_signature``, by the same key, covers the config's client view
(``client_view|family|config_version|sha256|view sha256``, scale0.crypto.keys.view_signed_bytes):
what brokers hand a client or worker that checks signatures itself (docs/protocol.md §2.5). A
file made before the view was signed has no ``view_signature``; it still verifies, but such a
config gives verifying clients nothing they can check (sign it again).
``key_id`` is not signed; it names the key that made the signature and must agree with the
trusted key that verifies it. This module is pure (no click, no sockets) so that the CLI and the
broker share it. Every refusal is a SignatureError whose message says why.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from scale0.config.canonical import client_view_sha256, config_sha256
from scale0.config.model import NetworkConfig
from scale0.crypto.keys import (
    SignatureError,
    key_id,
    sign_config,
    sign_view,
    verify_config,
    verify_view,
)

__all__ = [
    "MAX_SIGNATURE_FILE_BYTES",
    "SignatureFile",
    "SignatureFileError",
    "default_signature_path",
    "parse_signature",
    "read_signature",
    "signature_for",
    "verify_signature",
]

MAX_SIGNATURE_FILE_BYTES = 64 * 1024
"""A signature file is about 300 bytes; anything much bigger is refused before it is parsed."""

_FIELDS = ("family", "config_version", "sha256", "signature", "key_id")
_OPTIONAL = ("view_signature",)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_KEY_ID_RE = re.compile(r"[0-9a-f]{16}")


class SignatureFileError(SignatureError):
    """A signature file is unreadable or malformed; ``source`` names it, ``reason`` says why."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


@dataclass(frozen=True, slots=True)
class SignatureFile:
    """The content of a signature file: what was signed, the signature, and who signed it."""

    family: str
    config_version: int
    sha256: str
    signature: str
    key_id: str
    view_signature: str | None = None  # over the client view; None in files made before it

    def to_json(self) -> bytes:
        """The file's bytes: the fields as a JSON object, one per line, newline-terminated."""
        fields = {name: value for name, value in asdict(self).items() if value is not None}
        return (json.dumps(fields, indent=2) + "\n").encode("utf-8")


def default_signature_path(config_path: str | os.PathLike[str]) -> Path:
    """Where a config's signature lives unless told otherwise: the config's name plus ``.sig``."""
    path = Path(config_path)
    return path.with_name(path.name + ".sig")


def signature_for(config: NetworkConfig, private_key: Ed25519PrivateKey) -> SignatureFile:
    """Sign ``config`` (its family, config_version and canonical sha256) with ``private_key``."""
    sha256 = config_sha256(config)
    signature = sign_config(private_key, config.family, config.config_version, sha256)
    view = sign_view(
        private_key, config.family, config.config_version, sha256, client_view_sha256(config)
    )
    return SignatureFile(
        family=config.family,
        config_version=config.config_version,
        sha256=sha256,
        signature=signature,
        key_id=key_id(private_key.public_key()),
        view_signature=view,
    )


def parse_signature(data: bytes, *, source: str = "signature file") -> SignatureFile:
    """Parse the bytes of a signature file; SignatureFileError (naming ``source``) if malformed.

    Exactly the five fields and the optional ``view_signature``, with the right types and
    forms; nothing missing, nothing extra.
    """
    if len(data) > MAX_SIGNATURE_FILE_BYTES:
        raise SignatureFileError(source, f"over the {MAX_SIGNATURE_FILE_BYTES}-byte limit")
    try:
        tree: Any = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SignatureFileError(source, "not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise SignatureFileError(
            source, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(tree, dict):
        raise SignatureFileError(
            source, f"expected a JSON object with the keys {', '.join(_FIELDS)}"
        )
    missing = [name for name in _FIELDS if name not in tree]
    if missing:
        raise SignatureFileError(source, f"missing {', '.join(missing)}")
    extra = sorted(str(name) for name in tree if name not in _FIELDS + _OPTIONAL)
    if extra:
        raise SignatureFileError(source, f"unknown key(s) {', '.join(extra)}")
    family = tree["family"]
    version = tree["config_version"]
    sha256 = tree["sha256"]
    signature = tree["signature"]
    signer = tree["key_id"]
    if not isinstance(family, str) or not family:
        raise SignatureFileError(source, "family must be a non-empty string")
    if type(version) is not int or version < 0:
        raise SignatureFileError(source, "config_version must be a non-negative integer")
    if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
        raise SignatureFileError(source, "sha256 must be 64 lowercase hex characters")
    if not isinstance(signature, str) or not signature:
        raise SignatureFileError(source, "signature must be a non-empty hex string")
    if not isinstance(signer, str) or not _KEY_ID_RE.fullmatch(signer):
        raise SignatureFileError(source, "key_id must be 16 lowercase hex characters")
    view = tree.get("view_signature")
    if view is not None and (not isinstance(view, str) or not view):
        raise SignatureFileError(source, "view_signature must be a non-empty hex string")
    return SignatureFile(family, version, sha256, signature, signer, view)


def read_signature(path: str | os.PathLike[str]) -> SignatureFile:
    """Read and parse a signature file; SignatureFileError if unreadable or malformed."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SIGNATURE_FILE_BYTES + 1)
    except OSError as exc:
        raise SignatureFileError(source, f"cannot read: {exc.strerror or exc}") from None
    return parse_signature(data, source=source)


def verify_signature(
    config: NetworkConfig, sig: SignatureFile, trusted: Iterable[Ed25519PublicKey]
) -> str:
    """Check that ``sig`` is a trusted signature of ``config`` as it is now; return the key_id.

    SignatureError, saying why, when the signature names another family, config_version or
    sha256 than the config has (the config changed since it was signed), when no trusted key
    verifies it, or when the key that verifies it is not the one the file names.
    """
    if sig.family != config.family:
        raise SignatureError(
            f"the signature is for family {sig.family!r}, the config is family {config.family!r}"
        )
    if sig.config_version != config.config_version:
        raise SignatureError(
            f"the signature is for config_version {sig.config_version}, the config has "
            f"config_version {config.config_version}; sign the config again"
        )
    sha256 = config_sha256(config)
    if sig.sha256 != sha256:
        raise SignatureError(
            f"the signature is for sha256 {sig.sha256}, the config's sha256 is {sha256}: "
            "the config changed since it was signed"
        )
    verified_by = verify_config(
        sig.signature, config.family, config.config_version, sha256, trusted
    )
    if verified_by != sig.key_id:
        raise SignatureError(
            f"the signature file names key {sig.key_id}, but the signature was made by key "
            f"{verified_by}; the file has been altered"
        )
    if sig.view_signature is not None:
        try:
            view_by = verify_view(
                sig.view_signature,
                config.family,
                config.config_version,
                sha256,
                client_view_sha256(config),
                trusted,
            )
        except SignatureError as exc:
            raise SignatureError(f"view_signature: {exc}") from None
        if view_by != verified_by:
            raise SignatureError(
                f"view_signature was made by key {view_by}, the signature by {verified_by}"
            )
    return verified_by
