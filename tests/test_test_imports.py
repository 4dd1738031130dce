"""Every `from graphpool... import name` in the test tree resolves, GPU tests included.

NOTE: GPU tests are skipped on a CPU machine before their bodies (and the imports inside fixtures) run, so a
module move that leaves a GPU test importing the old path would otherwise only show on the GPU.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from pathlib import Path

TESTS = Path(__file__).parent


@functools.cache
def _graphpool_imports() -> list[tuple[str, int, str, str]]:
    found: list[tuple[str, int, str, str]] = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("graphpool"):
                found += [(str(path.relative_to(TESTS)), node.lineno, node.module or "", a.name) for a in node.names]
    return found


def test_the_test_tree_imports_graphpool() -> None:
    assert len({(f, m) for f, _, m, _ in _graphpool_imports() if f.startswith("gpu/")}) > 20


def test_every_imported_name_exists() -> None:
    missing = []
    for f, line, module, name in _graphpool_imports():
        mod = importlib.import_module(module)
        if not hasattr(mod, name) and importlib.util.find_spec(f"{module}.{name}") is None:
            missing.append(f"{f}:{line} from {module} import {name}")
    assert not missing, missing
