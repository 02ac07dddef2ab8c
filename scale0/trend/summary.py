"""Reading ``summary.json`` as scale0-trend writes it: bounded, checked field by field.

The broker's management server (``GET /api/trends``, the page's Trends panel) reads the file
per request through :func:`read_summary`, which never raises anything but
:class:`SummaryError` for a file that is there (:class:`SummaryMissing` when it is not). The
shape checked here is the one ``scale0.trend.job.run`` writes (docs/trend.md, "summary.json");
a test validates a summary made by the real job, so the two cannot drift apart unnoticed.

Plain Python: no Spark, no sockets (the broker imports it).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from scale0.trend.schema import SCHEMA_VERSION

__all__ = [
    "MAX_SUMMARY_BYTES",
    "SummaryError",
    "SummaryMissing",
    "read_summary",
    "validate_summary",
]

#: The largest summary read. The job's summary grows with services, workers, config versions,
#: management commands and task hours: a year of a large family stays well under this.
MAX_SUMMARY_BYTES: Final = 8 * 1024 * 1024
#: At most this many problems are named in one error (the rest are counted).
MAX_PROBLEMS: Final = 10


class SummaryError(Exception):
    """The summary file exists but cannot be used; ``str()`` names the file and the problems."""

    def __init__(self, path: Path | str, problems: list[str], *, newer: bool = False) -> None:
        self.path = str(path)
        self.problems = problems
        self.newer = newer
        shown = problems[:MAX_PROBLEMS]
        more = len(problems) - len(shown)
        text = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
        super().__init__(f"{self.path}: {text}")


class SummaryMissing(Exception):
    """There is no file at the configured path (yet)."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        super().__init__(f"{self.path} does not exist")


# ---- field checks ---------------------------------------------------------------------------

Check = Callable[[Any], str | None]


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _int(minimum: int | None = 0) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {_describe(value)}"
        if minimum is not None and value < minimum:
            return f"expected an integer >= {minimum}, got {value}"
        return None

    return check


def _number(low: float | None = None, high: float | None = None) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {_describe(value)}"
        if (low is not None and value < low) or (high is not None and value > high):
            return f"expected a number between {low} and {high}, got {value}"
        return None

    return check


