"""Builders shared by the task tests: a Book with nodes, ids from a counter."""

from __future__ import annotations

import itertools
from typing import Any

from scale0.tasks.book import Book, Settings


def new_book(**settings: Any) -> Book:
    counter = itertools.count(1)
    return Book(lambda: f"id{next(counter)}", Settings(**settings))


def add_node(book: Book, name: str, memory: int, cores: int, now: float = 0.0, **caps: Any) -> None:
    repositories = caps.pop("repositories", {})
    book.node_set(
        {
            "name": name,
            "capabilities": {"memory": memory, "cores": cores, **caps},
            "repositories": repositories,
        },
        now,
    )


def vespid(name: str, memory: int = 100, cores: int = 1, **extra: Any) -> dict[str, Any]:
    requirements = {"memory": memory, "cores": cores, **extra.pop("requirements", {})}
    return {
        "name": name,
        "executable_pyscript": "print('hi')",
        "requirements": requirements,
        **extra,
    }
