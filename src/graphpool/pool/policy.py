"""What to do on a miss (pluggable miss policies) and which graphs stay resident (LRU, pins, byte budget)."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from typing import Final, Literal

from graphpool.pool.config import PoolConfig
from graphpool.pool.stats import FallbackReason

CAPTURE: Final = "capture"
# A policy's answer to a miss: capture the bucket, serve it with this resident larger size, or run eagerly.
Choice = Literal["capture"] | int | FallbackReason


class CaptureOnMiss:
    """LightLLM's behaviour: every miss captures, evicting the least recently used graph.

    Also the shape of any miss policy (subclass it): ``observe`` sees every graph-eligible step's bucket
    before the pool decides anything; ``on_miss`` answers a bucket with no resident graph, given the resident
    sizes (least recently used first), whether a capture needs no eviction, and the first graph it would
    evict (None if none needed or none evictable).
    """

    def observe(self, bucket: int) -> None:
        pass

    def on_miss(self, bucket: int, resident: tuple[int, ...], has_room: bool, victim: int | None) -> Choice:
        return CAPTURE


class AdmitFrequent(CaptureOnMiss):
    """Do not let a miss stall the step unless the size has earned its graph.

    A miss is first served by the smallest resident larger graph within ``max_padding_ratio`` (at decode
    batch sizes a padded replay costs about what an exact one does, and far less than a capture), until the
    size is admitted. A size is admitted (captured) when requested at least ``admit_after`` times within the
    last ``admit_window`` steps and, if a capture would evict, more often than the graph it would evict (a
    TinyLFU-style guard, so a working set larger than the pool keeps its most frequent sizes instead of
    rotating through all of them). With room and no graph to pad into, a miss captures at once: nothing can
    thrash, and an eager step costs several replays. Without room, a size not admitted is served by any larger
    resident graph, however much padding that takes, and runs eagerly (``not_admitted``) only when none is.
    """

    def __init__(self, max_padding_ratio: float = 0.5, admit_after: int = 3, admit_window: int = 128) -> None:
        if max_padding_ratio < 0 or admit_after < 1 or admit_window < admit_after:
            raise ValueError(
                "AdmitFrequent needs max_padding_ratio >= 0, admit_after >= 1, admit_window >= admit_after; got "
                f"{max_padding_ratio}, {admit_after}, {admit_window}"
            )
        self.max_padding_ratio = max_padding_ratio
        self.admit_after = admit_after
        self._window: deque[int] = deque(maxlen=admit_window)
        self._counts: Counter[int] = Counter()

    def observe(self, bucket: int) -> None:
        if len(self._window) == self._window.maxlen:
            old = self._window[0]
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        self._window.append(bucket)
        self._counts[bucket] += 1

    def frequency(self, bucket: int) -> int:
        return self._counts.get(bucket, 0)

    def on_miss(self, bucket: int, resident: tuple[int, ...], has_room: bool, victim: int | None) -> Choice:
        freq = self.frequency(bucket)
        admitted = freq >= self.admit_after and (victim is None or freq > self.frequency(victim))
        if has_room and admitted:
            return CAPTURE
        larger = nearest_larger(resident, bucket, self.max_padding_ratio)
        if larger is not None:
            return larger
        if has_room or admitted:
            return CAPTURE
        # NOTE: past the ratio a larger graph still beats an eager step, which costs several replays.
        larger = nearest_larger(resident, bucket, math.inf)
        return larger if larger is not None else FallbackReason.NOT_ADMITTED


def nearest_larger(resident: Iterable[int], bucket: int, max_padding_ratio: float) -> int | None:
    """The smallest resident size s with bucket < s <= bucket * (1 + ratio), or None."""
    limit = bucket * (1.0 + max_padding_ratio)
    fits = [s for s in resident if bucket < s <= limit]
    return min(fits) if fits else None


def make_policy(config: PoolConfig) -> CaptureOnMiss:
    if config.miss_policy == "capture":
        return CaptureOnMiss()
    return AdmitFrequent(config.max_padding_ratio, config.admit_after, config.admit_window)


class ResidencyBook:
    """LRU order, pinned sizes, and the bytes the resident graphs hold. Pure bookkeeping, no CUDA.

    Bounds: at most ``capacity`` graphs, and (if ``budget`` is set) at most ``budget`` bytes in all: every
    graph's own bytes plus ``arena_bytes``, the arena they share (the arena layout), which is held while any
    graph is resident and goes back with the last one. Pinned sizes are never chosen as victims.
    """

    def __init__(self, capacity: int, budget: int | None = None, pinned: Iterable[int] = ()) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.budget = budget
        self.pinned = frozenset(pinned)
        self._lru: OrderedDict[int, int] = OrderedDict()  # size -> own bytes, least recently used first
        self._seen: dict[int, int] = {}  # size -> largest footprint ever measured (survives eviction)
        self._seen_arena: dict[int, int] = {}  # size -> largest arena measured right after capturing it
        self._own = 0
        self.arena_bytes = 0

    def __contains__(self, size: object) -> bool:
        return size in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def total_bytes(self) -> int:
        return self._own + self.arena_bytes

    def sizes(self) -> tuple[int, ...]:
        return tuple(self._lru)

    def bytes_of(self, size: int) -> int:
        return self._lru[size]

    def touch(self, size: int) -> None:
        self._lru.move_to_end(size)

    def add(self, size: int, nbytes: int, arena_bytes: int | None = None) -> None:
        """A graph of ``nbytes`` of its own; ``arena_bytes``: the arena's bytes measured after its capture."""
        if size in self._lru:
            raise ValueError(f"size {size} is already resident")
        self._lru[size] = nbytes
        self._own += nbytes
        self._seen[size] = max(nbytes, self._seen.get(size, 0))
        if arena_bytes is not None:
            self.arena_bytes = arena_bytes
            self._seen_arena[size] = max(arena_bytes, self._seen_arena.get(size, 0))

    def remove(self, size: int) -> int:
        """Drop ``size``; returns its own bytes (the arena's go too when it was the last graph)."""
        nbytes = self._lru.pop(size)
        self._own -= nbytes
        if not self._lru:
            self.arena_bytes = 0
        return nbytes

    def estimate(self, size: int) -> int:
        """Expected footprint of a graph of ``size`` (an upper bound): the largest measured at a size >= it,
        else ``lower_estimate``."""
        return _upper(self._seen, size)

    def lower_estimate(self, size: int) -> int:
        """A lower bound: the footprint last measured at the nearest smaller size, else 0."""
        return _lower(self._seen, size)

    def arena_estimate(self, size: int, upper: bool = True) -> int:
        """The arena a capture of ``size`` needs, as ``estimate`` (``upper``) or ``lower_estimate`` would say."""
        return _upper(self._seen_arena, size) if upper else _lower(self._seen_arena, size)

    def _over(self, count: int, nbytes: int) -> bool:
        return count > self.capacity or (self.budget is not None and nbytes > self.budget)

    def victims(
        self, new_bytes: int | None = None, *, arena_need: int = 0, keep: int | None = None, may_evict: bool = True
    ) -> list[int] | None:
        """LRU-first sizes to evict (never pinned, never ``keep``) so that the resident set, plus one more
        graph of ``new_bytes`` needing an arena of ``arena_need`` bytes if given, fits the bounds. None if it
        cannot fit even after evicting every candidate, or (``may_evict=False``) without evicting any."""
        adding = new_bytes is not None
        left, own = len(self._lru), self._own + (new_bytes or 0)

        def total() -> int:
            arena = self.arena_bytes if left else 0
            return own + (max(arena, arena_need) if adding else arena)

        victims: list[int] = []
        for size, b in self._lru.items():
            if not self._over(left + adding, total()):
                break
            if size in self.pinned or size == keep:
                continue
            victims.append(size)
            left, own = left - 1, own - b
        if self._over(left + adding, total()) or (victims and not may_evict):
            return None
        return victims


def _upper(seen: dict[int, int], size: int) -> int:
    at_or_above = [b for s, b in seen.items() if s >= size]
    return max(at_or_above) if at_or_above else _lower(seen, size)


def _lower(seen: dict[int, int], size: int) -> int:
    below = [s for s in seen if s < size]
    return seen[max(below)] if below else 0
