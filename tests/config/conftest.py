"""Shared fixtures for config tests."""

from __future__ import annotations

from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture
def conf_dir() -> Path:
    return CONF
