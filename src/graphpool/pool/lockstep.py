"""Pools in lockstep across ranks (tensor parallel): one decision per step, one outcome per capture.

Under tensor parallelism every rank's decode step contains the all-reduce, so every rank must replay,
capture and evict the same graphs at the same step, or the collectives pair up wrongly (a hang) and graph
buffers stop matching. Two things keep the pools equal:

- **one decision per step**: the leading rank's pool decides (`GraphPool.decide`), the `Decision` travels
  with the step's batch, and every rank's pool applies it (`GraphPool.run(..., decision=...)`), the leader's
  too. Followers never consult their miss policy.
- **one outcome per capture**: every rank captures the same size at the same step; right after, the ranks
  agree (`CaptureSync`, an element-wise max over ranks the engine provides) on whether any failed (then every
  rank drops its graph and runs that size eagerly) and on the footprint and arena bytes every rank accounts
  (the largest: each rank stays within its budget). Identical books give identical evictions, so every later decision
  stays the same on every rank.

Stats are then identical on every rank except the capture seconds, which are each rank's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from graphpool.pool.capture import CapturedGraph
from graphpool.pool.failures import CaptureError, CaptureFailureKind
from graphpool.pool.stats import FallbackReason

__all__ = ["CaptureSync", "Decision", "agree_on_capture"]

# (this rank's values) -> element-wise max over all ranks; a collective: every rank calls it together
CaptureSync = Callable[[Sequence[int]], Sequence[int]]

Action = Literal["hit", "pad", "capture", "eager"]
_KINDS = tuple(CaptureFailureKind)  # code 0: captured; code i: _KINDS[i - 1]


@dataclass(frozen=True)
class Decision:
    """What one step does with the pool: replay the graph of ``size`` (``hit``: the bucket's own; ``pad``:
    a resident larger one), capture ``size`` now (``capture``), or run eagerly for ``reason``. ``bucket``:
    the step's ladder size (None when graphs are off or the batch is above the ladder); ``missed``: the
    bucket had no resident graph (counted in ``PoolStats.misses``)."""

    action: Action
    bucket: int | None = None
    size: int | None = None
    reason: FallbackReason | None = None
    missed: bool = False

    @classmethod
    def eager(cls, reason: FallbackReason, bucket: int | None = None, missed: bool = False) -> Decision:
        return cls("eager", bucket, None, reason, missed)


class _PeerFailed(RuntimeError):
    """This rank's capture succeeded but another rank's failed."""


def agree_on_capture(
    sync: CaptureSync, size: int, got: CapturedGraph | CaptureError, release: Callable[[CapturedGraph], None]
) -> CapturedGraph | CaptureError:
    """The outcome every rank takes for the capture of ``size``: this rank's graph, footprint and arena bytes
    raised to the largest over the ranks, if all captured; else a ``CaptureError`` of the agreed kind (this
    rank's graph, if it had one, released)."""
    code = 0 if isinstance(got, CapturedGraph) else 1 + _KINDS.index(got.kind)
    footprint, arena = (got.footprint, got.arena_bytes) if isinstance(got, CapturedGraph) else (0, 0)
    agreed_code, agreed_footprint, agreed_arena = (int(v) for v in sync([code, footprint, arena]))
    if agreed_code == 0:
        assert isinstance(got, CapturedGraph)
        got.footprint, got.arena_bytes = agreed_footprint, agreed_arena
        return got
    kind = _KINDS[agreed_code - 1]
    if isinstance(got, CapturedGraph):
        release(got)
        cause: BaseException = _PeerFailed(f"bs={size} captured here but failed on another rank ({kind.value})")
        return CaptureError(kind, size, cause)
    return got if got.kind is kind else CaptureError(kind, size, got.cause)
