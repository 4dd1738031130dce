"""Many threads calling run() at once: every call gets its own correct result, stats stay consistent."""

from __future__ import annotations

import random
import threading

import torch

from graphpool.pool import FallbackReason, GraphPool, InputSpec, PoolConfig
from graphpool.pool.testing import EagerCapturer

SPECS = (InputSpec("x", (3,), torch.float32, 0.0),)


def step(s: dict[str, torch.Tensor]) -> torch.Tensor:
    return s["x"] * 2 + 1


def _hammer(pool: GraphPool, threads: int, calls: int) -> list[str]:
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        barrier.wait()
        for i in range(calls):
            bs = rng.randint(1, 40)
            x = torch.full((bs, 3), float(tid * 1000 + i))
            out = pool.run({"x": x}, clone=True)
            if out.shape != (bs, 3) or not torch.equal(out, x * 2 + 1):
                errors.append(f"thread {tid} call {i} bs={bs}")

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


def test_concurrent_runs_capture_policy() -> None:
    pool = GraphPool(
        step,
        SPECS,
        PoolConfig(miss_policy="capture", max_graph_pool_size=4),
        device="cpu",
        capturer=EagerCapturer(),
    )
    assert _hammer(pool, threads=8, calls=60) == []
    st = pool.stats()
    assert st.steps == 480 and st.hits + st.misses == 480 and st.eager_steps == 0
    assert st.captures == st.misses and st.evictions == st.captures - st.resident_graphs
    assert st.resident_graphs <= 4


def test_concurrent_runs_admit_policy_with_budget() -> None:
    cfg = PoolConfig(max_graph_pool_size=5, graph_memory_budget=3000, max_padding_ratio=0.5)
    pool = GraphPool(step, SPECS, cfg, device="cpu", capturer=EagerCapturer(footprint=lambda s: 50 * s))
    assert _hammer(pool, threads=8, calls=60) == []
    st = pool.stats()
    assert st.steps == 480
    assert st.hits + st.misses == 480
    # every miss ends as exactly one of: a padded hit, a capture then replay, an eager step
    assert set(st.fallbacks) <= {FallbackReason.NOT_ADMITTED}
    assert st.misses == st.padded_hits + st.captures + st.eager_steps
    assert st.resident_bytes <= 3000 and st.resident_graphs <= 5
