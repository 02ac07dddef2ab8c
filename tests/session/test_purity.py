"""scale0.session reads no clock and draws no random ids: what the import contract cannot see."""

from __future__ import annotations

import ast
from pathlib import Path

import scale0.session

#: Modules whose use would mean a clock read or a random id inside the pure layer.
FORBIDDEN = {"time", "datetime", "random", "secrets", "uuid", "os", "zmq", "tornado", "asyncio"}


def test_no_module_of_the_session_imports_a_clock_or_a_random_source() -> None:
    package = Path(scale0.session.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) >= 7
    for path in modules:
        tree = ast.parse(path.read_text(), str(path))
        assert ast.get_docstring(tree), f"{path.name} has no docstring"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
