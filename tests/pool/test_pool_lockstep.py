"""Pools in lockstep (graphpool.pool.lockstep): one rank decides, every rank applies the decision; a capture
failure on one rank makes every rank fall back. Two gloo processes, the EagerCapturer test double."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist

from gloo_ranks import run_ranks
from graphpool.pool import FallbackReason, GraphPool, InputSpec, PoolConfig
from graphpool.pool.lockstep import Decision
from graphpool.pool.testing import EagerCapturer

D = 4
SPECS = (InputSpec("x", (D,), torch.float32, 0.0),)
# a small pool (4 graphs, a byte budget) so that a random workload misses, pads, captures and evicts
CONFIG = dict(max_batch_size=64, split_batch_size=8, grow_step=8, max_graph_pool_size=4,
              graph_memory_budget=10_000, admit_after=2, admit_window=16)


def gloo_max(values: Sequence[int]) -> list[int]:
    t = torch.tensor(list(values), dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def workload(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([1, 2, 3, 5, 8, 13, 20, 33, 47, 64, 70]) for _ in range(n)]


def _lockstep_rank(rank: int, world: int, steps: int, fail_sizes: dict[int, list[int]],
                   arena_unit: int = 0) -> dict[str, Any]:
    """One rank: rank 0 decides each step and broadcasts the decision; every rank runs it. The step sums its
    rows over the ranks (a gloo all-reduce), as the model's decode step does, except under "capture": like
    NCCL under CUDA graph capture, a captured collective does not communicate."""
    # NOTE: footprints differ by rank, so the pools stay equal only if they agree on them
    # NOTE: arenas too: rank 0's the larger
    cap = EagerCapturer(footprint=lambda s: 100 * s * (rank + 1), fail_sizes=fail_sizes.get(rank, ()),
                        arena=lambda s: arena_unit * s * (world - rank))

    def step(s: dict[str, torch.Tensor]) -> torch.Tensor:
        out = s["x"] * (rank + 1)
        if not cap.capturing:
            dist.all_reduce(out)
        return out

    pool = GraphPool(step, SPECS, PoolConfig(**CONFIG), device="cpu", capturer=cap, capture_sync=gloo_max)
    pool.warmup([8, 2])
    decisions: list[Decision] = []
    for i, bs in enumerate(workload(steps, seed=7)):
        box: list[Any] = [pool.decide(bs) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        decisions.append(box[0])
        x = torch.randn(bs, D, generator=torch.Generator().manual_seed(i))
        out = pool.run({"x": x}, decision=box[0])
        # every rank ran the same step with the same graph size: out = x * (1 + 2 + ... + world)
        torch.testing.assert_close(out, x * (world * (world + 1) // 2))
    return {"decisions": decisions, "stats": dataclasses.replace(pool.stats(), capture_seconds_total=0.0,
                                                                 capture_seconds_max=0.0),
            "captured": cap.captured, "released": cap.released}


def test_ranks_take_identical_decisions_and_keep_identical_stats() -> None:
    r0, r1 = run_ranks(_lockstep_rank, 2, 120, {})
    assert r0["decisions"] == r1["decisions"]
    assert r0["stats"] == r1["stats"]
    st = r0["stats"]
    # the workload exercised every path: hits, padded hits, captures on a miss, evictions, eager steps
    assert st.hits and st.padded_hits and st.captures > 2 and st.evictions and st.eager_steps
    assert {d.action for d in r0["decisions"]} == {"hit", "pad", "capture", "eager"}
    assert r0["captured"] == r1["captured"]
    # rank 1's graphs are twice as large: both ranks account the larger footprint
    assert st.resident_bytes == sum(200 * s for s in st.resident_sizes)


def test_ranks_agree_on_the_arena_bytes_and_evict_alike() -> None:
    r0, r1 = run_ranks(_lockstep_rank, 2, 120, {1: [16]}, 40)  # rank 1 seals its arena at bs=16, rank 0 not
    assert r0["decisions"] == r1["decisions"] and r0["stats"] == r1["stats"]
    st = r0["stats"]
    assert st.evictions and st.captures > 2 and st.arena_bytes > 0
    # rank 1's graphs are larger, rank 0's arena is: both ranks account the larger of each
    assert st.resident_bytes == sum(200 * s for s in st.resident_sizes) + st.arena_bytes
    assert st.arena_bytes % 80 == 0


def test_a_capture_failure_on_one_rank_makes_every_rank_fall_back() -> None:
    r0, r1 = run_ranks(_lockstep_rank, 2, 60, {1: [16]})
    assert r0["stats"] == r1["stats"]
    st = r0["stats"]
    assert st.capture_failures_by_kind == {"oom": 1}
    assert 16 not in st.resident_sizes
    assert st.fallbacks.get(FallbackReason.CAPTURE_FAILED, 0) >= 2  # the failed step and a later one
    # rank 0 captured bs=16 and let it go; rank 1 never had it
    assert 16 in r0["captured"] and 16 in r0["released"] and 16 not in r1["captured"]
    later = [d for d in r0["decisions"] if d.bucket == 16][1:]
    assert later and all(d.action == "eager" and d.reason is FallbackReason.CAPTURE_FAILED for d in later)


# ---- one process: decide + run(decision) is run() --------------------------------------------------------
def _step(s: dict[str, torch.Tensor]) -> torch.Tensor:
    return s["x"] * 3


def _pool() -> GraphPool:
    return GraphPool(_step, SPECS, PoolConfig(**CONFIG), device="cpu", capturer=EagerCapturer(footprint=500))


def test_decide_then_run_is_run() -> None:
    a, b = _pool(), _pool()
    for i, bs in enumerate(workload(80, seed=3)):
        x = torch.randn(bs, D, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(a.run({"x": x}), b.run({"x": x}, decision=b.decide(bs)))
    sa, sb = a.stats(), b.stats()
    assert dataclasses.replace(sa, capture_seconds_total=0, capture_seconds_max=0) == dataclasses.replace(
        sb, capture_seconds_total=0, capture_seconds_max=0)
    assert sa.captures and sa.padded_hits


def test_a_decision_that_does_not_fit_the_batch_or_the_pool_is_refused() -> None:
    pool = _pool()
    x = torch.ones(5, D)
    with pytest.raises(ValueError, match="bucket 1"):
        pool.run({"x": x}, decision=pool.decide(1))
    with pytest.raises(RuntimeError, match="not resident"):
        pool.run({"x": x}, decision=Decision("hit", 5, 5))
    with pytest.raises(ValueError, match="batch size"):
        pool.decide(0)
