"""Lazy import of the Triton implementations: triton is only needed (and only imported) on CUDA tensors."""

from __future__ import annotations

import functools
import importlib
import warnings
from types import ModuleType


# NOTE: cached: every CUDA call of an entry point asks; a failed import is tried and warned about once.
@functools.cache
def triton_impl(module: str) -> ModuleType | None:
    """``graphpool.kernels.<module>`` if triton imports, else None (with one warning per module)."""
    try:
        return importlib.import_module(f"graphpool.kernels.{module}")
    except ImportError as exc:  # a CUDA torch without triton: the torch reference is correct, only slower
        warnings.warn(f"triton unavailable ({exc}); {module} falls back to the torch reference", stacklevel=3)
        return None
