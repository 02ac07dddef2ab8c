"""Helpers the system tests share: scale0ctl as the family's admin, and a bounded wait."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from scale0.testing import Family

RUN_TIMEOUT_S = 60
WAIT_S = 20.0


def ctl_json(family: Family, *args: str, broker: str = "b1") -> tuple[int, dict[str, Any]]:
    """``scale0ctl ARGS --json`` against ``broker``, as the admin; (exit code, the JSON)."""
    path = shutil.which("scale0ctl")
    assert path is not None, "scale0ctl is not installed"
    password, _ = family.admins["admin"]
    result = subprocess.run(
        [path, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env={
            **os.environ,
            "SCALE0_AUTH_ID": "admin",
            "SCALE0_AUTH_PASSWORD": password,
            "SCALE0_BROKER": family[broker].frontend,
        },
        check=False,
    )
    document = json.loads(result.stdout)
    assert isinstance(document, dict), result.stdout
    return result.returncode, document


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` every 0.1 s until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")
