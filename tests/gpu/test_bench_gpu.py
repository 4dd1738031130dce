"""The benches' GPU paths run end to end on small shapes (no timing assertions: only that they work and that
the numbers they rest on are sane)."""

from __future__ import annotations

import math
from pathlib import Path

from graphpool.bench.kernels_ab import KernelsABConfig, run_kernels_bench
from graphpool.bench.memory import MemoryBenchConfig, run_memory_bench
from graphpool.bench.step import StepBenchConfig, run_step_bench
from graphpool.bench.trace.run import TraceBenchConfig, run_trace_bench
from graphpool.model.config import ModelConfig

# two layers: torch.compile of the whole step stays a few seconds
TINY = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=64)


def test_step_bench_graph_matches_eager_and_times_everything(tmp_path: Path) -> None:
    cfg = StepBenchConfig(models=("smollm2-135m",), batch_sizes=(1, 8), compile_sizes=(), context_len=128,
                          warmup=2, reps=5)
    rows = run_step_bench(cfg, tmp_path, ["test"])["rows"]
    assert len(rows) == 2
    for r in rows:
        assert r.graph_rel_err < 1e-3  # the same kernels on the same inputs
        for v in (r.eager_ms, r.graph_ms, r.pool_ms, r.capture_ms, r.floor_ms):
            assert math.isfinite(v) and v > 0
    assert (tmp_path / "step.json").exists() and (tmp_path / "step.png").exists()


def test_step_bench_compiles_the_plain_ops_step_with_its_graphs(tmp_path: Path) -> None:
    cfg = StepBenchConfig(models=(TINY,), batch_sizes=(1, 4), compile_sizes=(4,), context_len=128, warmup=2, reps=5,
                          use_pool=False)
    rows = run_step_bench(cfg, tmp_path, ["test"])["rows"]
    r = {row.batch_size: row for row in rows}[4]
    assert r.compile_error is None
    assert math.isfinite(r.compile_ms) and r.compile_ms > 0 and r.compile_s > 0 and r.torch_ops_eager_ms > 0
    assert r.compile_rel_err < 5e-2  # bf16: inductor fuses and rounds differently from eager (a bug: ~1)
    assert r.compile_cudagraph_skips == 0  # the KV cache write is a static-address mutation, not a skip
    assert math.isnan({row.batch_size: row for row in rows}[1].compile_ms)  # only the sizes asked for


def test_memory_bench_eviction_frees_memory_and_budget_holds(tmp_path: Path) -> None:
    cfg = MemoryBenchConfig(model="smollm2-135m", context_len=128, max_batch_size=16, split_batch_size=8,
                            grow_step=4, evict_to=(4, 0), sweep_steps=20)
    res = run_memory_bench(cfg, tmp_path, ["test"])
    arena, per_graph = res["layouts"]
    assert (arena.layout, per_graph.layout) == ("arena", "per_graph")
    for layout in (arena, per_graph):  # resident sets grow to the whole ladder, then evictions to 4 and 0
        counts = [p[0] for p in layout.points]
        assert counts[-3:] == [10, 4, 0] and counts[:-2] == sorted(counts[:-2])
    full, empty = per_graph.points[-3][1], per_graph.points[-1][1]
    assert full > 0 and empty < 0.2 * full
    # the arena layout: what the pool accounts is the arena alone (a graph holds nothing of its own)
    assert arena.arena_mib > 0 and arena.accounted_mib_all == arena.arena_mib
    assert arena.points[-1][2] == 0  # the last graph gave the arena back
    b = res["budget"]
    assert b.over_budget_events == 0 and b.max_accounted_mib <= b.budget_mib
    assert (tmp_path / "memory.json").exists()


def test_trace_bench_runs_two_configs_through_the_engine(tmp_path: Path) -> None:
    cfg = TraceBenchConfig(model="random:smollm2-135m", rates=(8.0,), duration_s=2.0, configs=("no-graphs", "no-warmup"),
                           kv_gib=0.25, max_model_len=512, prompt_mean=32, prompt_cap=128, output_mean=32,
                           output_cap=128)
    res = run_trace_bench(cfg, tmp_path, ["test"])
    runs = {r["config"]: r for r in res["runs"]}
    assert set(runs) == {"no-graphs", "no-warmup"}
    assert runs["no-graphs"]["graph_steps"] == 0 and runs["no-graphs"]["stats_end"] is None
    assert runs["no-warmup"]["decode_steps"] > 0 and runs["no-warmup"]["stats_end"] is not None
    for r in runs.values():
        assert r["latency"].output_tokens > 0 and r["latency"].started > 0 and r["prefill_steps"] > 0
    assert runs["no-graphs"]["decode_steps"] >= 20  # eager decode is not starved by prefill (kernel variants pre-warmed)
    warm = res["process_warmup"]
    assert warm["contexts"][-1] == 255 and warm["decode_steps"] >= 2 * len(warm["contexts"])
    assert 0 < warm["second_pass_max_ms"] < 250  # nothing left to JIT-compile on the second pass (a JIT: ~0.5 s)
    assert (tmp_path / "trace_itl_cdf.png").exists()


def test_kernels_bench_times_both_settings_in_graphs(tmp_path: Path) -> None:
    """A: the qkv + rotary kernel and the step's Triton argmax off; both are bitwise what they replace, so B's
    logits and argmaxes are A's exactly; the GEMV and PDL off as well change the logits, a little."""
    cfg = KernelsABConfig(models=("smollm2-135m",), batch_sizes=(1, 2), engine_sizes=(1,),
                          off=("gemv_rope", "step_argmax"), context_len=128, rounds=2, reps=3, warmup=1)
    rows = run_kernels_bench(cfg, tmp_path, ["test"])["rows"]
    for r in rows:
        assert math.isfinite(r.b_over_a) and r.ms["A"] > 0 and r.floor_ms > 0
        assert r.logits_rel_err == 0.0 and r.argmax_agree == 1.0, (r.batch_size, r.logits_rel_err)
    assert rows[0].engine_ms["A"] > 0 and rows[0].engine_ms["B"] > 0
    every = KernelsABConfig(models=("smollm2-135m",), batch_sizes=(1,), engine_sizes=(), context_len=128, rounds=1,
                            reps=2, warmup=1)  # fmt: skip
    (r,) = run_kernels_bench(every, tmp_path / "every", ["test"])["rows"]
    assert 0 < r.logits_rel_err < 5e-2 and (tmp_path / "every" / "kernels.png").exists()
