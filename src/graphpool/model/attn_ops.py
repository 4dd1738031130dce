"""Attention over the paged KV cache: prefill attention, torch decode attention (cache writes:
`graphpool.kernels.norm_rope.write_kv_ref`).

KV cache per layer: `[num_blocks, block_size, num_kv_heads, head_dim]`; flat slot = block * block_size + offset.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from graphpool.kernels.decode_attention import effective_len_bound

# NOTE: no cuDNN: it plans every new sequence length on the host (docs/benchmarks.md); math is the fallback.
_PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float
) -> torch.Tensor:
    """Causal attention within each contiguous sequence. q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D].

    Uses SDPA (flash / memory-efficient kernels on the GPU, so memory is linear in the sequence length).
    """
    group = q.shape[1] // k.shape[1]
    outs = []
    start = 0
    with sdpa_kernel(_PREFILL_BACKENDS):
        for n in seq_lens:
            # [1, H, n, D]
            qs = q[start : start + n].transpose(0, 1).unsqueeze(0)
            ks = k[start : start + n].transpose(0, 1).unsqueeze(0)
            vs = v[start : start + n].transpose(0, 1).unsqueeze(0)
            if group > 1:
                # NOTE: explicit repeat rather than enable_gqa so the flash kernel is eligible on every version.
                ks = ks.repeat_interleave(group, dim=1)
                vs = vs.repeat_interleave(group, dim=1)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
            outs.append(o.squeeze(0).transpose(0, 1))
            start += n
    if start != q.shape[0]:
        raise ValueError(f"prefill seq_lens sum to {start}, but the batch has {q.shape[0]} tokens")
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_len_bound: int,
) -> torch.Tensor:
    """One query token per sequence over its paged context. q [bs, Hq, D] -> [bs, Hq, D].

    Graph-capturable: reads ceil(max_len_bound / block_size) blocks of every row and masks positions
    >= context_lens; no host sync, shapes depend only on host ints. Every row needs context_lens >= 1.

    NOTE: not `graphpool.kernels.decode_attention.paged_decode_attention_ref`: that reference upcasts the
    gathered K/V to float32 (exact, twice the bytes); this backend keeps the matmuls in the cache dtype.
    """
    bs, num_heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    # NOTE: the kernels' bound convention (<= 0: the whole block table), so both backends read the same blocks.
    num_blocks = -(-effective_len_bound(max_len_bound, block_tables.shape[1], block_size) // block_size)
    length = num_blocks * block_size
    ids = block_tables[:, :num_blocks].reshape(-1)
    # [bs, kv_heads, length, D]
    k = k_cache.index_select(0, ids).view(bs, length, kv_heads, dim).transpose(1, 2)
    v = v_cache.index_select(0, ids).view(bs, length, kv_heads, dim).transpose(1, 2)
    qg = q.view(bs, kv_heads, num_heads // kv_heads, dim)  # [bs, kv_heads, group, D]
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * scale  # [bs, kv_heads, group, length]
    pos = torch.arange(length, device=q.device)
    valid = pos.unsqueeze(0) < context_lens.unsqueeze(1)  # [bs, length]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).view(bs, num_heads, dim)
