"""The memory bench's eviction and budget logic on the CPU, with the pool's test-double capturer (fake
footprints; the driver view reads 0 without CUDA, so only the pool's accounting is checked here)."""

from __future__ import annotations

import torch

from graphpool.bench.common import MIB
from graphpool.bench.decode import DecodeSetup, build_random_model
from graphpool.bench.memory import MemoryBenchConfig, bench_budget, bench_layout, markdown
from graphpool.model.config import ModelConfig
from graphpool.pool.testing import EagerCapturer

TINY = ModelConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                   head_dim=8)
CFG = MemoryBenchConfig(context_len=16, max_batch_size=12, split_batch_size=4, grow_step=4, evict_to=(4, 1, 0),
                        sweep_steps=30, device="cpu")


def _setup() -> DecodeSetup:
    model = build_random_model(TINY, torch.device("cpu"), torch.float32, "torch", max_positions=32)
    return DecodeSetup.create(model, CFG.max_batch_size, CFG.context_len, block_size=8)


def test_layout_captures_the_ladder_then_evicts_largest_first() -> None:
    setup = _setup()
    cap = EagerCapturer(footprint=lambda size: size * MIB)
    with torch.inference_mode():
        res = bench_layout(setup, CFG, "per_graph", cap)
    ladder = [1, 2, 3, 4, 8, 12]
    assert sorted(cap.captured) == ladder
    assert res.accounted_mib_all == sum(ladder)
    assert [(p[0], p[2]) for p in res.points] == [(6, 30.0), (4, 10.0), (1, 1.0), (0, 0.0)]
    assert cap.released[:2] == [12, 8]  # largest first: the n smallest stay


def test_budget_run_never_holds_more_than_the_budget() -> None:
    setup = _setup()
    cap = EagerCapturer(footprint=lambda size: size * MIB)
    with torch.inference_mode():
        res = bench_budget(setup, CFG, 13 * MIB, cap)
    assert res.over_budget_events == 0 and 0 < res.max_accounted_mib <= 13
    assert res.warmup_captured >= 1 and res.captures > res.warmup_captured  # the sweep captured more on misses
    assert res.evictions > 0
    layouts = [bench_layout(setup, CFG, "shared", EagerCapturer(footprint=MIB))]
    text = markdown(layouts, res, CFG)
    assert "| 13 |" in text and "shared" in text
