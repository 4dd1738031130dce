"""The memory bench's capture order, eviction and budget logic on the CPU, with the pool's test-double
capturer (fake footprints and arenas; the driver view reads 0 without CUDA, so only the pool's accounting is
checked here)."""

from __future__ import annotations

import torch

from graphpool.bench.common import MIB
from graphpool.bench.decode import DecodeSetup, build_random_model
from graphpool.bench.memory import (
    MemoryBenchConfig,
    bench_budget,
    bench_layout,
    capture_order,
    default_budget,
)
from graphpool.bench.memory_results import markdown
from graphpool.model.config import ModelConfig
from graphpool.pool import PoolConfig
from graphpool.pool.testing import EagerCapturer

TINY = ModelConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                   head_dim=8)
CFG = MemoryBenchConfig(context_len=16, max_batch_size=12, split_batch_size=4, grow_step=4, resident=4,
                        evict_to=(4, 1, 0), sweep_steps=30, device="cpu")


def _setup() -> DecodeSetup:
    model = build_random_model(TINY, torch.device("cpu"), torch.float32, "torch", max_positions=32)
    return DecodeSetup.create(model, CFG.max_batch_size, CFG.context_len, block_size=8)


def test_capture_order_is_the_cover_then_a_fill_to_the_pool_size_then_the_rest() -> None:
    config = PoolConfig()  # the default ladder: 1..32, then every 16 up to 256
    groups = capture_order(config, 16)
    cover = config.ladder().padding_cover(config.max_padding_ratio)
    assert groups[0] == sorted(cover, reverse=True) and len(groups[0]) + len(groups[1]) == 16
    assert sorted(s for g in groups for s in g) == list(config.ladder().sizes)
    assert all(g == sorted(g, reverse=True) for g in groups)


def test_layout_captures_the_ladder_then_evicts_the_latest_captured_first() -> None:
    setup = _setup()
    cap = EagerCapturer(footprint=lambda size: size * MIB, arena=lambda size: 2 * size * MIB)
    with torch.inference_mode():
        res = bench_layout(setup, CFG, "arena", cap)
    ladder = [1, 2, 3, 4, 8, 12]
    assert sorted(cap.captured) == ladder and cap.captured[0] == 12  # largest first: the arena at once
    assert res.arena_mib == 24 and res.accounted_mib_all == sum(ladder) + 24
    assert [s.own_mib for s in res.sizes] == ladder
    order = [s for g in capture_order(PoolConfig(max_batch_size=12, split_batch_size=4, grow_step=4), 4) for s in g]
    kept4 = order[:4]
    assert kept4 == [12, 4, 2, 1]  # the padding cover of this ladder
    assert [(p[0], p[2]) for p in res.points[-3:]] == [(4, sum(kept4) + 24.0), (1, 12 + 24.0), (0, 0.0)]
    # each eviction: the graphs' own bytes, and the arena with the last graph
    assert [(n, acc) for n, acc, _ in res.evictions] == [(2, sum(ladder) - sum(kept4)), (3, sum(kept4) - 12.0),
                                                          (1, 12 + 24.0)]
    assert default_budget(res) == (24 + sum(ladder)) / 2


def test_budget_run_never_holds_more_than_the_budget() -> None:
    setup = _setup()
    cap = EagerCapturer(footprint=lambda size: size * MIB, arena=lambda size: size * MIB // 2)
    with torch.inference_mode():
        res = bench_budget(setup, CFG, 19 * MIB, cap)
    assert res.over_budget_events == 0 and 0 < res.max_accounted_mib <= 19
    assert res.warmup_captured >= 1 and res.captures > res.warmup_captured  # the sweep captured more on misses
    assert res.evictions > 0
    layouts = [bench_layout(setup, CFG, "per_graph", EagerCapturer(footprint=MIB, shared_outputs=False))]
    text = markdown(layouts, res, CFG, len(layouts[0].points))
    assert "| 19 |" in text and "per_graph" in text
