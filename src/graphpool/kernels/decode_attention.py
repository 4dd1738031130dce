"""Paged decode attention: one query token per sequence against its paged KV cache.

Layout (docs/architecture.md): per layer ``k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]``;
sequence ``b`` owns blocks ``block_tables[b, :cdiv(context_lens[b], block_size)]``; token ``t`` of it lives at
``k_cache[block_tables[b, t // block_size], t % block_size]``. Block 0 is the dummy block of padded rows.

Both entry points are CUDA-graph capturable: no host syncs and no allocation whose size depends on tensor
values. ``max_len_bound`` is a host int (an upper bound of ``context_lens``) that fixes the work shape, so a
graph captured with a bound serves every batch whose lengths stay within it.

NOTE: ``context_lens[b] <= max_len_bound`` is the caller's contract (checking it would need a host sync);
tokens beyond the bound are ignored. ``max_len_bound <= 0`` means "the whole block table".

``softcap`` > 0 soft-caps the scaled scores before the softmax (Gemma 2's ``attn_logit_softcapping``):
``s = softcap * tanh(s / softcap)``; 0 leaves them as they are.

``window`` > 0 is a sliding window: the query at position ``p = context_lens[b] - 1`` attends to the keys at
positions ``max(0, p - window + 1) .. p`` only (``window`` keys with the current one, transformers'
``kv_idx > q_idx - sliding_window``); 0 attends to the whole context.
"""

from __future__ import annotations

import torch

from graphpool.kernels._dispatch import triton_impl


def effective_len_bound(max_len_bound: int, max_blocks: int, block_size: int) -> int:
    """The context-length bound actually used: ``max_len_bound`` clamped to what a block table can hold."""
    table_len = max_blocks * block_size
    if max_len_bound <= 0:
        return table_len
    return min(max_len_bound, table_len)


def soft_cap(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """``softcap * tanh(scores / softcap)``, or ``scores`` itself for ``softcap`` 0 (off)."""
    return torch.tanh(scores / softcap) * softcap if softcap else scores


def check_softcap(softcap: float) -> None:
    if not (softcap >= 0 and softcap != float("inf")):
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {softcap}")


def check_window(window: int) -> None:
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ValueError(f"window must be an int >= 0 (0: the whole context), got {window!r}")


def window_mask(pos: torch.Tensor, context_lens: torch.Tensor, window: int) -> torch.Tensor:
    """[bs, L] bool: positions `pos` [L] a row's query (at context_lens - 1) attends to: in its context and, with
    `window` > 0, within the last `window` positions."""
    lens = context_lens[:, None].long()
    valid = pos[None, :] < lens
    return valid & (pos[None, :] >= lens - window) if window else valid


def _check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    # NOTE: shape checks only (host metadata): never look at tensor values here.
    if q.dim() != 3:
        raise ValueError(f"q must be [bs, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    bs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"head_dim mismatch: q has {head_dim}, cache has {cache_head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if block_size & (block_size - 1) != 0:
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if block_tables.dim() != 2 or block_tables.shape[0] != bs:
        raise ValueError(f"block_tables must be [bs={bs}, max_blocks], got {tuple(block_tables.shape)}")
    if context_lens.shape != (bs,):
        raise ValueError(f"context_lens must be [bs={bs}], got {tuple(context_lens.shape)}")
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError(
            f"block_tables and context_lens must be int32, got {block_tables.dtype} and {context_lens.dtype}"
        )
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache dtypes differ: {k_cache.dtype} vs {v_cache.dtype}")


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_len_bound: int,
    softcap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """Plain-torch paged decode attention (gather + masked softmax in fp32). Returns ``[bs, Hq, D]`` in q's dtype."""
    _check_inputs(q, k_cache, v_cache, block_tables, context_lens)
    check_softcap(softcap)
    check_window(window)
    bs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    bound = effective_len_bound(max_len_bound, block_tables.shape[1], block_size)
    num_blocks = -(-bound // block_size)

    # NOTE: entries past a sequence's last block may be anything: clamped to stay in range, masked below.
    table = block_tables[:, :num_blocks].long().clamp_(0, k_cache.shape[0] - 1)  # [bs, nb]
    k = k_cache[table].reshape(bs, num_blocks * block_size, num_kv_heads, head_dim)[:, :bound]
    v = v_cache[table].reshape(bs, num_blocks * block_size, num_kv_heads, head_dim)[:, :bound]

    qf = q.float().view(bs, num_kv_heads, group, head_dim)  # [bs, Hkv, G, D]
    scores = soft_cap(torch.einsum("bhgd,blhd->bhgl", qf, k.float()) * scale, softcap)  # [bs, Hkv, G, L]
    pos = torch.arange(bound, device=q.device)
    valid = window_mask(pos, context_lens, window)  # [bs, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    # NOTE: a row with context_len <= 0 has no valid key; it yields zeros instead of NaN.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhgl,blhd->bhgd", probs, v.float())  # [bs, Hkv, G, D]
    return out.reshape(bs, num_heads, head_dim).to(q.dtype)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_len_bound: int,
    *,
    softcap: float = 0.0,
    window: int = 0,
    out: torch.Tensor | None = None,
    pdl: bool = True,
    attn_stages: bool = True,
) -> torch.Tensor:
    """Paged decode attention: the Triton flash-decoding kernel on CUDA, the torch reference elsewhere.

    q ``[bs, Hq, D]`` (bf16/fp16/fp32), caches ``[num_blocks, block_size, Hkv, D]``, block_tables
    ``[bs, max_blocks]`` int32, context_lens ``[bs]`` int32 (including the current token, already written).
    Returns ``[bs, Hq, D]`` in q's dtype (written into ``out`` when given). `softcap`: the scores' soft cap
    (0: off). `window`: the sliding window (0: the whole context). `pdl`, `attn_stages`: the kernel switches of those names.
    """
    impl = triton_impl("_triton_decode_attention") if q.is_cuda else None
    if impl is not None:
        return impl.paged_decode_attention_triton(
            q, k_cache, v_cache, block_tables, context_lens, scale, max_len_bound, softcap=softcap,
            window=window, out=out, pdl=pdl, attn_stages=attn_stages,
        )
    result = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale, max_len_bound,
                                        softcap, window)
    if out is None:
        return result
    out.copy_(result)
    return out
