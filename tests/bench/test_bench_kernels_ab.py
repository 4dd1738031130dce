"""`graphpool bench kernels` on the CPU: both settings timed in alternating rounds, the engine's step too, the
reports written, bad names refused; A's model shares B's weights with the switched-off op set. (On the CPU the
switches change nothing, so B's outputs equal A's; the GPU test runs it where they do.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphpool.bench.kernels_ab import KernelsABConfig, run_kernels_bench, with_kernels_off
from graphpool.model.config import ModelConfig
from graphpool.model.llama import LlamaModel
from graphpool.model.ops import argmax_torch
from graphpool.model.weights import init_random_weights

TINY = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8)


def test_kernels_bench_cpu_path_runs_and_writes_reports(tmp_path: Path) -> None:
    cfg = KernelsABConfig(models=(TINY,), batch_sizes=(1, 3), engine_sizes=(1,), off=("gemv", "gemv_rope"),
                          context_len=20, rounds=2, reps=2, warmup=0, device="cpu")
    rows = run_kernels_bench(cfg, tmp_path, ["graphpool", "bench", "kernels"])["rows"]
    assert [r.batch_size for r in rows] == [1, 3]
    for r in rows:
        assert r.ms["A"] > 0 and r.ms["B"] > 0 and r.b_over_a > 0 and r.floor_ms > 0
        assert r.argmax_agree == 1.0 and r.logits_rel_err == 0.0  # the switches change nothing on the CPU
    assert rows[0].engine_ms["A"] > 0 and rows[0].engine_ms["B"] > 0 and not rows[1].engine_ms
    md = (tmp_path / "kernels.md").read_text()
    assert "A: `--disable-kernels gemv,gemv_rope`; B: the defaults" in md and "A engine ms" in md
    assert len(json.loads((tmp_path / "kernels.json").read_text())["results"]["rows"]) == 2
    assert (tmp_path / "kernels.png").stat().st_size > 1000


def test_the_a_model_shares_the_weights_with_its_switches_off() -> None:
    model = LlamaModel(TINY, max_positions=32)
    init_random_weights(model, seed=0)
    twin = with_kernels_off(model, ("step_argmax",))
    assert twin.ops.step_argmax is argmax_torch and model.ops.step_argmax is not argmax_torch
    mine, theirs = dict(model.named_parameters()), dict(twin.named_parameters())
    assert mine.keys() == theirs.keys()
    assert all(theirs[k].data_ptr() == p.data_ptr() for k, p in mine.items())  # shared, not copied
    assert torch.equal(twin.rotary.cos, model.rotary.cos)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(off=("gemm",)), "--off gemm: not one of"),
    (dict(off=("argmax",)), "--off argmax: not one of"),
    (dict(off=()), "A and B are the same"),
    (dict(engine_sizes=(2,)), "engine sizes among them"),
    (dict(rounds=0), "rounds, reps"),
])  # fmt: skip
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KernelsABConfig(**kwargs)
