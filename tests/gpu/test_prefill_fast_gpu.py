"""Fast prefill on the GPU: the one-call varlen prefill attention against the previous
per-sequence SDPA loop, in bf16 on CUDA, and the default model's prefill logits with either.

Tolerances: both run flash kernels on the same bf16 inputs with float32 accumulation, so they differ at most by
the kernels' tiling / split order plus the final bf16 rounding (one bf16 ulp is 2**-7 relative): the
attention outputs must agree within atol = rtol = 2e-2 and each must be within 2e-2 of a float32 reference;
the model's logits after 30 layers within atol 0.25 / rtol 0.05, with the same argmax wherever the top two
logits are more than 0.5 apart.
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import report
from test_prefill_fast import MIXED, loop_prefill_attention

from graphpool.model import attn_ops
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.attn_ops import prefill_attention, sdpa_prefill_attention
from graphpool.model.loader import load_model

# (query heads, KV heads, head dim): SmolLM2-135M, Qwen2.5-0.5B, Llama-3.2-1B, Llama-3-8B
SHAPES = [(9, 3, 64), (14, 2, 64), (32, 8, 64), (32, 8, 128)]


def _qkv(lens: list[int], hq: int, hkv: int, dim: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)
    # a fused projection's split, as in the model: rows strided by the whole qkv width
    qkv = torch.randn(total, (hq + 2 * hkv) * dim, generator=gen, device="cuda").to(dtype)
    q, k, v = qkv.split([hq * dim, hkv * dim, hkv * dim], dim=-1)
    return q.view(total, hq, dim), k.view(total, hkv, dim), v.view(total, hkv, dim)


def _reference_fp32(q, k, v, lens, scale):
    group = q.shape[1] // k.shape[1]
    outs, start = [], 0
    for n in lens:
        qs, ks, vs = (x[start:start + n].float().transpose(0, 1) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        s = (qs @ ks.transpose(1, 2)) * scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        outs.append((s.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs)


def test_the_varlen_path_is_taken_on_cuda_bf16() -> None:
    q, _, _ = _qkv([8], 9, 3, 64, torch.bfloat16)
    report("torch", torch.__version__)
    report("flash attention parameters", sorted(attn_ops.FLASH_PARAMS))
    assert attn_ops._varlen_usable(q)
    lens = [40, 7, 230]
    q, k, v = _qkv(lens, 9, 3, 64, torch.bfloat16)
    prefill_attention(q, k, v, lens, 0.125)  # warm
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        prefill_attention(q, k, v, lens, 0.125)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    report("kernels of one varlen prefill attention (3 prompts, GQA 9/3)", kernels)
    # NOTE: FA2 (flash_fwd*), not cuDNN: newer torch may route varlen to cuDNN, which plans every new length
    # on the host and refuses GQA
    assert any("flash" in name for name in kernels) and len(kernels) <= 4, kernels


@pytest.mark.parametrize(("hq", "hkv", "dim"), SHAPES)
@pytest.mark.parametrize("lens", [[40], MIXED, [1, 2, 300, 17]])
def test_varlen_prefill_attention_matches_the_previous_loop_in_bf16(lens, hq, hkv, dim) -> None:
    q, k, v = _qkv(lens, hq, hkv, dim, torch.bfloat16)
    scale = dim**-0.5
    with torch.inference_mode():
        new = prefill_attention(q, k, v, lens, scale)
        old = loop_prefill_attention(q, k, v, lens, scale)
        ref = _reference_fp32(q, k, v, lens, scale)
    assert new.shape == old.shape == (sum(lens), hq, dim) and new.dtype == torch.bfloat16
    diff = (new.float() - old.float()).abs().max().item()
    report(f"varlen vs loop max abs diff, lens {len(lens)} seqs, heads {hq}/{hkv}, dim {dim}", diff)
    torch.testing.assert_close(new.float(), old.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(new.float(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(old.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sdpa_fallback_matches_the_previous_loop_on_cuda(dtype) -> None:
    """The path float32 CUDA takes (and any torch without varlen): SDPA per sequence over one transposed copy."""
    q, k, v = _qkv(MIXED, 14, 2, 64, dtype)
    with torch.inference_mode():
        new = sdpa_prefill_attention(q, k, v, MIXED, 0.125)
        old = loop_prefill_attention(q, k, v, MIXED, 0.125)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(new.float(), old.float(), atol=tol, rtol=tol)


def test_default_model_prefill_logits_with_either_attention(default_gguf, monkeypatch) -> None:
    model, _, _ = load_model(default_gguf, "cuda", torch.bfloat16, "triton", max_positions=1024)
    lens = list(MIXED)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (sum(lens),), generator=gen, device="cuda")
    block = 16
    kv = model.allocate_kv_caches(-(-sum(lens) // block) + 1, block)
    meta = AttentionMetadata(
        is_prefill=True,
        positions=torch.cat([torch.arange(n, device="cuda") for n in lens]),
        slot_mapping=torch.arange(block, block + sum(lens), device="cuda"),
        seq_lens=lens,
    )
    ends = torch.tensor(lens, device="cuda").cumsum(0) - 1
    with torch.inference_mode():
        new = model.compute_logits(model(ids, meta, kv)[ends])
        monkeypatch.setattr("graphpool.model.llama.prefill_attention", loop_prefill_attention)
        old = model.compute_logits(model(ids, meta, kv)[ends])
    report("default model prefill logits max abs diff (varlen vs loop)", (new - old).abs().max().item())
    torch.testing.assert_close(new, old, atol=0.25, rtol=0.05)
    top2 = old.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.5
    assert torch.equal(new.argmax(-1)[clear], old.argmax(-1)[clear])
