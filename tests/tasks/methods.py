"""zerotask callables the node tests register (module:function)."""

from __future__ import annotations

import time


def square(x: int) -> int:
    return x * x


def add(a: int, b: int) -> int:
    return a + b


def noop() -> None:
    return None


def fail(message: str) -> None:
    raise ValueError(message)


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def echo(value: object) -> object:
    return value
