"""Helpers of the GPU tests: a dependency is required, never skipped for, where CUDA is present."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

SETUP_HINT = "./scripts/setup.sh installs it (GRAPHPOOL_KEEP_TORCH=1 keeps a machine's own CUDA torch)"


def require(module: str) -> ModuleType:
    """Imports ``module`` or fails the test (never skips) with what is missing and how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"this GPU test needs {module!r} ({e}); {SETUP_HINT}", pytrace=False)


def report(name: str, value: Any) -> None:
    """Prints a measured figure next to the test's assertions (shown with ``pytest -s``)."""
    print(f"[report] {name}: {value}")
