"""Pool statistics: one frozen snapshot type, the fallback reasons, and the mutable counters behind them."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field


class FallbackReason(str, enum.Enum):
    """Why a step ran eagerly instead of replaying a graph."""

    DISABLED = "disabled"  # graphs turned off (disable_cudagraph), or the pool was closed
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
    # failed captures by CaptureFailureKind value ("oom", "capture_invalidated", "error"); they sum to
    # capture_failures
    capture_failures_by_kind: dict[str, int] = field(default_factory=dict)
    evictions: int = 0
    fallbacks: dict[FallbackReason, int] = field(default_factory=dict)
    eager_steps: int = 0
    resident_graphs: int = 0
    resident_bytes: int = 0
    capture_seconds_total: float = 0.0
    capture_seconds_max: float = 0.0
    resident_sizes: tuple[int, ...] = ()  # least recently used first

    def as_dict(self) -> dict[str, object]:
        """Plain values (reason names as keys), for logs, JSON and metrics."""
        return {
            "steps": self.steps,
            "hits": self.hits,
            "padded_hits": self.padded_hits,
            "misses": self.misses,
            "captures": self.captures,
            "capture_failures": self.capture_failures,
            "capture_failures_by_kind": dict(self.capture_failures_by_kind),
            "evictions": self.evictions,
            "fallbacks": {r.value: n for r, n in self.fallbacks.items()},
            "eager_steps": self.eager_steps,
            "resident_graphs": self.resident_graphs,
            "resident_bytes": self.resident_bytes,
            "capture_seconds_total": self.capture_seconds_total,
            "capture_seconds_max": self.capture_seconds_max,
            "resident_sizes": list(self.resident_sizes),
        }


class StatsCounters:
    """The pool's mutable counters; only touched under the pool's lock."""

    def __init__(self) -> None:
        self.steps = 0
        self.hits = 0
        self.padded_hits = 0
        self.misses = 0
        self.captures = 0
        self.capture_failures = 0
        self.capture_failures_by_kind: Counter[str] = Counter()
        self.evictions = 0
        self.fallbacks: Counter[FallbackReason] = Counter()
        self.capture_seconds_total = 0.0
        self.capture_seconds_max = 0.0

    def fallback(self, reason: FallbackReason) -> None:
        self.fallbacks[reason] += 1

    def capture_failed(self, kind: str) -> None:
        self.capture_failures += 1
        self.capture_failures_by_kind[kind] += 1

    def captured(self, seconds: float) -> None:
        self.captures += 1
        self.capture_seconds_total += seconds
        self.capture_seconds_max = max(self.capture_seconds_max, seconds)

    def snapshot(self, resident_sizes: tuple[int, ...], resident_bytes: int) -> PoolStats:
        return PoolStats(
            steps=self.steps,
            hits=self.hits,
            padded_hits=self.padded_hits,
            misses=self.misses,
            captures=self.captures,
            capture_failures=self.capture_failures,
            capture_failures_by_kind=dict(self.capture_failures_by_kind),
            evictions=self.evictions,
            fallbacks=dict(self.fallbacks),
            eager_steps=sum(self.fallbacks.values()),
            resident_graphs=len(resident_sizes),
            resident_bytes=resident_bytes,
            capture_seconds_total=self.capture_seconds_total,
            capture_seconds_max=self.capture_seconds_max,
            resident_sizes=resident_sizes,
        )
