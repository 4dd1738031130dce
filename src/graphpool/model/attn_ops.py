"""Attention over the paged KV cache: prefill attention, torch decode attention (cache writes:
`graphpool.kernels.norm_rope.write_kv_ref`).

KV cache per layer: `[num_blocks, block_size, num_kv_heads, head_dim]`; flat slot = block * block_size + offset.
"""

from __future__ import annotations

from itertools import pairwise

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


# NOTE (CPU only): splitting off one more group of rows costs the fixed op overhead of one more attention
# call, about what gathering ~1k context positions costs on a 2-core CPU; a group is split off only where it
# saves at least twice that, and only for rows under 3/4 of their group's longest context (a few groups).
_GROUP_MIN_SAVING = 2048
_GROUP_RATIO = 0.75


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

    On CUDA, graph-capturable: reads ceil(max_len_bound / block_size) blocks of every row and masks positions
    >= context_lens; no host sync, shapes depend only on host ints. On the CPU (no graphs, reading
    context_lens is free) rows are grouped by their real lengths (`cpu_row_groups`), each group reading the
    blocks of its longest context only, so rows of 100 positions next to one of 1,900 do not read 1,900 each.
    Every row needs context_lens >= 1.

    NOTE: not `graphpool.kernels.decode_attention.paged_decode_attention_ref`: that reference upcasts the
    gathered K/V to float32 (exact, twice the bytes); this backend keeps the matmuls in the cache dtype.
    """
    block_size = k_cache.shape[1]
    # NOTE: the kernels' bound convention (<= 0: the whole block table), so both backends read the same blocks.
    bound = effective_len_bound(max_len_bound, block_tables.shape[1], block_size)
    if q.device.type != "cpu":
        return _padded_attention(q, k_cache, v_cache, block_tables, context_lens, scale, -(-bound // block_size))
    order, groups = cpu_row_groups(context_lens.tolist(), block_size, bound)
    if len(groups) == 1:
        return _padded_attention(q, k_cache, v_cache, block_tables, context_lens, scale, groups[0][2])
    perm = torch.tensor(order, device=q.device)
    q, block_tables, context_lens = q[perm], block_tables[perm], context_lens[perm]
    parts = [_padded_attention(q[a:b], k_cache, v_cache, block_tables[a:b], context_lens[a:b], scale, nb)
             for a, b, nb in groups]
    out = torch.empty_like(q)
    out[perm] = torch.cat(parts)
    return out


def cpu_row_groups(lens: list[int], block_size: int, bound: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Rows by context length, longest first -> (that order, groups (start, end, blocks to read) of it).

    A group reads the blocks of its longest row, at most ceil(bound / block_size) of them and at least one.
    """
    order = sorted(range(len(lens)), key=lambda i: -lens[i])
    cuts = [0]
    top = lens[order[0]]
    for j in range(1, len(order)):
        n = lens[order[j]]
        if n <= top * _GROUP_RATIO and (top - n) * (len(order) - j) >= _GROUP_MIN_SAVING:
            cuts.append(j)
            top = n
    cuts.append(len(order))
    max_blocks = -(-bound // block_size)
    groups = [(a, b, min(max_blocks, max(1, -(-lens[order[a]] // block_size)))) for a, b in pairwise(cuts)]
    return order, groups


def _padded_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, num_blocks: int,
) -> torch.Tensor:
    """The first `num_blocks` blocks of every row, positions >= context_lens masked."""
    bs, num_heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
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
