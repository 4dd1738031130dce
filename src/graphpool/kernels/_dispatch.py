"""Lazy import of the Triton implementations: triton is only needed (and only imported) on CUDA tensors."""

from __future__ import annotations

import functools
import importlib
import threading
import warnings
from types import ModuleType


# NOTE: cached: every CUDA call of an entry point asks; a failed import is tried and warned about once.
@functools.cache
def triton_impl(module: str) -> ModuleType | None:
    """``graphpool.kernels.<module>`` if triton imports, else None (with one warning per module)."""
    if _key_thread is not None:
        _key_thread.join()  # the first compile would otherwise hash everything again
    try:
        return importlib.import_module(f"graphpool.kernels.{module}")
    except ImportError as exc:  # a CUDA torch without triton: the torch reference is correct, only slower
        warnings.warn(f"triton unavailable ({exc}); {module} falls back to the torch reference", stacklevel=3)
        return None


_key_thread: threading.Thread | None = None


def prefetch_triton_cache_key() -> None:
    """Starts computing Triton's own compile-cache key in a daemon thread (once a process).

    NOTE: the first kernel of a process hashes Triton's sources and its ~100 MB library for that key (0.36 s
    on an H200 host); the hash releases the GIL, so a thread started early overlaps it with the imports."""
    global _key_thread
    if _key_thread is None:
        _key_thread = threading.Thread(target=_triton_key, name="triton-cache-key", daemon=True)
        _key_thread.start()


def _triton_key() -> None:
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # no triton, or a layout without it: the first kernel computes its key as before
        return
    triton_key()
