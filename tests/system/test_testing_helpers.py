"""scale0.testing's family helpers survive the race they cannot avoid: a port picked free is
taken by another process before the broker binds it (two test suites at once, say)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from scale0 import testing


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process listens on."""
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        yield blocker.getsockname()[1]
    finally:
        blocker.close()


@pytest.mark.parametrize(
    "start",
    [
        lambda path: testing.running_family(path, 2, management=False),
        lambda path: testing.running_brokers(path, 2),
    ],
    ids=["running_family", "running_brokers"],
)
def test_a_port_taken_before_the_broker_binds_it_is_picked_again(
    tmp_path: Path,
    taken_port: int,
    monkeypatch: pytest.MonkeyPatch,
    start: Callable[[Path], AbstractContextManager[Any]],
) -> None:
    picks: list[list[int]] = []
    real = testing.pick_free_ports

    def first_pick_loses_the_race(count: int, host: str = "127.0.0.1") -> list[int]:
        ports = real(count, host)
        if not picks:
            ports[1] = taken_port  # b1's backend: someone else took it meanwhile
        picks.append(ports)
        return ports

    monkeypatch.setattr(testing, "pick_free_ports", first_pick_loses_the_race)
    with start(tmp_path) as started:
        members = started.members if isinstance(started, testing.Family) else started
        backends = [member.endpoints["backend"] for member in members]
        assert all(not b.endswith(f":{taken_port}") for b in backends), backends
    assert len(picks) == 2  # the first start failed on the taken port, the second held
