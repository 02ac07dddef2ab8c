"""The event log writer: a bounded buffer the broker fills, drained to JSON Lines files by a thread.

Layout (docs/trend.md): ``<dir>/<YYYY-MM-DD>/<broker>/events-<opened>-<pid>-<seq>.jsonl``, one
directory per UTC date (of the records' ``ts_ms``) and broker. A file is written under a
dot-prefixed name and renamed when closed, so Spark, which skips names starting with ``.`` or
``_``, never reads a file that is still growing. Files rotate by size, by age and at midnight.

The caller's side (``request``, ``event``) never blocks and never does I/O or JSON: it appends
a tuple to a deque, or counts a drop when the deque is full. The writer thread builds the JSON
lines and writes them in batches. Time comes from the records (``ts_ms``) and from ``clock``
(rotation by age only), so tests drive both.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final

from scale0.trend.schema import FIELD_NAMES, KINDS, SCHEMA_VERSION

log = logging.getLogger("scale0.trend.eventlog")

_DAY_MS: Final = 86_400_000
_SAFE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_REQUEST_FIELDS: Final = (
    "service",
    "worker",
    "client",
    "forwarded_from",
    "received_ms",
    "latency_ms",
    "bytes_in",
    "bytes_out",
    "status",
    "attempts",
)
_ORDER: Final = {name: i for i, name in enumerate(FIELD_NAMES)}
_quote: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii

# One buffered record: (kind, ts_ms, values). For "request", values is a tuple in
# _REQUEST_FIELDS order (no dict built on the hot path); otherwise a mapping of field -> value.
RequestValues = tuple[str, str | None, str | None, str | None, int, float, int, int, int, int]
Item = tuple[str, int, RequestValues | Mapping[str, object]]
#: Turns a request in the caller's own form (``request_raw``) into (ts_ms, RequestValues), or
#: into (ts_ms, its finished line) made with ``request_templates``.
Convert = Callable[[Any], tuple[int, RequestValues | str]]
#: Lines the writer thread builds before it lets other threads have the GIL (time.sleep(0)).
#: Without it, a batch of thousands of lines holds the GIL for milliseconds at a time, and the
#: broker's loop, which gives the GIL up at every socket call, waits up to the interpreter's
#: switch interval (5 ms) to get it back each time: measured, that cost the broker 12-26 % of
#: its throughput where chunks of 128 (about 0.3 ms) cost it a few % (docs/trend.md).
_YIELD_EVERY: Final = 128
#: The kind of a buffered item still in the caller's form (never written as such).
_RAW: Final = "request:raw"
_REQUEST_LINE: Final = (
    f'{{"v":{SCHEMA_VERSION},"ts_ms":%d,"kind":"request","broker":%s,"service":%s%s,'
    '"received_ms":%d,"latency_ms":%r,"bytes_in":%d,"bytes_out":%d,"status":%d,"attempts":%d}'
)


def date_of(ts_ms: int) -> str:
    """The UTC date, YYYY-MM-DD, of a time in ms since the epoch."""
    return datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%d")


def encode(broker: str, item: Item) -> str:
    """One record as its JSON line (no newline): fields in schema order, absent ones left out."""
    kind, ts_ms, values = item
    if isinstance(values, tuple):
        return _encode_request(_quote(broker), ts_ms, values)
    record: dict[str, object] = {
        "v": SCHEMA_VERSION,
        "ts_ms": ts_ms,
        "kind": kind,
        "broker": broker,
    }
    for name in sorted(values, key=_ORDER.__getitem__):
        if values[name] is not None:
            record[name] = values[name]
    return json.dumps(record, separators=(",", ":"))


def _encode_request(broker_json: str, ts_ms: int, values: RequestValues) -> str:
    """The request line built directly (no dict, no json.dumps): the writer thread spends its
    time here, holding the GIL the broker's loop also needs. Same bytes as json.dumps of the
    record; a test checks that."""
    (service, worker, client, forwarded_from, received_ms, latency_ms, bytes_in, bytes_out,
     status, attempts) = values  # fmt: skip
    optional = ""
    if worker is not None:
        optional = ',"worker":' + _quote(worker)
    if client is not None:
        optional += ',"client":' + _quote(client)
    if forwarded_from is not None:
        optional += ',"forwarded_from":' + _quote(forwarded_from)
    # One %-format (in C) for the rest; %d and %r write ints and floats as json.dumps does.
    return _REQUEST_LINE % (
        ts_ms,
        broker_json,
        _quote(service),
        optional,
        received_ms,
        float(latency_ms),
        bytes_in,
        bytes_out,
        status,
        attempts,
    )


def request_templates(broker: str) -> dict[tuple[bool, bool, bool], str]:
    """%-templates of a request line of ``broker``, by which of worker, client, forwarded_from
    are present: the fastest way to build the line (one %-format, in C).

    Arguments, in order: ts_ms (int), the service as a JSON string (``json.encoder.
    encode_basestring_ascii``), then the worker and the client as they are (hex, so nothing to
    escape) and forwarded_from as a JSON string, each only when present, then received_ms,
    latency_ms (float), bytes_in, bytes_out, status, attempts (ints). A test checks the lines
    equal ``encode``'s.
    """
    head = (
        f'{{"v":{SCHEMA_VERSION},"ts_ms":%d,"kind":"request","broker":{_quote(broker)},"service":%s'
    )
    tail = (
        ',"received_ms":%d,"latency_ms":%r,"bytes_in":%d,"bytes_out":%d,"status":%d,"attempts":%d}'
    )
    return {
        (worker, client, forwarded): head
        + (',"worker":"%s"' if worker else "")
        + (',"client":"%s"' if client else "")
        + (',"forwarded_from":%s' if forwarded else "")
        + tail
        for worker in (False, True)
        for client in (False, True)
        for forwarded in (False, True)
    }


class SegmentFiles:
    """The synchronous half: appends lines to this broker's current file, rotates and renames.

    Used by the writer thread, and directly by tools that write logs in bulk (tools/gen-events).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        broker: str,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_age_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        fsync: bool = True,
        tag: str | None = None,
    ) -> None:
        """``tag`` goes in file names instead of the process id (for reproducible output)."""
        if not _SAFE_NAME.fullmatch(broker):
            raise ValueError(
                f"broker {broker!r}: an event log directory name must be 1-128 of "
                "A-Z a-z 0-9 . _ - and not start with . _ or -"
            )
        if max_bytes < 1 or max_age_s <= 0:
            raise ValueError("max_bytes and max_age_s must be positive")
        self.directory = Path(directory)
        self.broker = broker
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.clock = clock
        self.fsync = fsync
        self.tag = tag
        self.closed_files: list[Path] = []
        self._file: IO[str] | None = None
        self._path: Path | None = None
        self._day = -1
        self._size = 0
        self._opened_at = 0.0
        self._seq = 0

    def recover(self) -> list[Path]:
        """Rename the dot-files a crashed writer of this broker left, so they get read.

        Their last line may be cut short; the reader skips and counts it."""
        recovered = []
        for path in sorted(self.directory.glob(f"*/{self.broker}/.events-*.jsonl")):
            final = path.with_name(path.name[1:])
            os.replace(path, final)
            recovered.append(final)
        return recovered

    def write(self, ts_ms: int, line: str) -> None:
        """Append one line (no newline) for a record of time ``ts_ms``, rotating first if due."""
        day = ts_ms // _DAY_MS
        if self._file is None or day != self._day or self._size >= self.max_bytes:
            self._open(day)
        assert self._file is not None  # _open sets it (or raised); not network input
        self._file.write(line + "\n")
        self._size += len(line) + 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def rotate_if_old(self) -> None:
        if self._file is not None and self.clock() - self._opened_at >= self.max_age_s:
            self.close()

    def close(self) -> None:
        """Close the current file and give it its final name (no dot)."""
        file, path = self._file, self._path
        self._file = self._path = None
        if file is None or path is None:
            return
        try:
            file.flush()
            if self.fsync:
                os.fsync(file.fileno())
        finally:
            # A full disk: what was not flushed is lost, the rename still happens.
            with contextlib.suppress(OSError):
                file.close()
            final = path.with_name(path.name[1:])
            os.replace(path, final)
            self.closed_files.append(final)

    def _open(self, day: int) -> None:
        self.close()
        folder = self.directory / date_of(day * _DAY_MS) / self.broker
        folder.mkdir(parents=True, exist_ok=True)
        now = self.clock()
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
        self._seq += 1
        tag = self.tag if self.tag is not None else str(os.getpid())
        path = folder / f".events-{stamp}-{tag}-{self._seq:05d}.jsonl"
        self._file = open(path, "x", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._path = path
        self._day = day
        self._size = 0
        self._opened_at = now


class EventLogWriter:
    """Bounded buffer + writer thread. Call ``request``/``event`` from one thread (the loop).

    ``capacity`` records may wait; beyond that new records are dropped and counted
    (``stats()["dropped"]``), so a slow or full disk costs records, never the caller's time.
    A write that fails (ENOSPC, EIO...) loses its batch, counted in ``write_failed``; the next
    batch goes to a fresh file.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        broker: str,
        *,
        capacity: int = 65_536,
        flush_interval_s: float = 0.2,
        max_bytes: int = 64 * 1024 * 1024,
        max_age_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        fsync: bool = True,
        convert: Convert | None = None,
    ) -> None:
        """``convert``: how the writer thread turns what ``request_raw`` was given into a
        request record (the caller then does no conversion at all on its own thread)."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.files = SegmentFiles(
            directory, broker, max_bytes=max_bytes, max_age_s=max_age_s, clock=clock, fsync=fsync
        )
        self.broker = broker
        self.capacity = capacity
        self.flush_interval_s = flush_interval_s
        #: Set before start(), e.g. by the broker's event log (scale0/net/eventlog.py).
        self.convert = convert
        self._queue: collections.deque[tuple[str, int, Any]] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.accepted = 0
        self.dropped = 0
        self.written = 0
        self.write_failed = 0

    # ---- the caller's side: O(1), no I/O, no JSON ---------------------------------------------

    def request(
        self,
        ts_ms: int,
        service: str,
        worker: str | None,
        client: str | None,
        forwarded_from: str | None,
        received_ms: int,
        latency_ms: float,
        bytes_in: int,
        bytes_out: int,
        status: int,
        attempts: int,
    ) -> bool:
        """Record one finished request. False if the buffer was full (the record is dropped)."""
        queue = self._queue
        if len(queue) >= self.capacity:
            self.dropped += 1
            return False
        queue.append(
            (
                "request",
                ts_ms,
                (
                    service,
                    worker,
                    client,
                    forwarded_from,
                    received_ms,
                    latency_ms,
                    bytes_in,
                    bytes_out,
                    status,
                    attempts,
                ),
            )
        )
        self.accepted += 1
        if len(queue) * 2 == self.capacity:
            self._wake.set()  # half full: drain now rather than at the next flush interval
        return True

    def request_raw(self, raw: object) -> bool:
        """Record one finished request in the caller's own form (a tuple it already has): one
        append here; the writer thread converts it (``convert``). False if the buffer was full."""
        if self.convert is None:
            raise ValueError("request_raw() needs the writer's convert")
        queue = self._queue
        if len(queue) >= self.capacity:
            self.dropped += 1
            return False
        queue.append((_RAW, 0, raw))
        self.accepted += 1
        if len(queue) * 2 == self.capacity:
            self._wake.set()
        return True

    def event(self, kind: str, ts_ms: int, **fields: object) -> bool:
        """Record any other kind (docs/trend.md). Unknown kinds or fields are a bug: ValueError."""
        if kind not in KINDS or kind == "request":
            raise ValueError(f"event kind {kind!r}: not one of {sorted(KINDS)} (use request())")
        unknown = [name for name in fields if name not in _ORDER or name in ("v", "kind")]
        if unknown:
            raise ValueError(f"event {kind}: unknown fields {unknown}")
        queue = self._queue
        if len(queue) >= self.capacity:
            self.dropped += 1
            return False
        queue.append((kind, ts_ms, fields))
        self.accepted += 1
        if len(queue) * 2 == self.capacity:
            self._wake.set()
        return True

    def stats(self) -> dict[str, int]:
        """Counters for ``status`` and ``/metrics``: records accepted, dropped (buffer full),
        written, lost to failed writes, waiting now, and files closed."""
        return {
            "accepted": self.accepted,
            "dropped": self.dropped,
            "written": self.written,
            "write_failed": self.write_failed,
            "queued": len(self._queue),
            "files_closed": len(self.files.closed_files),
        }

    # ---- the writer thread ----------------------------------------------------------------------

    def start(self) -> EventLogWriter:
        """Rename a crashed predecessor's dot-files, then start draining."""
        self.files.recover()
        self._thread = threading.Thread(target=self._run, name="scale0-eventlog", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> bool:
        """Write what is buffered, close and rename the current file. False if the thread did
        not finish within ``timeout_s`` (what it had not written is then lost)."""
        self._stopping = True
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        files = self.files
        while True:
            self._drain()
            if self._stopping and not self._queue:
                break
            try:
                files.rotate_if_old()
            except OSError as exc:
                log.warning("event log: closing %s failed: %s", files.directory, exc)
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
        try:
            files.close()
        except OSError as exc:
            log.warning("event log: closing %s failed: %s", files.directory, exc)

    def _drain(self) -> None:
        queue, files, broker = self._queue, self.files, self.broker
        batch = []
        # Bounded: at most what is queued now; records appended meanwhile wait for the next round.
        for _ in range(len(queue)):
            batch.append(queue.popleft())
        if not batch:
            return
        done = 0
        convert = self.convert
        broker_json = _quote(broker)
        try:
            for index, item in enumerate(batch):
                if index % _YIELD_EVERY == _YIELD_EVERY - 1:
                    time.sleep(0)  # hand the GIL back to the loop between chunks (below)
                if item[0] == _RAW and convert is not None:
                    try:
                        ts_ms, values = convert(item[2])
                    except Exception:  # a bug in the converter: lose the record, not the thread
                        log.exception("event log: cannot convert %r", item[2])
                        self.write_failed += 1
                        continue
                    if isinstance(values, str):
                        files.write(ts_ms, values)
                    else:
                        files.write(ts_ms, _encode_request(broker_json, ts_ms, values))
                else:
                    files.write(item[1], encode(broker, item))
                done += 1
            files.flush()
        except OSError as exc:
            # What was not flushed is lost: count the whole batch as failed, start a new file.
            log.warning("event log: write to %s failed: %s", files.directory, exc)
            self.write_failed += len(batch)
            with contextlib.suppress(OSError):
                files.close()
            return
        self.written += done
