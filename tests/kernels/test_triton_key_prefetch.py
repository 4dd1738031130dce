"""The start-up's prefetch of Triton's compile-cache key (kernels/_dispatch.py): computed once, in a thread,
and waited for (not computed again) by the first Triton kernel module."""

from __future__ import annotations

import threading

import pytest

from graphpool.kernels import _dispatch


def test_the_key_is_computed_once_in_a_thread_and_the_first_kernel_import_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = pytest.importorskip("triton.runtime.cache")
    cache.triton_key.cache_clear()
    monkeypatch.setattr(_dispatch, "_key_thread", None)
    _dispatch.prefetch_triton_cache_key()
    first = _dispatch._key_thread
    assert isinstance(first, threading.Thread) and first.name == "triton-cache-key"
    _dispatch.prefetch_triton_cache_key()
    assert _dispatch._key_thread is first  # once a process
    _dispatch.triton_impl.cache_clear()
    _dispatch.triton_impl("_triton_argmax")
    assert not first.is_alive()
    info = cache.triton_key.cache_info()
    assert info.misses == 1 and info.currsize == 1
