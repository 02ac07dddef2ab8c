"""The one error type of configuration: problems, each naming file, field path and line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a config: what, where (field path like ``brokers[1].frontend_port``)."""

    message: str
    path: str = ""
    file: str | None = None
    line: int | None = None

    def located(self, file: str | None = None, line: int | None = None) -> Problem:
        """Return a copy with file and line filled in where they were unknown."""
        return replace(
            self,
            file=self.file if self.file is not None else file,
            line=self.line if self.line is not None else line,
        )

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        field = f" {self.path}:" if self.path else ""
        return f"{where}:{field} {self.message}"


class ConfigError(Exception):
    """A config (or part of one) was refused; ``problems`` says every reason found."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        if not self.problems:
            self.problems = (Problem("invalid configuration"),)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(
        cls, message: str, *, path: str = "", file: str | None = None, line: int | None = None
    ) -> ConfigError:
        return cls([Problem(message, path=path, file=file, line=line)])

    def located(self, file: str | None) -> ConfigError:
        """The same problems, each with ``file`` filled in where it was unknown."""
        return ConfigError(p.located(file=file) for p in self.problems)
