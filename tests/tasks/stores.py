"""The stores every store test runs against: add a kind here and every test runs on it too."""

from __future__ import annotations

from pathlib import Path

from scale0.tasks.store import SQLiteStore, Store

#: Store kinds the parametrised tests cover.
STORE_KINDS = ("sqlite", "postgresql")


def open_store(kind: str, where: str | Path) -> Store:
    """A store of ``kind`` at ``where`` (a file path for SQLite, a DSN for PostgreSQL)."""
    if kind == "sqlite":
        return SQLiteStore(Path(where))
    if kind == "postgresql":
        from scale0.tasks.pgstore import PostgresStore

        return PostgresStore(str(where))
    raise ValueError(f"unknown store kind {kind!r}")
