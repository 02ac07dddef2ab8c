"""The C floors of tools/bench, built for a test: gcc is what builds them (tools/mdp_brokers.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools.mdp_brokers import BrokerUnavailable


def built(build: Callable[..., Path], *args: Any) -> Path:
    """``build(*args)`` (``build_c_broker`` or ``build_c_loop_module``); the test is skipped,
    saying so, on a machine without gcc, and any other failure to build fails it."""
    try:
        return build(*args)
    except BrokerUnavailable as e:
        if "gcc not found" in str(e):
            pytest.skip(str(e))
        raise
