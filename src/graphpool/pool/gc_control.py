"""The cyclic garbage collector around captures (paused for one capture, frozen for a warm-up of many), after a
start-up (its objects frozen for good), and over a benchmark client's trace (its start-up objects frozen)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while allocations are routed to a graph's pool: a MemPool it frees then (a failed
    capture's traceback cycle) runs emptyCache mid-capture, and torch aborts the process."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def collect_and_freeze() -> None:
    """One full collection, then every object still alive moved out of the collector's reach (`gc.freeze`)."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """One full collection, then every live object frozen until the block ends (collections meanwhile walk
    only what the block makes). On exit the objects are unfrozen, unless some were frozen before: whoever froze
    them unfreezes."""
    owns_freeze = gc.get_freeze_count() == 0
    collect_and_freeze()
    try:
        yield
    finally:
        if owns_freeze:
            gc.unfreeze()


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """`heap_frozen`, and the collector off until the block ends.

    The collection frees start-up garbage (dead tensors too) before the first capture measures device bytes,
    so no later collection moves those measurements; frozen and off, no collection that walks every object of
    the loaded model pauses the warm-up between captures. On exit the collector is as it was."""
    with heap_frozen(), gc_paused():
        yield
