"""Model families on the GPU (Qwen3, Phi-3, Gemma 2, Gemma 3), float32: the engine's greedy tokens with decode through CUDA
graphs equal eager decode's and transformers', token for token, on the Triton kernels and the torch ops.

Tiny random transformers models at the families' real head shapes (Qwen3's head_dim 128 with q wider than the
hidden size; Phi-3-mini's head_dim 96, not a power of two; Gemma-3-1b's and Gemma-2-2b's head_dim 256 and
query_pre_attn_scalar; Gemma 2's soft caps, low enough to bend these weights' scores: the Triton decode kernel's
soft-capping variant and the prefill's), saved as safetensors folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_helpers import greedy_tokens, report, require

from model_reference import hf_greedy, tiny_hf_model

NEW_TOKENS = 24
MAX_MODEL_LEN = 128
PROMPT_LENS = [1, 3, 9, 17, 30, 45]  # one decode row each: batch 6 pads to a graph of another size
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3": {"hidden_size": 256, "head_dim": 128, "intermediate_size": 512},
    "phi3": {"hidden_size": 384, "intermediate_size": 512},
    "gemma3": {"hidden_size": 256, "head_dim": 256, "intermediate_size": 512, "query_pre_attn_scalar": 256},
    "gemma2": {"hidden_size": 256, "head_dim": 256, "intermediate_size": 512, "query_pre_attn_scalar": 256},
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, Path, list[list[int]], list[list[int]]]:
    """(kind, folder, prompts, transformers' float32 greedy continuations computed on the CPU)."""
    require("transformers")
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    hf = tiny_hf_model(kind, tied=kind.startswith("gemma"), **SHAPES[kind])
    hf.save_pretrained(folder, safe_serialization=True)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    return kind, folder, prompts, [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


def _generate(folder: Path, prompts: list[list[int]], **settings: Any) -> tuple[list[list[int]], Any]:
    return greedy_tokens(str(folder), prompts, NEW_TOKENS, MAX_MODEL_LEN, **settings)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_float32_greedy_through_graphs_equals_eager_and_transformers(family, backend: str) -> None:
    assert not torch.backends.cuda.matmul.allow_tf32
    kind, folder, prompts, refs = family
    graphs, stats = _generate(folder, prompts, attn_backend=backend)
    assert stats is not None and stats.hits + stats.padded_hits > 0, stats  # decode replayed graphs
    eager, eager_stats = _generate(folder, prompts, attn_backend=backend, disable_cudagraph=True)
    assert eager_stats is None  # no pool: every decode step ran eagerly
    report(f"{kind}_{backend}_fp32_sequences_equal_transformers",
           f"{sum(g == r for g, r in zip(graphs, refs, strict=True))}/{len(refs)}")
    for i, (g, e, r) in enumerate(zip(graphs, eager, refs, strict=True)):
        assert g == e, (kind, i, "graphs vs eager", g, e)
        assert g == r, (kind, i, "graphs vs transformers", g, r)
