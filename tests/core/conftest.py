"""Every test of the core runs over both worker pools a ledger can keep.

scale0/core/ledger.py keeps its worker pool in Python (WorkerPool) or in C (scale0.core._pool,
where it is built), chosen by ``Ledger()`` from ``SCALE0_POOL``: this autouse fixture runs each
test here once per pool with ``SCALE0_POOL`` set (ids ``[python]`` and ``[c]``), so the broker
every test builds runs its rules on that pool. tools/test (CI) runs tests/core once and covers
both; without the extension (tools/test-fallback) only ``[python]`` runs, and
tests/core/test_pool_parity.py skips, saying so. Modules that pick their ledger or pool
themselves (test_ledger_machine.py, test_pool_parity.py) override ``ledger_pool`` with a
fixture of one value, so they do not run twice for nothing.
"""

from __future__ import annotations

import pytest

from scale0.core.ledger import C_POOL

POOLS_HERE = ["python", "c"] if C_POOL else ["python"]


@pytest.fixture(autouse=True, params=POOLS_HERE)
def ledger_pool(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    pool: str = request.param
    monkeypatch.setenv("SCALE0_POOL", pool)
    return pool
