"""How scale0ctl speaks: human lines on stdout, problems on stderr, or one JSON object with --json.

Every command reports through an :class:`Output`. Human mode prints result lines on stdout and
one line per problem on stderr (``str(problem)``, i.e. ``file:line: path: message``). JSON mode
prints exactly one JSON object on stdout, success or failure, and nothing on stderr; it always
has ``"ok"`` and, on failure, ``"errors"``: a list of ``{"file", "line", "path", "message"}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from scale0.config.errors import Problem

__all__ = ["PROGRAM", "Output", "problem_dict", "problem_line"]

PROGRAM = "scale0ctl"


def problem_line(problem: Problem) -> str:
    """One stderr line for a problem: ``str(problem)``, or ``scale0ctl: message`` if unplaced."""
    if problem.file is None and problem.line is None and not problem.path:
        return f"{PROGRAM}: {problem.message}"
    return str(problem)


def problem_dict(problem: Problem) -> dict[str, Any]:
    """A problem as the JSON ``errors`` list holds it."""
    return {
        "file": problem.file,
        "line": problem.line,
        "path": problem.path,
        "message": problem.message,
    }


@dataclass(frozen=True, slots=True)
class Output:
    """The output channel of one command run; ``json`` selects the machine-readable form."""

    json: bool = False

    def line(self, text: str) -> None:
        """A result line on stdout (human mode only; JSON mode says it all in :meth:`result`)."""
        if not self.json:
            click.echo(text)

    def data(self, data: bytes) -> None:
        """Raw bytes on stdout (human mode only), e.g. a converted config."""
        if not self.json:
            click.echo(data, nl=False)

    def problems(self, problems: Iterable[Problem]) -> None:
        """Problems on stderr, one line each (human mode only; JSON puts them in the object)."""
        if not self.json:
            for problem in problems:
                click.echo(problem_line(problem), err=True)

    def result(
        self,
        payload: Mapping[str, Any] | None = None,
        problems: Sequence[Problem] = (),
    ) -> None:
        """In JSON mode, print the one object: ``ok``, then ``payload``, then ``errors`` if any."""
        if not self.json:
            return
        obj: dict[str, Any] = {"ok": not problems}
        obj.update(payload or {})
        if problems:
            obj["errors"] = [problem_dict(p) for p in problems]
        click.echo(json.dumps(obj, indent=2, ensure_ascii=False))

    def fail(self, problems: Sequence[Problem], payload: Mapping[str, Any] | None = None) -> None:
        """Report a failure in either mode (stderr lines, or the JSON object with ``errors``)."""
        self.problems(problems)
        self.result(payload, problems)
