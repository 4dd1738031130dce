"""Pool statistics: one frozen snapshot type, the fallback reasons, and the mutable counters behind them."""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from dataclasses import dataclass, field

_MIB = 1 << 20


class FallbackReason(str, enum.Enum):
    """Why a step ran eagerly instead of replaying a graph."""

    DISABLED = "disabled"  # graphs turned off (PoolConfig.enabled=False: the engine's disable_cudagraph)
    NO_CUDA = "no_cuda"  # CPU device and no capturer
    BATCH_TOO_LARGE = "batch_too_large"  # batch above the ladder's largest size
    LEN_TOO_LARGE = "len_too_large"  # max_len_in_batch above the config's bound
    CAPTURE_FAILED = "capture_failed"  # this size failed to capture once; never replayed
    NOT_ADMITTED = "not_admitted"  # miss policy chose not to capture (and no larger graph fits)
    OVER_BUDGET = "over_budget"  # the graph does not fit the byte budget


@dataclass(frozen=True)
class PoolStats:
    """A consistent snapshot of a pool's counters (taken under the pool's lock).

    Every ``run`` is counted once in ``steps`` and is exactly one of: an exact hit, a padded hit (served by a
    larger resident graph), a replay of a graph captured on this miss, or an eager step.
    ``misses`` counts graph-eligible steps whose bucket had no resident graph (padded hits included).
    """

    steps: int = 0
    hits: int = 0
    padded_hits: int = 0
    misses: int = 0
    captures: int = 0
    capture_failures: int = 0
    # failed captures by CaptureFailureKind value ("oom", "capture_invalidated", "error"), summed above
    capture_failures_by_kind: dict[str, int] = field(default_factory=dict)
    evictions: int = 0
    fallbacks: dict[FallbackReason, int] = field(default_factory=dict)
    eager_steps: int = 0
    resident_graphs: int = 0
    resident_bytes: int = 0  # device bytes the resident graphs hold, their shared arena included
    arena_bytes: int = 0  # of which the arena they share (the arena layout; given back with the last graph)
    capture_seconds_total: float = 0.0
    capture_seconds_max: float = 0.0
    resident_sizes: tuple[int, ...] = ()  # least recently used first

    def as_dict(self) -> dict[str, object]:
        """Plain values (reason names as keys), for logs, JSON and metrics."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def describe(self, max_graphs: int | None = None, budget_bytes: int | None = None) -> str:
        """The pool's work in one line, for every command that prints it: decode steps by outcome, captures,
        evictions and what is resident; `max_graphs` and `budget_bytes` (the pool's bounds, when given) follow
        the resident count and bytes."""
        of_graphs = f"/{max_graphs}" if max_graphs is not None else ""
        of_budget = f" of {budget_bytes / _MIB:.0f} MiB budget" if budget_bytes else ""
        return (
            f"{self.steps} decode steps: {self.hits} hits, {self.padded_hits} padded hits, {self.misses} misses, "
            f"{self.captures} captures ({self.capture_seconds_total:.2f} s), {self.evictions} evictions, "
            f"{self.eager_steps} eager; {self.resident_graphs}{of_graphs} graphs resident "
            f"({self.resident_bytes / _MIB:.1f} MiB{of_budget})"
        )


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k.value if isinstance(k, enum.Enum) else k: n for k, n in value.items()}
    return value


@dataclass
class StatsCounters:
    """What the pool counts (only under its lock); ``snapshot`` derives the rest of ``PoolStats``."""

    steps: int = 0
    hits: int = 0
    padded_hits: int = 0
    misses: int = 0
    captures: int = 0
    evictions: int = 0
    capture_failures_by_kind: Counter[str] = field(default_factory=Counter)
    fallbacks: Counter[FallbackReason] = field(default_factory=Counter)
    capture_seconds_total: float = 0.0
    capture_seconds_max: float = 0.0

    def captured(self, seconds: float) -> None:
        self.captures += 1
        self.capture_seconds_total += seconds
        self.capture_seconds_max = max(self.capture_seconds_max, seconds)

    def snapshot(self, resident_sizes: tuple[int, ...], resident_bytes: int, arena_bytes: int = 0) -> PoolStats:
        counted = {
            f.name: dict(v) if isinstance(v := getattr(self, f.name), Counter) else v
            for f in dataclasses.fields(self)
        }
        return PoolStats(
            **counted,
            capture_failures=sum(self.capture_failures_by_kind.values()),
            eager_steps=sum(self.fallbacks.values()),
            resident_graphs=len(resident_sizes),
            resident_bytes=resident_bytes,
            arena_bytes=arena_bytes,
            resident_sizes=resident_sizes,
        )
