"""Canonical JSON (sorted keys, no spaces, every field present) and its sha256: a config's identity.

The same config has the same canonical bytes whichever format carried it, so the sha256 (and the
signature over ``family|config_version|sha256``) is format-independent (docs/protocol.md §6).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from scale0.config.model import Config, NetworkConfig
from scale0.config.schema import to_tree


def canonical_bytes(tree: Any) -> bytes:
    """Canonical JSON of a typed plain tree: sorted keys, no spaces, UTF-8."""
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def canonical_json(config: Config) -> bytes:
    return canonical_bytes(to_tree(config, typed=True))


def config_sha256(config: Config) -> str:
    return hashlib.sha256(canonical_json(config)).hexdigest()


def tree_sha256(tree: Any) -> str:
    """sha256 of a typed plain tree's canonical JSON (a client view: part of a config)."""
    return hashlib.sha256(canonical_bytes(tree)).hexdigest()


def client_view_tree(config: NetworkConfig) -> dict[str, Any]:
    """The client view (docs/protocol.md §3.2) as a typed tree: the top-level keys the config's
    ``client_view`` names, never ``admins``. Brokers send it, config sources sign it."""
    tree = to_tree(config, typed=True)
    return {key: tree[key] for key in config.client_view if key in tree and key != "admins"}


def client_view_sha256(config: NetworkConfig) -> str:
    """sha256 of the client view's canonical JSON: what a client-view signature covers."""
    return tree_sha256(client_view_tree(config))
