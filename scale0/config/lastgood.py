"""The last good network config on disk: written atomically when one applies, read at start.

A broker that restarts begins from the config it last ran (docs/operations.md), not from
nothing: ``data_dir/network-config.json`` holds the canonical JSON document with the sha256,
signature and origin it arrived with. Reading it never trusts it: the broker's core judges it
like any other offer (signature, family, version), so a tampered file is refused, not applied.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scale0.config.errors import ConfigError
from scale0.config.loader import read_bounded, write_atomic

__all__ = ["FILE_NAME", "LastGood", "read_last_good", "write_last_good"]

FILE_NAME: Final = "network-config.json"


@dataclass(frozen=True, slots=True)
class LastGood:
    document: bytes  # canonical JSON of the network config
    sha256: str
    signature: str
    origin: str
    view_signature: str | None = None  # the client view's (§6.2); absent in older files


def write_last_good(data_dir: str | os.PathLike[str], last: LastGood) -> Path:
    """Write atomically (temp file, fsync, rename): a crash leaves the old file or the new."""
    directory = Path(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE_NAME
    record = {
        "sha256": last.sha256,
        "signature": last.signature,
        "origin": last.origin,
        "document": json.loads(last.document),
    }
    if last.view_signature is not None:
        record["view_signature"] = last.view_signature
    write_atomic(path, json.dumps(record, sort_keys=True, indent=1).encode() + b"\n", mode=0o600)
    return path


def read_last_good(data_dir: str | os.PathLike[str]) -> LastGood | None:
    """The saved config, or None when there is none; ConfigError naming the file if unreadable."""
    path = Path(data_dir) / FILE_NAME
    if not path.exists():
        return None
    try:
        record = json.loads(read_bounded(path))
    except (OSError, ValueError) as exc:
        raise ConfigError.single(
            f"cannot read the last good config: {exc}", file=str(path)
        ) from None
    fields = ("sha256", "signature", "origin", "document")
    if not isinstance(record, dict) or any(key not in record for key in fields):
        raise ConfigError.single(
            f"not a saved config: it needs {', '.join(fields)}", file=str(path)
        )
    if not all(isinstance(record[key], str) for key in fields[:3]):
        raise ConfigError.single("sha256, signature and origin must be strings", file=str(path))
    view = record.get("view_signature")
    if view is not None and not isinstance(view, str):
        raise ConfigError.single("view_signature must be a string", file=str(path))
    document = json.dumps(record["document"], sort_keys=True, separators=(",", ":"))
    return LastGood(
        document.encode("utf-8"), record["sha256"], record["signature"], record["origin"], view
    )
