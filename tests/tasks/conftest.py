"""Fixtures of the task tests: one throwaway PostgreSQL server per session (started lazily)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tasks.postgres import Server, running_postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    with running_postgres() as server:
        yield server
