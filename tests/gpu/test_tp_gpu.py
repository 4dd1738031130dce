"""Tensor parallel on two GPUs (NCCL), random llama3.2-1b weights: TP=2 with CUDA graphs (the all-reduces and
the logits gather captured inside them) against TP=1 eager, and the two ranks' pools in lockstep through lazy
captures and evictions. Needs 2 CUDA GPUs; skipped with fewer.

The comparisons are teacher-forced (test_engine_gpu.run/compare): TP=2 sums partial products in another order,
so a near-tied argmax may flip; each step's argmax must agree except at near-ties, and the chosen tokens'
logits must be close.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gpu_helpers import report
from test_engine_gpu import MAX_MODEL_LEN, PRESET, compare, run, workload

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.pool import PoolStats

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"needs 2 CUDA GPUs; this machine has {torch.cuda.device_count()}",
)


def make(tp: int, dtype: str, **kwargs: object) -> LLMEngine:
    config = EngineConfig(model=PRESET, device="cuda:0", dtype=dtype, tensor_parallel_size=tp, seed=0,
                          max_model_len=MAX_MODEL_LEN, num_kv_blocks=2500, max_num_seqs=64, **kwargs)  # type: ignore[arg-type]
    return LLMEngine(config)


def _without_seconds(stats: PoolStats | None) -> PoolStats:
    assert stats is not None
    return dataclasses.replace(stats, capture_seconds_total=0.0, capture_seconds_max=0.0)


def test_tp2_graph_decode_matches_tp1_eager_fp32() -> None:
    engine = make(1, "float32", attn_backend="torch", disable_cudagraph=True)
    ref = run(engine, workload())
    del engine
    engine = make(2, "float32", attn_backend="torch", graph_miss_policy="capture")
    try:
        got = run(engine, workload(), forced=ref)
        compare(ref, got, tie=1e-3, logit_tol=1e-3, min_agree=0.995)
        rank0, rank1 = engine.graph_stats_by_rank()
        assert _without_seconds(rank0) == _without_seconds(rank1)
        assert rank0 is not None and rank0.hits > 50 and rank0.captures > 5 and got.graph_steps > 50
        assert engine.model.num_kv_heads == 4 and engine.kv_caches[0][0].shape[2] == 4  # 8 KV heads over 2
        report("tp2 fp32 graph bytes per rank", [s.resident_bytes for s in (rank0, rank1)])
    finally:
        engine.close()


def test_tp2_small_pool_stays_in_lockstep_bf16() -> None:
    """Lazy captures and evictions under TP: a 4-graph pool over a workload of ~40 batch sizes."""
    eager = make(2, "bfloat16", disable_cudagraph=True)
    try:
        ref = run(eager, workload(1))
    finally:
        eager.close()
    engine = make(2, "bfloat16", max_graph_pool_size=4, graph_miss_policy="capture", graph_warmup="1,8,16,32")
    try:
        got = run(engine, workload(1), forced=ref)
        compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
        rank0, rank1 = engine.graph_stats_by_rank()
        assert _without_seconds(rank0) == _without_seconds(rank1)
        assert rank0 is not None and rank0.evictions > 0 and rank0.captures > 4 and rank0.hits > 0
        assert rank0.resident_graphs <= 4 and got.graph_steps > 0
        report("tp2 bf16 small pool stats (rank 0)", rank0.as_dict())
    finally:
        engine.close()


@pytest.fixture(scope="module")
def tp1_eager_bf16():
    return run(make(1, "bfloat16", disable_cudagraph=True), workload(1))


@pytest.mark.parametrize("setting", ["enable_microbatch_overlap", "async_scheduling"])
def test_tp2_overlap_and_async_scheduling_match_tp1_eager_bf16(tp1_eager_bf16, setting: str) -> None:
    """Microbatch overlap: two microbatches a decode graph, each one's NCCL all-reduces (async, captured)
    overlapping the other's compute. Async scheduling: chained decode steps, whose input tokens rank 1 takes by
    an NCCL broadcast from rank 0. Either way the ranks' pools stay in lockstep."""
    engine = make(2, "bfloat16", graph_miss_policy="capture", **{setting: True})
    try:
        got = run(engine, workload(1), forced=tp1_eager_bf16)
        compare(tp1_eager_bf16, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
        rank0, rank1 = engine.graph_stats_by_rank()
        assert _without_seconds(rank0) == _without_seconds(rank1)
        assert rank0 is not None and rank0.hits > 50 and got.graph_steps > 50
        if setting == "async_scheduling":
            assert engine.stats().async_chained_steps_total > 0
        else:
            assert engine.runner.pool.config.num_microbatches == 2
        report(f"tp2 bf16 {setting} graph bytes per rank", [s.resident_bytes for s in (rank0, rank1)])
    finally:
        engine.close()
