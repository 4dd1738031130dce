"""Qwen3-MoE on the GPU. Float32: the engine's greedy tokens with decode through CUDA graphs equal eager
decode's and transformers' `generate`, token for token, on the Triton kernels and the torch ops, with decode
batches that gather their experts (one row) and that mask all experts (six rows). Bfloat16: a captured decode
step replays the eager step's logits (both expert forms), on the tiny preset and on two layers of
Qwen3-30B-A3B's real shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_helpers import report, require

from graphpool import LLM, SamplingParams
from graphpool.bench.common import capture_graph
from graphpool.bench.decode import DecodeSetup, build_random_model
from graphpool.model.loader import model_config
from graphpool.model.moe_ops import gathers
from model_reference import tiny_hf_model

NEW_TOKENS = 24
MAX_MODEL_LEN = 128
PROMPT_LENS = [1, 3, 9, 17, 30, 45]
# Qwen3's head_dim 128 with q wider than the hidden size; 16 experts, top-4: one row gathers, two or more mask
SHAPE = {"hidden_size": 256, "head_dim": 128, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 16, "num_experts_per_tok": 4, "eos_token_id": None}


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]], list[list[int]]]:
    """(folder, prompts, transformers' float32 greedy `generate` continuations computed on the CPU)."""
    require("transformers")
    folder = tmp_path_factory.mktemp("qwen3_moe")
    hf = tiny_hf_model("qwen3_moe", tied=False, **SHAPE)
    hf.save_pretrained(folder, safe_serialization=True)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    refs = []
    with torch.no_grad():
        for p in prompts:
            out = hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
            refs.append(out[0, len(p):].tolist())
    return folder, prompts, refs


def _generate(folder: Path, batches: list[list[list[int]]], **settings: Any) -> tuple[list[list[int]], Any]:
    """Greedy tokens of each batch of prompts (one `generate` call a batch), and the pool's stats."""
    llm = LLM(str(folder), device="cuda", dtype="float32", max_model_len=MAX_MODEL_LEN, num_kv_blocks=128,
              **settings)
    try:
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        tokens = [o.token_ids for batch in batches for o in llm.generate(batch, params, use_tqdm=False)]
        return tokens, llm.graph_stats()
    finally:
        llm.close()


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_float32_greedy_through_graphs_equals_eager_and_transformers(moe_folder, backend: str) -> None:
    assert not torch.backends.cuda.matmul.allow_tf32
    folder, prompts, refs = moe_folder
    assert gathers(1, 16, 4) and not gathers(2, 16, 4)
    batches = [prompts, prompts[-1:]]  # six rows decode with all experts masked; one row gathers its four
    want = refs + refs[-1:]
    graphs, stats = _generate(folder, batches, attn_backend=backend)
    assert stats is not None and stats.hits + stats.padded_hits > 0 and stats.captures >= 2, stats
    eager, eager_stats = _generate(folder, batches, attn_backend=backend, disable_cudagraph=True)
    assert eager_stats is None
    report(f"qwen3_moe_{backend}_fp32_sequences_equal_transformers",
           f"{sum(g == r for g, r in zip(graphs, want, strict=True))}/{len(want)}")
    for i, (g, e, r) in enumerate(zip(graphs, eager, want, strict=True)):
        assert g == e, (i, "graphs vs eager", g, e)
        assert g == r, (i, "graphs vs transformers", g, r)


@pytest.mark.parametrize("preset", ["qwen3-moe-tiny", "qwen3-30b-a3b?layers=2"])
def test_bfloat16_graph_replays_the_eager_step(preset: str) -> None:
    cfg = model_config(f"random:{preset}")
    model = build_random_model(cfg, torch.device("cuda"), torch.bfloat16, "auto", max_positions=256)
    setup = DecodeSetup.create(model, max_batch_size=64, context_len=200)
    assert cfg.moe is not None
    for bs in (1, 8, 64):
        inputs = setup.batch(bs)
        step = setup.step_fn()
        with torch.inference_mode():
            eager = step(inputs).float()
            graph, out, _ = capture_graph(lambda inputs=inputs, step=step: step(inputs))
            graph.replay()
            torch.cuda.synchronize()
            got = out.float()
        rel = ((got - eager).norm() / eager.norm()).item()
        report(f"{preset}_bf16_bs{bs}_graph_rel_err(gathers={gathers(bs, cfg.moe.num_experts, cfg.moe.num_experts_per_tok)})",
               f"{rel:.2e}")
        assert torch.isfinite(got).all() and rel < 5e-3, (bs, rel)
        torch.testing.assert_close(got, eager, atol=5e-2, rtol=5e-2)
        assert (got.argmax(-1) == eager.argmax(-1)).float().mean() > 0.95
        del graph
    del model, setup
    torch.cuda.empty_cache()
