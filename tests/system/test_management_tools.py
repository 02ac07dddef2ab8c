"""The example admin scripts in tools/ against a real family (they are documentation that runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scale0.testing import running_family

pytestmark = pytest.mark.system

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _env(user: str, password: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "SCALE0_AUTH_ID": user, "SCALE0_AUTH_PASSWORD": password, **extra}


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_family_check_and_http_script(tmp_path: Path) -> None:
    with running_family(tmp_path, size=2) as family:
        viewer = _env("viewer", family.admins["viewer"][0])
        admin = _env("admin", family.admins["admin"][0])
        check = [str(TOOLS / "admin-family-check"), family["b1"].frontend]
        ok = run(check, viewer)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.splitlines() == ["b1: active, config v1", "b2: active, config v1"]

        http = [sys.executable, str(TOOLS / "admin_http.py"), family["b1"].management]
        disabled = run([*http, "disable", "b2"], admin)
        assert disabled.returncode == 0, disabled.stderr
        assert json.loads(disabled.stdout)["result"]["state"] == "disabled"
        bad = run(check, viewer)
        assert bad.returncode == 1 and "b2: disabled" in bad.stderr

        refused = run([*http, "enable", "b2"], viewer)
        assert refused.returncode == 1 and "HTTP 403" in refused.stderr
        enabled = run([*http, "enable", "b2"], admin)
        assert enabled.returncode == 0, enabled.stderr

        family["b2"].stop()
        gone = run(check, viewer)
        assert gone.returncode == 1 and "b2: not answering" in gone.stderr
