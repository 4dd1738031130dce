"""Helpers of the GPU tests: a dependency is required, never skipped for, where CUDA is present."""

from __future__ import annotations

import importlib
import json
import os
from types import ModuleType
from typing import Any

import pytest

SETUP_HINT = "on the device machine: source .carry/on-device.sh (see shared/device/README.md)"


def require(module: str) -> ModuleType:
    """Imports ``module`` or fails the test (never skips) with what is missing and how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"this GPU test needs {module!r} ({e}); {SETUP_HINT}", pytrace=False)


def report(name: str, value: Any) -> None:
    """Prints a measured figure and, with GRAPHPOOL_TEST_REPORT set, appends it to that JSON-lines file."""
    print(f"[report] {name}: {value}")
    path = os.environ.get("GRAPHPOOL_TEST_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, "value": value}) + "\n")
