"""scale0-broker's collector settings (docs/performance.md): start-up objects frozen, rarer young
collections, and cycles made after start-up still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from scale0.cli.broker import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.mark.usefixtures("restore_gc")
def test_tune_gc_freezes_start_up_and_still_collects_new_cycles() -> None:
    tune_gc()
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD > 700
    assert gc.get_freeze_count() > 0
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    gc.collect()
    assert alive() is None
