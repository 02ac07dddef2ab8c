"""Helpers the system tests share: scale0ctl as the family's admin, and a bounded wait."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from scale0.testing import Family, FamilyMember, start_family_member

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


def edit_yaml(path: Path, **changes: Any) -> None:
    tree = yaml.safe_load(path.read_text())
    tree.update(changes)
    path.write_text(yaml.safe_dump(tree))


def restart(member: FamilyMember) -> None:
    """Stop one broker (SIGTERM, by PID) and start it again from its files."""
    assert member.stop() == 0, member.stderr_path.read_text()
    start_family_member(member)


def logged(member: FamilyMember, event: str) -> list[dict[str, Any]]:
    lines = []
    for line in member.stderr_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict) and value.get("event") == event:
                lines.append(value)
    return lines
