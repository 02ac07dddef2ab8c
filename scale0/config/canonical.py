"""Canonical JSON (sorted keys, no spaces, every field present) and its sha256: a config's identity.

The same config has the same canonical bytes whichever format carried it, so the sha256 (and the
signature over ``family|config_version|sha256``) is format-independent (docs/protocol.md §6).
"""

from __future__ import annotations

import hashlib
import json

from scale0.config.model import Config
from scale0.config.schema import to_tree


def canonical_json(config: Config) -> bytes:
    tree = to_tree(config, typed=True)
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def config_sha256(config: Config) -> str:
    return hashlib.sha256(canonical_json(config)).hexdigest()
