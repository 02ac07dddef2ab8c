"""The broker tests here run twice: with the frontend and backend sockets on the Tornado loop,
and in the C lane (``lane: true``, scale0/net/lane.py).

A module that runs brokers opts in with ``pytestmark = pytest.mark.usefixtures("broker_io")``:
each of its tests then runs once per I/O with ``SCALE0_LANE`` set (ids ``[loop]`` and
``[lane]``), which every broker the test starts reads, in this process or a child. Without the
extension (tools/test-fallback) only ``[loop]`` runs: the lane is not built there.
"""

from __future__ import annotations

import pytest

from scale0.net.lane import LANE_BUILT

IO_HERE = ["loop", "lane"] if LANE_BUILT else ["loop"]


@pytest.fixture(params=IO_HERE)
def broker_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    io: str = request.param
    monkeypatch.setenv("SCALE0_LANE", "1" if io == "lane" else "0")
    return io
