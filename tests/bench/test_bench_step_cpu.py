from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graphpool.bench.decode import DecodeSetup, build_random_model
from graphpool.bench.step import StepBenchConfig, run_step_bench
from graphpool.model.config import ModelConfig
from graphpool.model.presets import get_preset

TINY = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8)


def test_step_bench_cpu_path_runs_and_writes_reports(tmp_path: Path) -> None:
    cfg = StepBenchConfig(models=(TINY,), batch_sizes=(1, 3), context_len=20, warmup=0, reps=1, device="cpu")
    results = run_step_bench(cfg, tmp_path, ["graphpool", "bench", "step"])
    rows = results["rows"]
    assert [r.batch_size for r in rows] == [1, 3]
    for r in rows:
        assert r.eager_ms > 0 and math.isnan(r.graph_ms) and math.isnan(r.compile_ms)
        assert r.floor_ms > 0 and r.notes  # says why graphs were skipped
    data = json.loads((tmp_path / "step.json").read_text())
    assert data["env"]["command"] == "graphpool bench step"
    assert len(data["results"]["rows"]) == 2
    assert (tmp_path / "step.png").stat().st_size > 1000
    assert "custom(h=32,L=2)" in (tmp_path / "step.md").read_text()
    # the whole engine's step at the engine sizes among the batch sizes (default 1, 8, 64: here bs 1 only)
    assert rows[0].engine_ms > 0 and rows[0].engine_async_ms > 0
    assert math.isnan(rows[1].engine_ms) and "engine async ms" in (tmp_path / "step.md").read_text()


@pytest.mark.parametrize("tied", [False, True])
def test_floor_counts_weights_once_and_the_kv_context(tied: bool) -> None:
    cfg = replace(TINY, tie_word_embeddings=tied)
    model = build_random_model(cfg, torch.device("cpu"), torch.float32, "torch", max_positions=64)
    setup = DecodeSetup.create(model, max_batch_size=4, context_len=20, block_size=8)
    emb = cfg.vocab_size * cfg.hidden_size
    # untied: the input embedding is read only at the batch's rows; tied: read whole by the logits
    expected = cfg.num_params if tied else cfg.num_params - emb + 3 * cfg.hidden_size
    assert setup.weight_bytes_read(3) == 4 * expected
    assert setup.kv_bytes_read(3) == 3 * 20 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4


def test_decode_setup_layout_is_the_engines() -> None:
    model = build_random_model(TINY, torch.device("cpu"), torch.float32, "torch", max_positions=64)
    s = DecodeSetup.create(model, max_batch_size=3, context_len=20, block_size=8)
    b = s.batch(2)
    assert b["block_tables"].dtype == torch.int32 and b["context_lens"].dtype == torch.int32
    assert b["block_tables"].tolist() == [[1, 2, 3], [4, 5, 6]]  # block 0 stays the reserved dummy
    assert b["positions"].tolist() == [19, 19] and b["context_lens"].tolist() == [20, 20]
    assert b["slot_mapping"].tolist() == [3 * 8 + 3, 6 * 8 + 3]  # last block, offset 19 % 8
    assert s.kv_caches[0][0].shape[0] == 1 + 3 * 3 and s.kv_caches[0][0].abs().sum() > 0  # random, not zeros
    with torch.inference_mode():
        logits = s.step_fn()(b)
        again = s.step_fn()(b)  # idempotent: rewrites the same KV slot with the same values
        engine_logits, greedy = s.head(s.engine_step_fn()(b))  # the engine's step: the same logits and their argmax
    assert logits.shape == (2, TINY.vocab_size) and torch.isfinite(logits).all()
    assert torch.equal(logits, again) and torch.equal(engine_logits, logits)
    assert greedy.dtype == torch.int64 and torch.equal(greedy, logits.argmax(-1))


def test_compile_setup_has_the_same_weights_cache_and_inputs_over_plain_torch_ops() -> None:
    from graphpool.bench.compile_step import plain_ops_setup
    from graphpool.model.llama import LlamaModel
    from graphpool.model.ops import kernel_ops
    from graphpool.model.weights import init_random_weights

    cfg = StepBenchConfig(models=(TINY,), batch_sizes=(1, 3), context_len=20, block_size=8, device="cpu")
    model = LlamaModel(TINY, max_positions=36, ops=kernel_ops())  # the Triton op set (torch refs on the CPU)
    init_random_weights(model, seed=0)
    setup = DecodeSetup.create(model.eval(), max_batch_size=3, context_len=20, block_size=8)
    plain = plain_ops_setup(TINY, torch.device("cpu"), torch.float32, cfg)
    assert model.attn_backend == "triton" and plain.model.attn_backend == "torch"
    for (name, a), (_, b) in zip(model.named_parameters(), plain.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    for (k1, v1), (k2, v2) in zip(setup.kv_caches, plain.kv_caches, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    for key, value in setup.inputs.items():
        assert torch.equal(value, plain.inputs[key]), key
    with torch.inference_mode():
        ours, theirs = setup.step_fn()(setup.batch(3)), plain.step_fn()(plain.batch(3))
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


def test_step_bench_runs_the_moe_preset_and_its_floor_reads_the_routed_experts(tmp_path: Path) -> None:
    """random:qwen3-moe-tiny (16 experts, top-4, 3 sparse layers): a step row per batch size; its floor reads
    at most bs * 4 experts of each sparse layer (all 16 from bs 4 on)."""
    cfg = StepBenchConfig(models=("random:qwen3-moe-tiny",), batch_sizes=(1, 4), context_len=20, warmup=0, reps=1,
                          device="cpu", engine_sizes=())
    rows = run_step_bench(cfg, tmp_path, ["graphpool", "bench", "step"])["rows"]
    assert [(r.model, r.batch_size) for r in rows] == [("qwen3-moe-tiny", 1), ("qwen3-moe-tiny", 4)]
    assert all(r.eager_ms > 0 and r.floor_ms > 0 for r in rows)
    moe = get_preset("qwen3-moe-tiny").moe
    assert moe is not None
    expert_bytes = 4 * 3 * 256 * moe.moe_intermediate_size  # fp32 gate, up and down of one expert
    embedding_rows = 4 * 256 * (4 - 1)  # the untied input embedding: 3 more rows
    assert rows[1].weight_bytes - rows[0].weight_bytes == 3 * (16 - 4) * expert_bytes + embedding_rows
