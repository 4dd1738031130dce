"""Attention over the paged KV cache: prefill attention, torch decode attention (cache writes:
`graphpool.kernels.norm_rope.write_kv_ref`).

KV cache per layer: `[num_blocks, block_size, num_kv_heads, head_dim]`; flat slot = block * block_size + offset.
"""

from __future__ import annotations

import functools
from itertools import accumulate, pairwise

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from graphpool.kernels.decode_attention import (
    check_softcap,
    check_window,
    effective_len_bound,
    soft_cap,
    window_mask,
)

# NOTE: no cuDNN: it plans every new sequence length on the host (docs/benchmarks.md); math is the fallback.
_PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# NOTE: the flash kernel itself, not torch.nn.attention.varlen: that wrapper is a custom op whose import and
# first call pull in torch._dynamo and sympy (seconds of start-up) for an autograd path inference never takes.
_FLASH = getattr(torch.ops.aten, "_flash_attention_forward", None)
FLASH_PARAMS = frozenset(a.name for a in _FLASH.default._schema.arguments) if _FLASH is not None else frozenset()


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float, softcap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention within each contiguous sequence. q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D].

    On CUDA in fp16/bf16: one varlen flash call for the whole batch (aten's `_flash_attention_forward`), GQA
    in the kernel. Elsewhere SDPA per sequence over views of one transposed copy of the batch (flash /
    memory-efficient kernels on the GPU, so memory is linear in the sequence length). `softcap` > 0 (Gemma 2's
    soft-capped scores, which neither SDPA nor varlen take): `tiled_prefill_attention`. `window` > 0: a
    sliding window, the query at position p attending to positions max(0, p - window + 1) .. p only: flash's
    window sizes where it takes them, else `tiled_prefill_attention` (its tiles skip the keys before the window).
    """
    total = sum(seq_lens)
    if total != q.shape[0]:
        raise ValueError(f"prefill seq_lens sum to {total}, but the batch has {q.shape[0]} tokens")
    check_softcap(softcap)
    check_window(window)
    varlen = _varlen_usable(q)
    if softcap or (window and not (varlen and "window_size_left" in FLASH_PARAMS)):
        return tiled_prefill_attention(q, k, v, seq_lens, scale, softcap, window)
    if varlen:
        return varlen_prefill_attention(q, k, v, seq_lens, scale, window)
    return sdpa_prefill_attention(q, k, v, seq_lens, scale)


def sdpa_prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float
) -> torch.Tensor:
    """`prefill_attention` by SDPA, one call per sequence (every device)."""
    group = q.shape[1] // k.shape[1]
    gqa = group > 1 and q.device.type == "cpu"
    if group > 1 and not gqa:
        # NOTE: explicit repeat rather than enable_gqa so the flash kernel is eligible on every version;
        # once for the batch, not per sequence.
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    # [1, H, T, D]: SDPA's flash / efficient kernels take 4-d inputs only
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    with sdpa_kernel(_PREFILL_BACKENDS):
        if len(seq_lens) == 1:
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            o = torch.cat([
                F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)
                for qs, ks, vs in zip(qt.split(seq_lens, 2), kt.split(seq_lens, 2), vt.split(seq_lens, 2),
                                      strict=True)
            ], dim=2)
    return o[0].transpose(0, 1)


# NOTE: bounds one score tile of tiled_prefill_attention (fp32: 256 MiB), whatever the prompt's length
_TILE_SCORES = 1 << 26


def tiled_prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float, softcap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """`prefill_attention` in plain matmuls (every device), for soft-capped scores or a sliding window: per
    sequence, tiles of query rows against the keys from their first row's window start (0 without a window)
    up to their last row, scores and softmax in float32."""
    _, num_heads, dim = q.shape
    kv_heads = k.shape[1]
    group = num_heads // kv_heads
    out = torch.empty_like(q)
    start = 0
    for n in seq_lens:
        qs = q[start:start + n].view(n, kv_heads, group, dim).permute(1, 2, 0, 3)  # [Hkv, G, n, D]
        ks = k[start:start + n].transpose(0, 1).unsqueeze(1)  # [Hkv, 1, n, D]
        vs = v[start:start + n].transpose(0, 1).unsqueeze(1)
        # NOTE: with a window, rows <= window keeps a tile's keys under 2 * window, its scores bounded too
        rows = max(1, _TILE_SCORES // (num_heads * (min(n, 2 * window) if window else n)))
        rows = min(rows, window) if window else rows
        for lo in range(0, n, rows):
            hi = min(n, lo + rows)
            first = max(0, lo - window + 1) if window else 0  # the tile's keys: [first, hi)
            scores = soft_cap(torch.matmul(qs[:, :, lo:hi], ks[:, :, first:hi].transpose(-1, -2)).float() * scale,
                              softcap)
            key = torch.arange(first, hi, device=q.device)[None, :]
            query = torch.arange(lo, hi, device=q.device)[:, None]
            hidden = (key > query) | (key <= query - window) if window else key > query
            probs = torch.softmax(scores.masked_fill_(hidden, float("-inf")), dim=-1).to(v.dtype)
            o = torch.matmul(probs, vs[:, :, first:hi])  # [Hkv, G, rows, D]
            out[start + lo:start + hi] = o.permute(2, 0, 1, 3).reshape(hi - lo, num_heads, dim)
        start += n
    return out


def varlen_prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float, window: int = 0
) -> torch.Tensor:
    """`prefill_attention` as one varlen flash call for the whole batch (CUDA, fp16/bf16), GQA in the kernel;
    `window` > 0 needs a torch whose flash kernel takes window sizes."""
    if _FLASH is None:
        raise RuntimeError(f"torch {torch.__version__} has no flash attention kernel")
    kwargs: dict[str, object] = {"scale": scale}
    if window:
        if "window_size_left" not in FLASH_PARAMS:
            raise ValueError(f"torch {torch.__version__}'s flash attention takes no window size")
        # flash's (left, right) count keys besides the query's own; causal already makes right 0
        kwargs.update(window_size_left=window - 1, window_size_right=0)
    cu = _cu_seqlens(tuple(seq_lens), q.device)
    longest = max(seq_lens)
    out, *_ = _FLASH(q, k, v, cu, cu, longest, longest, 0.0, True, False, **kwargs)
    return out


def _varlen_usable(q: torch.Tensor) -> bool:
    if "scale" not in FLASH_PARAMS or not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        return False
    return _sm80_or_newer(q.device.index if q.device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=8)
def _sm80_or_newer(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 0)


@functools.lru_cache(maxsize=4)
def _cu_seqlens(seq_lens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # NOTE: every layer of a step asks for the same lengths: one host-to-device copy a step, not one a layer.
    # Never written to (read-only input of the kernel), so sharing it is safe.
    return torch.tensor([0, *accumulate(seq_lens)], dtype=torch.int32, device=device)


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
    softcap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """One query token per sequence over its paged context. q [bs, Hq, D] -> [bs, Hq, D]; `softcap` > 0
    soft-caps the scaled scores (0: off); `window` > 0 attends to the last `window` positions only (0: all).

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
        return _padded_attention(q, k_cache, v_cache, block_tables, context_lens, scale, -(-bound // block_size),
                                 softcap, window)
    order, groups = cpu_row_groups(context_lens.tolist(), block_size, bound)
    if len(groups) == 1:
        return _padded_attention(q, k_cache, v_cache, block_tables, context_lens, scale, groups[0][2], softcap,
                                 window)
    perm = torch.tensor(order, device=q.device)
    q, block_tables, context_lens = q[perm], block_tables[perm], context_lens[perm]
    parts = [_padded_attention(q[a:b], k_cache, v_cache, block_tables[a:b], context_lens[a:b], scale, nb, softcap,
                               window) for a, b, nb in groups]
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
    context_lens: torch.Tensor, scale: float, num_blocks: int, softcap: float = 0.0, window: int = 0,
) -> torch.Tensor:
    """The first `num_blocks` blocks of every row, positions >= context_lens (and, with a window, before
    context_lens - window) masked."""
    bs, num_heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    length = num_blocks * block_size
    ids = block_tables[:, :num_blocks].reshape(-1)
    # [bs, kv_heads, length, D]
    k = k_cache.index_select(0, ids).view(bs, length, kv_heads, dim).transpose(1, 2)
    v = v_cache.index_select(0, ids).view(bs, length, kv_heads, dim).transpose(1, 2)
    qg = q.view(bs, kv_heads, num_heads // kv_heads, dim)  # [bs, kv_heads, group, D]
    pos = torch.arange(length, device=q.device)
    valid = window_mask(pos, context_lens, window)  # [bs, length]
    if q.device.type == "cpu" and not softcap:
        # NOTE: a query head group as SDPA's rows: torch's fused CPU kernel beats the matmuls below, most in
        # bfloat16 (docs/benchmarks.md, "4-bit weights on the CPU")
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=valid[:, None, None, :], scale=scale)
        return out.reshape(bs, num_heads, dim)
    scores = soft_cap(torch.matmul(qg, k.transpose(-1, -2)).float() * scale, softcap)  # [bs, kv_heads, group, length]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).view(bs, num_heads, dim)
