"""zerotask methods the demo nodes serve (conf/tasks/node*.yml name them as module:function)."""

from __future__ import annotations


def square(x: int) -> int:
    """The square of ``x``."""
    return x * x


def add(a: int, b: int) -> int:
    """``a + b``."""
    return a + b
