"""Help for the tests of the C extensions: run them on a build other than the installed one."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys


def load_extension(name: str, path: str) -> None:
    """Put the build at ``path`` in sys.modules as the extension module ``name`` (a sanitizer
    build, say: tests/core/test_pool_parity.py and tests/net/test_lane.py say how to make one)."""
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
