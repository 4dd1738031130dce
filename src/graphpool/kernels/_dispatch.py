"""Lazy import of the Triton implementations: triton is only needed (and only imported) on CUDA tensors."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

_warned: set[str] = set()


def triton_impl(module: str) -> ModuleType | None:
    """``graphpool.kernels.<module>`` if triton imports, else None (with one warning per module)."""
    try:
        return importlib.import_module(f"graphpool.kernels.{module}")
    except ImportError as exc:  # a CUDA torch without triton: the torch reference is correct, only slower
        if module not in _warned:
            _warned.add(module)
            warnings.warn(
                f"triton unavailable ({exc}); {module} falls back to the torch reference", stacklevel=3
            )
        return None
