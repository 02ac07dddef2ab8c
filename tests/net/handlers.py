"""Handlers the net tests serve, importable by ``scale0-worker`` subprocesses (cwd = repo root)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def slow(body: list[bytes]) -> bytes:
    """Body ``[marker_path, seconds]``: write our PID to the marker, sleep, answer ``slow:PID``."""
    Path(body[0].decode()).write_text(str(os.getpid()))
    time.sleep(float(body[1]))
    return b"slow:%d" % os.getpid()


def whoami(body: list[bytes]) -> bytes:
    """The worker process's PID, whatever the body."""
    del body
    return b"%d" % os.getpid()
