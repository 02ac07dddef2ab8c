"""The stores every store test runs against: add a kind here and every test runs on it too."""

from __future__ import annotations

from pathlib import Path

from scale0.tasks.store import SQLiteStore, Store

#: Store kinds the parametrised tests cover (PostgreSQL is not built yet: see docs/tasks.md).
STORE_KINDS = ("sqlite",)


def open_store(kind: str, where: str | Path) -> Store:
    """A store of ``kind`` at ``where`` (a file path for SQLite)."""
    if kind == "sqlite":
        return SQLiteStore(Path(where))
    raise ValueError(f"unknown store kind {kind!r}")
