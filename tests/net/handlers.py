"""Handlers the net tests serve, importable by ``scale0-worker`` subprocesses (cwd = repo root)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def slow(body: list[bytes]) -> bytes:
    """Body ``[marker_path, seconds]``: write our PID to the marker, sleep, answer ``slow:PID``."""
    Path(body[0].decode()).write_text(str(os.getpid()))
    time.sleep(float(body[1]))
    return b"slow:%d" % os.getpid()


def whoami(body: list[bytes]) -> bytes:
    """The worker process's PID, whatever the body."""
    del body
    return b"%d" % os.getpid()


def recorded(body: list[bytes]) -> bytes:
    """Append frame 0 and a newline to the file named by $S0_RECORD; answer frame 0.

    Each line is one execution, written with O_APPEND in one write, so a test counts how many
    times each request really ran, even across killed and restarted processes.
    """
    line = body[0] + b"\n"
    fd = os.open(os.environ["S0_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return body[0]


def flaky(body: list[bytes]) -> bytes:
    """Answer frame 0, or fail (REPLY 500) when it starts with ``fail``."""
    if body[0].startswith(b"fail"):
        raise RuntimeError(f"asked to fail: {body[0].decode(errors='replace')}")
    return body[0]


def once(body: list[bytes], context: Any) -> list[bytes]:
    """Record ``client_id request_id`` (one line per execution) in $S0_RECORD, sleep $S0_SLEEP
    seconds, answer ``[client_id, request_id, *body]`` (W7: a handler told its request's ids)."""
    line = f"{context.client_id} {context.request_id!r}\n".encode()
    fd = os.open(os.environ["S0_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    time.sleep(float(os.environ.get("S0_SLEEP", "0")))
    return [str(context.client_id).encode(), context.request_id or b"", *body]
