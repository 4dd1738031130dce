"""Every family in bf16 on the GPU, teacher-forced, decode through CUDA graphs (a `GraphPool` over the engine's
decode step), on the Triton kernels and the torch ops: graphpool's next-token logits are no further from
transformers' float32 logits (computed on the CPU) than transformers' own bf16 logits on the GPU are
(tests/bf16_agreement.py has the criteria and why).

Tiny random transformers models at the families' real head shapes (Llama-3.2-1B's head_dim 64, Mistral-7B's
128, Phi-3-mini's 96, Qwen3's 128 with q wider than the hidden size, the Gemmas' 256 and query_pre_attn_scalar;
Gemma 2's attention soft cap 2, its final cap 10 so that enough positions keep a clear leader).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_helpers import report, require

from bf16_agreement import FAMILIES, check_agreement, hf_logits, teacher_forced_logits
from graphpool.model import load_model
from model_reference import tiny_hf_model

PROMPT, LENGTH = 40, 96  # within every test model's sliding window (128 for the Gemmas)
GEMMA = {"hidden_size": 256, "head_dim": 256, "intermediate_size": 512, "query_pre_attn_scalar": 256}
SHAPES: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 256, "intermediate_size": 512},
    "qwen2": {"hidden_size": 256, "intermediate_size": 512},
    "mistral": {"hidden_size": 512, "intermediate_size": 768},
    "phi3": {"hidden_size": 384, "intermediate_size": 512},
    "qwen3": {"hidden_size": 256, "head_dim": 128, "intermediate_size": 512},
    "gemma3": GEMMA,
    "gemma2": {**GEMMA, "final_logit_softcapping": 10.0},
    "smollm3": {"hidden_size": 256, "intermediate_size": 512},
    "olmo2": {"hidden_size": 256, "intermediate_size": 512},
    "granite": {"hidden_size": 256, "intermediate_size": 512},
}
assert set(SHAPES) == set(FAMILIES)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, Path, list[list[int]], torch.Tensor, torch.Tensor]:
    """(kind, folder, sequences, transformers' float32 logits on the CPU, its bf16 logits on the GPU)."""
    require("transformers")
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    hf = tiny_hf_model(kind, tied=kind.startswith("gemma"), **SHAPES[kind])
    hf.save_pretrained(folder, safe_serialization=True)
    seqs = torch.randint(3, 300, (4, LENGTH), generator=torch.Generator().manual_seed(5)).tolist()
    ref = hf_logits(hf, seqs, torch.float32)
    theirs = hf_logits(hf.cuda(), seqs, torch.bfloat16)
    hf.cpu()
    return kind, folder, seqs, ref, theirs


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_bf16_through_graphs_no_worse_than_transformers_bf16(family, backend: str) -> None:
    kind, folder, seqs, ref, theirs = family
    model, _, _ = load_model(folder, "cuda", torch.bfloat16, backend, max_positions=128)
    assert model.attn_backend == backend
    ours, stats = teacher_forced_logits(model, seqs, PROMPT)
    assert stats.captures >= 1 and stats.hits > 0, stats  # decode steps replayed a CUDA graph
    figures = check_agreement(ours, theirs, ref)
    report(f"{kind}_{backend}_bf16_vs_fp32", {k: round(v, 5) for k, v in figures.items()})
