"""GraphPool's management half: the start-up warm-up, the captures left for idle moments, eviction, close.
A mixin over the pool's state (pool.py owns it and the step's path)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from graphpool.pool.capture import CapturedGraph
from graphpool.pool.gc_control import gc_frozen
from graphpool.pool.policy import CAPTURE, Choice, ResidencyBook

if TYPE_CHECKING:
    from graphpool.pool.buckets import BucketLadder
    from graphpool.pool.config import PoolConfig
    from graphpool.pool.inputs import StaticInputs
    from graphpool.pool.stats import FallbackReason

Progress = Callable[[int, int, int], None]  # (done, total, size)


class PoolManagement:
    # NOTE: GraphPool's state and internals, declared for the type checker
    config: PoolConfig
    ladder: BucketLadder
    lock: threading.RLock
    _book: ResidencyBook
    _graphs: dict[int, CapturedGraph]
    _blocked: dict[int, FallbackReason]
    _wanted: dict[int, int]
    _inputs: StaticInputs
    _closed: bool
    _off: FallbackReason | None

    def _capture(self, size: int, may_evict: bool) -> CapturedGraph | FallbackReason:
        raise NotImplementedError

    def _policy_choice(self, bucket: int) -> Choice:
        raise NotImplementedError

    def _evict(self, size: int, why: str) -> None:
        raise NotImplementedError

    def default_warmup_sizes(self) -> list[int]:
        """Pinned sizes, then a padding cover of the ladder (every size within max_padding_ratio of one),
        at most ``max_graph_pool_size`` of them, largest first."""
        cover = [s for s in self.ladder.padding_cover(self.config.max_padding_ratio) if s not in self.config.pinned]
        chosen = list(self.config.pinned) + cover[: max(0, self._book.capacity - len(self.config.pinned))]
        return sorted(chosen, reverse=True)

    def warmup(self, sizes: Iterable[int] | None = None, progress: Progress | None = None) -> list[int]:
        """Capture ``sizes`` (default: ``default_warmup_sizes()``) largest first on all-padding inputs,
        never evicting: sizes that do not fit the count or byte bound are skipped. Returns those captured."""
        order = sorted(set(self.default_warmup_sizes() if sizes is None else sizes), reverse=True)
        for s in order:
            if s not in self.ladder:
                raise ValueError(f"warmup size {s} is not a ladder size")
        captured: list[int] = []
        with self.lock:
            if self._closed or self._off is not None:
                return captured
            with gc_frozen():
                for i, s in enumerate(order):
                    if s not in self._graphs and s not in self._blocked:
                        self._inputs.pad(s)
                        if isinstance(self._capture(s, may_evict=False), CapturedGraph):
                            captured.append(s)
                    if progress is not None:
                        progress(i + 1, len(order), s)
        return captured

    def capture_wanted(self) -> bool:
        """Captures the oldest wanted size, if the miss policy still answers it with a capture now (it may have
        stopped being frequent); for a caller at a moment when a capture stalls no step. True while more wait."""
        with self.lock:
            while self._wanted and not self._closed and self._off is None:
                size = next(iter(self._wanted))
                del self._wanted[size]
                if size in self._graphs or size in self._blocked:
                    continue
                if self._policy_choice(size) != CAPTURE:
                    continue
                with gc_frozen():
                    self._inputs.pad(size)
                    self._capture(size, may_evict=True)
                break
            return bool(self._wanted)

    def evict(self, size: int) -> bool:
        """Drop the graph of ``size`` (pinned or not). False if none was resident."""
        with self.lock:
            if size not in self._graphs:
                return False
            self._evict(size, "requested")
            return True

    def evict_all(self) -> int:
        with self.lock:
            sizes = self._book.sizes()
            for s in sizes:
                self._evict(s, "evict_all")
            return len(sizes)

    def close(self) -> None:
        """Release every graph and the static buffers; ``run`` raises afterwards."""
        with self.lock:
            self.evict_all()
            self._inputs.free()
            self._wanted.clear()
            self._closed = True
