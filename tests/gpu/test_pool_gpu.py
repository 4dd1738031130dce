"""GraphPool on a real GPU: bit-exact replay, eviction that frees memory, budget, failures, layouts."""

from __future__ import annotations

import gc
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from graphpool.pool import (
    CapturedGraph,
    CaptureError,
    CaptureFailureKind,
    CudaGraphCapturer,
    FallbackReason,
    GraphPool,
    PoolConfig,
)
from memory_probe import probe_layout
from toy import TOY_SPECS, ToyDecode

DEV = torch.device("cuda")




def padded(m: ToyDecode, live: dict[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
    bs = live["input_ids"].shape[0]
    pad = torch.zeros(size - bs, dtype=torch.int64, device=DEV)
    return {k: torch.cat([v, pad]) for k, v in live.items()}


def check_bitwise(pool: GraphPool, m: ToyDecode, bs: int, seed: int) -> None:
    """Graph output == eager step on the same padded batch, bit for bit; == eager on live rows, closely."""
    live = m.inputs(bs, seed)
    out = pool.run(live).clone()
    size = pool.ladder.find_closest(bs)
    assert size is not None
    ref = m(padded(m, live, size))[:bs]
    assert torch.equal(out, ref), f"bs={bs}: replay differs from eager at bucket {size}"
    torch.testing.assert_close(out, m(live), rtol=5e-2, atol=5e-2)  # other GEMM shapes: close, not equal


def free_bytes() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


@pytest.mark.parametrize("layout", ["arena", "per_graph"])
def test_replay_equals_eager_bitwise_including_padding(big: ToyDecode, layout: str) -> None:
    pool = GraphPool(big, TOY_SPECS, PoolConfig(miss_policy="capture", mempool=layout), device=DEV)  # type: ignore[arg-type]
    for i, bs in enumerate((1, 3, 8, 17, 32, 33, 50, 70, 100, 250)):  # 10 distinct buckets
        check_bitwise(pool, big, bs, seed=2 * i)  # first run captures
        check_bitwise(pool, big, bs, seed=2 * i + 1)  # second replays on fresh inputs
    st = pool.stats()
    assert st.captures == 10 and st.hits == 10 and st.eager_steps == 0
    pool.close()


def test_padded_rows_write_only_the_dummy_slot(small: ToyDecode) -> None:
    pool = GraphPool(small, TOY_SPECS, PoolConfig(batch_sizes=(16,)), device=DEV)
    small.kv.fill_(7.0)
    live = small.inputs(5, seed=3)
    pool.run(live)
    torch.cuda.synchronize()
    touched = torch.nonzero((small.kv != 7.0).any(dim=1)).flatten().tolist()
    assert set(touched) <= {0, *live["slot_mapping"].tolist()}
    assert 0 in touched
    pool.close()


def test_capacity_one_200_alternating_sizes(small: ToyDecode) -> None:
    pool = GraphPool(small, TOY_SPECS, PoolConfig(miss_policy="capture", max_graph_pool_size=1), device=DEV)
    sizes = (3, 48, 7, 20)
    for i in range(200):
        check_bitwise(pool, small, sizes[i % len(sizes)], seed=i)
    st = pool.stats()
    assert st.captures == 200 and st.evictions == 199 and st.resident_graphs == 1
    pool.close()


def test_per_graph_eviction_returns_memory(big: ToyDecode) -> None:
    cfg = PoolConfig(miss_policy="capture", max_graph_pool_size=12, mempool="per_graph")
    pool = GraphPool(big, TOY_SPECS, cfg, device=DEV)
    pool.warmup([256, 240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80])
    st = pool.stats()
    assert st.resident_graphs == 12 and st.resident_bytes > 12 * 2**20
    held = free_bytes()
    victims = pool.resident_sizes()[:8]
    for s in victims:
        assert pool.evict(s)
    accounted = st.resident_bytes - pool.stats().resident_bytes
    freed = free_bytes() - held
    assert freed >= 0.8 * accounted, f"freed {freed} of {accounted} accounted bytes"
    before_all = free_bytes()
    rest = pool.stats().resident_bytes
    pool.evict_all()
    assert free_bytes() - before_all >= 0.8 * rest
    pool.close()


def test_per_graph_byte_budget_never_exceeded_over_a_sweep(big: ToyDecode) -> None:
    probe = GraphPool(big, TOY_SPECS, PoolConfig(miss_policy="capture", mempool="per_graph"), device=DEV)
    probe.warmup([128])
    budget = 3 * probe.stats().resident_bytes  # room for ~3 graphs of 128
    probe.close()
    base = free_bytes()
    cfg = PoolConfig(miss_policy="capture", graph_memory_budget=budget, mempool="per_graph")
    pool = GraphPool(big, TOY_SPECS, cfg, device=DEV)
    rng = random.Random(0)
    for i in range(40):
        bs = rng.choice((4, 16, 40, 64, 100, 128, 200, 256))
        out = pool.run(big.inputs(bs, seed=i))
        del out
        st = pool.stats()
        assert st.resident_bytes <= budget
        # driver view: graphs + the static input buffers (and allocator rounding) stay within the budget
        assert base - free_bytes() <= budget + 16 * 2**20
    st = pool.stats()
    assert st.evictions > 0
    pool.close()


class OomCapturer(CudaGraphCapturer):
    def __init__(self, fail: set[int]) -> None:
        super().__init__(DEV)
        self.fail = fail

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        if size in self.fail:
            err = torch.OutOfMemoryError(f"induced OOM at size {size}")
            raise CaptureError(CaptureFailureKind.OOM, size, err) from err
        return super().capture(size, fn)


def test_induced_capture_failures_fall_back_and_pool_keeps_working(small: ToyDecode) -> None:
    pool = GraphPool(
        small, TOY_SPECS, PoolConfig(miss_policy="capture"), device=DEV, capturer=OomCapturer({5})
    )
    for i in range(3):
        check_bitwise(pool, small, 5, seed=i)
    check_bitwise(pool, small, 6, seed=9)
    check_bitwise(pool, small, 6, seed=10)
    st = pool.stats()
    assert st.capture_failures == 1 and st.fallbacks == {FallbackReason.CAPTURE_FAILED: 3}
    assert st.capture_failures_by_kind == {"oom": 1}
    assert st.resident_sizes == (6,) and st.hits == 1
    pool.close()


def test_step_that_raises_during_capture_falls_back(small: ToyDecode) -> None:
    def step(s: dict[str, torch.Tensor]) -> torch.Tensor:
        out = small(s)
        if s["input_ids"].shape[0] == 4 and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("induced failure during capture")
        return out

    pool = GraphPool(step, TOY_SPECS, PoolConfig(miss_policy="capture"), device=DEV)
    stream = torch.cuda.current_stream()
    for i in range(2):
        live = small.inputs(3, seed=i)
        out = pool.run(live).clone()
        live4 = small.inputs(4, seed=10 + i)
        out4 = pool.run(live4)
        assert torch.cuda.current_stream() == stream  # the caller's stream is restored after the failure
        torch.testing.assert_close(out4, small(live4), rtol=0, atol=0)
        assert torch.equal(out, small(padded(small, live, 3)))
    st = pool.stats()
    assert st.fallbacks == {FallbackReason.CAPTURE_FAILED: 2} and st.capture_failures == 1
    assert st.capture_failures_by_kind == {"error": 1}
    assert st.resident_sizes == (3,) and st.hits == 1
    pool.close()


def test_shared_layout_full_eviction_then_capture_again(small: ToyDecode) -> None:
    cfg = PoolConfig(mempool="shared", miss_policy="capture", max_graph_pool_size=3)
    pool = GraphPool(small, TOY_SPECS, cfg, device=DEV)
    for round_ in range(3):
        for bs in (2, 9, 30):
            check_bitwise(pool, small, bs, seed=round_ * 10 + bs)
        assert pool.evict_all() == 3  # every graph on the shared handle dies
    one = GraphPool(
        small,
        TOY_SPECS,
        PoolConfig(mempool="shared", miss_policy="capture", max_graph_pool_size=1),
        device=DEV,
    )
    for i in range(30):
        check_bitwise(one, small, (2, 9)[i % 2], seed=i)
    pool.close()
    one.close()


def test_microbatch_graph_equals_eager(small: ToyDecode) -> None:
    def step2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return small(a), small(b)

    pool = GraphPool(step2, TOY_SPECS, PoolConfig(num_microbatches=2, miss_policy="capture"), device=DEV)
    for i, (n0, n1) in enumerate(((5, 3), (5, 5), (2, 7), (40, 33))):
        a, b = small.inputs(n0, seed=100 + i), small.inputs(n1, seed=200 + i)
        # distinct slots across the two microbatches (both write the same KV buffer)
        a["slot_mapping"] = torch.arange(1, n0 + 1, device=DEV)
        b["slot_mapping"] = torch.arange(300, 300 + n1, device=DEV)
        o0, o1 = (t.clone() for t in pool.run([a, b]))
        size = pool.ladder.find_closest(max(n0, n1))
        r0, r1 = step2(padded(small, a, size), padded(small, b, size))  # type: ignore[arg-type]
        assert torch.equal(o0, r0[:n0]) and torch.equal(o1, r1[:n1])
    assert pool.stats().captures == 3 and pool.stats().hits == 1
    pool.close()


def test_capture_not_broken_by_another_thread_using_cuda(small: ToyDecode) -> None:
    stop = threading.Event()

    def busy() -> None:
        s = torch.cuda.Stream()
        x = torch.randn(256, 256, device=DEV)
        with torch.cuda.stream(s):
            while not stop.is_set():
                x = torch.tanh(x @ x)
                s.synchronize()

    t = threading.Thread(target=busy)
    t.start()
    try:
        pool = GraphPool(small, TOY_SPECS, PoolConfig(miss_policy="capture"), device=DEV)
        for i, bs in enumerate((1, 6, 19, 64, 200)):
            check_bitwise(pool, small, bs, seed=i)
        assert pool.stats().capture_failures == 0
        pool.close()
    finally:
        stop.set()
        t.join()


def test_memory_numbers_of_the_layouts(big: ToyDecode) -> None:
    per = probe_layout("per_graph", big, graphs=20, keep=8)
    shared = probe_layout("shared", big, graphs=20, keep=8)
    arena = probe_layout("arena", big, graphs=20, keep=8)
    print(f"\n[memory] {per}\n[memory] {shared}\n[memory] {arena}")
    assert per.freed_driver >= 0.8 * per.evicted_accounted
    assert shared.resident_driver < per.resident_driver
    assert per.freed_all_driver + per.freed_driver >= 0.8 * per.resident_accounted
    assert arena.resident_driver < shared.resident_driver
    assert arena.freed_driver >= 0.95 * arena.evicted_accounted
    assert arena.freed_all_driver + arena.freed_driver >= 0.95 * arena.resident_accounted


def test_host_inputs_equal_device_inputs_while_copies_are_queued(small: ToyDecode) -> None:
    """Inputs on the host go through the pool's pinned mirrors in one copy: with GPU work queued ahead (every
    mirror still busy when its turn comes again), each step still reads its own rows, padding included; a
    microbatch with one input on the device and one on the host too."""
    pool = GraphPool(small, TOY_SPECS, PoolConfig(miss_policy="capture"), device=DEV)
    sizes = (1, 3, 8, 5, 2, 7, 1, 6, 4, 3)
    for bs in sizes:  # the captures, and the references from device inputs
        pool.run(small.inputs(bs, seed=bs))
    refs = [pool.run(small.inputs(bs, seed=100 + i)).clone() for i, bs in enumerate(sizes)]
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # NOTE: tens of ms of GPU work ahead of the copies
    outs = []
    for i, bs in enumerate(sizes):
        host = small.inputs(bs, seed=100 + i, device="cpu")
        if i % 2:
            host["input_ids"] = host["input_ids"].to(DEV)
        outs.append(pool.run(host).clone())
    torch.cuda.synchronize()
    for bs, ref, out in zip(sizes, refs, outs, strict=True):
        assert torch.equal(ref, out), f"bs={bs}: host inputs gave another step's rows"
    assert pool.stats().hits >= len(sizes)
    eager = GraphPool(small, TOY_SPECS, PoolConfig(enabled=False), device=DEV)  # the fallback moves them itself
    torch.testing.assert_close(eager.run(small.inputs(3, seed=101, device="cpu")), refs[1], rtol=1e-4, atol=1e-4)