def _str(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string, got {_describe(value)}"


def _time(value: Any) -> str | None:
    """An ISO 8601 time as the job writes them (``2026-11-18T04:00:00Z``, or with ``+00:00``)."""
    if not isinstance(value, str):
        return f"expected an ISO 8601 time, got {_describe(value)}"
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return f"expected an ISO 8601 time, got {value[:40]!r}"
    return None


def _one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        if value not in choices:
            return f"expected one of {', '.join(choices)}, got {_describe(value)}"
        return None

    return check


def _optional(inner: Check) -> Check:
    def check(value: Any) -> str | None:
        return None if value is None else inner(value)

    return check


def _list_of(inner: Check) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return f"expected a list, got {_describe(value)}"
        for i, item in enumerate(value):
            problem = inner(item)
            if problem is not None:
                return f"[{i}]: {problem}"
        return None

    return check


_COUNT = _int(0)
_OPT_COUNT = _optional(_int(0))
_RATE = _number(0.0, 1.0)
_OPT_MS = _optional(_number(0.0))

# Field -> check, per object the job writes (scale0/trend/job.py). Required unless in OPTIONAL.
_WINDOW: Final[dict[str, Check]] = {"start_ms": _int(0), "end_ms": _int(0)}
_INPUT: Final[dict[str, Check]] = {
    "files": _COUNT,
    "new_files": _COUNT,
    "good": _COUNT,
    "corrupt": _COUNT,
    "newer": _COUNT,
    "invalid": _COUNT,
    "newer_versions": _list_of(_int(1)),
    "newer_files": _list_of(_str),
    "corrupt_files": _list_of(_str),
}
_TOTALS: Final[dict[str, Check]] = {
    "requests": _COUNT,
    "errors": _COUNT,
    "error_rate": _optional(_RATE),
    "bytes_in": _COUNT,
    "bytes_out": _COUNT,
}
_SERVICE: Final[dict[str, Check]] = {
    "service": _str,
    "requests": _int(1),
    "errors": _COUNT,
    "error_rate": _RATE,
    "p50_ms": _OPT_MS,
    "p95_ms": _OPT_MS,
    "p99_ms": _OPT_MS,
    "bytes_in": _OPT_COUNT,
    "bytes_out": _OPT_COUNT,
}
_AVAILABILITY: Final[dict[str, Check]] = {
    "first_seen": _optional(_time),
    "observed_ms": _OPT_COUNT,
    "up_ms": _optional(_int(None)),
    "availability": _optional(_number()),
    "transitions": _OPT_COUNT,
    "requests": _COUNT,
    "load_share": _optional(_RATE),
}
_WORKER: Final[dict[str, Check]] = {"broker": _str, "worker": _str, **_AVAILABILITY}
_BROKER: Final[dict[str, Check]] = {"broker": _str, **_AVAILABILITY}
_CONFIG_CHANGE: Final[dict[str, Check]] = {
    "at": _time,
    "broker": _str,
    "outcome": _one_of("applied", "refused"),
    "config_version": _OPT_COUNT,
    "sha256": _optional(_str),
    "reason": _optional(_str),
}
_MANAGEMENT: Final[dict[str, Check]] = {
    "at": _time,
    "broker": _str,
    "kind": _str,
    "user": _optional(_str),
    "command": _optional(_str),
    "result": _optional(_str),
    "state": _optional(_str),
    "prev_state": _optional(_str),
    "reason": _optional(_str),
}
_TASK_HOUR: Final[dict[str, Check]] = {
    "hour": _time,
    "finished": _COUNT,
    "failed": _COUNT,
    "throughput_per_s": _number(0.0),
    "wait_p50_ms": _OPT_MS,
    "wait_p95_ms": _OPT_MS,
    "run_p50_ms": _OPT_MS,
    "run_p95_ms": _OPT_MS,
}


def _object(
    value: Any, fields: dict[str, Check], where: str, nullable: frozenset[str] = frozenset()
) -> Iterator[str]:
    """Problems of one JSON object: a missing field (a key the job always writes), a bad value.

    Keys the job does not write are let through: a later job may add one without a new
    ``schema_version`` (docs/trend.md, "Versioning").
    """
    if not isinstance(value, dict):
        yield f"{where}: expected an object, got {_describe(value)}"
        return
    for name, check in fields.items():
        path = f"{where}.{name}" if where else name
        if name not in value:
            if name not in nullable:
                yield f"{path}: missing"
            continue
        problem = check(value[name])
        if problem is not None:
            yield f"{path}{'' if problem.startswith('[') else ': '}{problem}"


def _rows(value: Any, fields: dict[str, Check], where: str) -> Iterator[str]:
    if not isinstance(value, list):
        yield f"{where}: expected a list, got {_describe(value)}"
        return
    # The job's rows carry every column (null where a join had no match); a field whose
    # value may be null may also be absent, as in a summary written by hand.
    optional = frozenset(k for k, check in fields.items() if check(None) is None)
    for i, row in enumerate(value):
        yield from _object(row, fields, f"{where}[{i}]", optional)


def validate_summary(document: Any, path: Path | str = "summary.json") -> dict[str, Any]:
    """The document, if it has the shape scale0-trend writes; else SummaryError naming every
    problem (field paths like ``services[3].p95_ms``). A ``schema_version`` above the one this
    Scale0 reads is refused first, as newer (``SummaryError.newer``), without judging the rest.
    """
    if not isinstance(document, dict):
        raise SummaryError(path, [f"expected a JSON object, got {_describe(document)}"])
    version = document.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise SummaryError(path, [f"schema_version: expected an integer, got {_describe(version)}"])
    if version > SCHEMA_VERSION:
        raise SummaryError(
            path,
            [
                f"schema_version {version} is newer than this Scale0 reads ({SCHEMA_VERSION}): "
                "it was written by a newer scale0-trend; upgrade this broker, or make the summary "
                "again with this installation's scale0-trend --full"
            ],
            newer=True,
        )
    if version < 1:
        raise SummaryError(path, [f"schema_version: expected 1..{SCHEMA_VERSION}, got {version}"])
    problems: list[str] = []
    top: dict[str, Check] = {
        "generated_at": _time,
        "source": _str,
        "percentile_accuracy": _int(1),
    }
    problems.extend(_object(document, top, ""))
    for name, fields in (("window", _WINDOW), ("input", _INPUT), ("totals", _TOTALS)):
        if name not in document:
            problems.append(f"{name}: missing")
        else:
            problems.extend(_object(document[name], fields, name))
    window = document.get("window")
    if (
        isinstance(window, dict)
        and isinstance(window.get("start_ms"), int)
        and isinstance(window.get("end_ms"), int)
        and window["start_ms"] > window["end_ms"]
    ):
        problems.append("window: start_ms is after end_ms")
    for name, fields in (
        ("services", _SERVICE),
        ("workers", _WORKER),
        ("brokers", _BROKER),
        ("config_changes", _CONFIG_CHANGE),
        ("management", _MANAGEMENT),
        ("tasks", _TASK_HOUR),
    ):
        if name not in document:
            problems.append(f"{name}: missing")
        else:
            problems.extend(_rows(document[name], fields, name))
    tables = document.get("tables")
    if not isinstance(tables, dict) or not all(isinstance(v, str) for v in tables.values()):
        problems.append(f"tables: expected an object of paths, got {_describe(tables)}")
    if problems:
        raise SummaryError(path, problems)
    return document


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_summary(
    path: Path, limit: int = MAX_SUMMARY_BYTES
) -> tuple[dict[str, Any], os.stat_result]:
    """Read and validate the summary at ``path``; returns it and the file's stat.

    Raises SummaryMissing (no file there) or SummaryError (anything else: not a regular file,
    unreadable, over ``limit`` bytes, not UTF-8 JSON, the wrong shape, a newer schema). Opening
    never blocks (a FIFO is refused, not waited on) and at most ``limit + 1`` bytes are read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SummaryMissing(path) from None
    except OSError as exc:
        raise SummaryError(path, [f"cannot open it: {exc.strerror or exc}"]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SummaryError(path, ["not a regular file"])
        if info.st_size > limit:
            raise SummaryError(path, [f"it is {info.st_size} bytes; the limit is {limit}"])
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise SummaryError(path, [f"cannot read it: {exc.strerror or exc}"]) from None
    finally:
        os.close(fd)
    if size > limit:
        raise SummaryError(path, [f"it grew over the limit of {limit} bytes while read"])
    data = b"".join(chunks)
    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise SummaryError(path, [f"not UTF-8 ({exc.reason} at byte {exc.start})"]) from None
    except ValueError as exc:  # json.JSONDecodeError, NaN/Infinity
        raise SummaryError(path, [f"not valid JSON ({exc})"]) from None
    except RecursionError:
        raise SummaryError(path, ["not valid JSON (nested too deeply)"]) from None
    return validate_summary(document, path), info
