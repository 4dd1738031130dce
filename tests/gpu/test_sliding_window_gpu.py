"""Sliding windows on the GPU, float32: the engine's greedy tokens past the window (decode through CUDA graphs,
eager decode, chunked prefill resuming over the paged cache) equal transformers' eager attention's, token for
token, on the Triton kernels and the torch ops; and the window's attention ops in bf16 (varlen flash's
window_size, the Triton kernel inside a captured graph) against their float32 references.

Tiny random transformers models at real head shapes with windows of 16-24 positions: Mistral (every layer, head_dim 128),
Gemma 3 (its local layers, head_dim 256), Gemma 2 (every other layer, soft-capped scores), Phi-3 (head_dim 96).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_helpers import greedy_tokens, report, require

from graphpool.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from graphpool.model.attn_ops import prefill_attention, tiled_prefill_attention
from model_reference import hf_greedy, tiny_hf_model

NEW_TOKENS = 40
PROMPT_LENS = [3, 17, 30, 61]  # shorter than, near and far past the windows
SHAPES: dict[str, dict[str, Any]] = {
    "mistral": {"hidden_size": 256, "head_dim": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
                "sliding_window": 16},
    "gemma3": {"hidden_size": 256, "head_dim": 256, "intermediate_size": 512, "query_pre_attn_scalar": 256,
               "sliding_window": 24},
    "gemma2": {"hidden_size": 256, "head_dim": 256, "intermediate_size": 512, "query_pre_attn_scalar": 256,
               "sliding_window": 20},
    "phi3": {"hidden_size": 384, "intermediate_size": 512, "sliding_window": 18},
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, Path, list[list[int]], list[list[int]]]:
    """(kind, folder, prompts, transformers' eager float32 greedy continuations computed on the CPU)."""
    require("transformers")
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    hf = tiny_hf_model(kind, tied=kind.startswith("gemma"), **SHAPES[kind])
    hf.set_attn_implementation("eager")
    hf.save_pretrained(folder, safe_serialization=True)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    return kind, folder, prompts, [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


def _generate(folder: Path, prompts: list[list[int]], **settings: Any) -> tuple[list[list[int]], Any]:
    return greedy_tokens(str(folder), prompts, NEW_TOKENS, 256, **settings)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_float32_greedy_past_the_window_through_graphs_equals_eager_and_transformers(family, backend: str) -> None:
    assert not torch.backends.cuda.matmul.allow_tf32
    kind, folder, prompts, refs = family
    graphs, stats = _generate(folder, prompts, attn_backend=backend)
    assert stats is not None and stats.hits + stats.padded_hits > 0, stats  # decode replayed graphs
    eager, _ = _generate(folder, prompts, attn_backend=backend, disable_cudagraph=True)
    chunked, _ = _generate(folder, prompts, attn_backend=backend, max_num_batched_tokens=16)
    report(f"{kind}_{backend}_window_sequences_equal_transformers",
           f"{sum(g == r for g, r in zip(graphs, refs, strict=True))}/{len(refs)}")
    for i, (g, e, c, r) in enumerate(zip(graphs, eager, chunked, refs, strict=True)):
        assert g == e, (kind, i, "graphs vs eager", g, e)
        assert g == r, (kind, i, "graphs vs transformers", g, r)
        assert c == r, (kind, i, "chunked prefill vs transformers", c, r)


@pytest.mark.parametrize("window", [1, 33, 500])
def test_bf16_prefill_window_equals_the_float32_tiles(window: int) -> None:
    """The bf16 prefill (varlen flash with window_size where torch has it) against float32 tiles."""
    gen = torch.Generator(device="cuda").manual_seed(window)
    lens = [700, 5, 129]
    q, k, v = (torch.randn(sum(lens), h, 128, device="cuda", generator=gen) for h in (8, 2, 2))
    want = tiled_prefill_attention(q, k, v, lens, 128**-0.5, window=window)
    got = prefill_attention(*(x.bfloat16() for x in (q, k, v)), lens, 128**-0.5, window=window)
    err = float((got.float() - want).norm() / want.norm())
    report(f"bf16_prefill_window_{window}_rel_err", f"{err:.2e}")
    assert err < 2e-2
    full = tiled_prefill_attention(q, k, v, lens, 128**-0.5)
    assert (full - want).abs().max() > 0.05  # the window moved the long rows


@pytest.mark.parametrize("window", [16, 300])
def test_triton_window_in_a_captured_graph_equals_the_reference(window: int) -> None:
    """The Triton kernel with a window, captured once and replayed after the lengths change (no host syncs),
    equals the float32 reference; bf16, a bound of 4096 (many splits, most before the window)."""
    gen = torch.Generator(device="cuda").manual_seed(window)
    bs, hq, hkv, dim, block = 4, 16, 4, 128, 16
    blocks_per_row = 4096 // block
    k, v = (torch.randn(1 + bs * blocks_per_row, block, hkv, dim, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    q = torch.randn(bs, hq, dim, device="cuda", generator=gen).bfloat16()
    tables = (1 + torch.randperm(bs * blocks_per_row, device="cuda", generator=gen)).view(bs, -1).int()
    lens = torch.tensor([4096, 1, 700, 2000], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def run() -> None:
        paged_decode_attention(q, k, v, tables, lens, dim**-0.5, 4096, window=window, out=out)

    run()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for new in ([4096, 1, 700, 2000], [17, 4000, 300, 16]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = paged_decode_attention_ref(q, k, v, tables, lens, dim**-0.5, 4096, window=window)
        torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
