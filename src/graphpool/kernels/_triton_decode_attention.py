"""Triton flash-decoding kernel for paged decode attention (imported lazily: triton is a GPU-only dependency).

Work split: the program grid is ``(bs, num_kv_heads, num_splits)``; each program reads one chunk of
``split_len`` context tokens of one (sequence, kv head) once and serves all ``group`` query heads that share
it, with an fp32 online softmax. A second small kernel merges the splits of each (sequence, query head)
with their log-sum-exp (`_triton_attention_merge.py`). ``split_len`` comes from host ints only (kv heads, the
length bound, the SM count), so the grid is fixed at capture time; it ignores the batch size, so results are
batch-invariant. Splits that start past a sequence's length exit at once and the merge reads only the splits
that hold tokens. With a single split the first kernel writes the output directly (bitwise what the merge of
one split gives). A soft cap (``softcap`` > 0, Gemma 2) bends each score inside the split kernel, before its
online softmax, so the merge is unchanged: it only combines the splits' log-sum-exps of capped scores. A
sliding window (``window`` > 0, a runtime int: one compiled kernel for every window) moves each row's first
token to ``ctx - window``: tiles before it are never loaded, splits wholly before it exit at once like those
past the end, and the merge reads only the splits between.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from graphpool.kernels._triton_attention_merge import _decode_merge_kernel
from graphpool.kernels.attention_grid import BLOCK_N, choose_num_stages, choose_split_len, device_num_sms
from graphpool.kernels.decode_attention import _check_inputs, check_softcap, check_window, effective_len_bound
from graphpool.kernels.pdl import pdl_on, pdl_trigger

LOG2E = math.log2(math.e)


@triton.jit
def _load_q(q_ptr, b, heads, offs_d, stride_qb, stride_qh, stride_qd, mask):
    """A (sequence, kv head)'s group of q rows ``[G, D]``; padded rows (g >= GROUP) are zeros: tl.dot needs at
    least 16 rows."""
    return tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd, mask=mask,
                   other=0.0)  # fmt: skip


@triton.jit
def _tanh(x):
    """tanh from exp2 of a non-positive argument: no overflow at any |x| (the interpreter has no libdevice)."""
    e = tl.exp2(-2.885390081777927 * tl.abs(x))  # exp(-2|x|)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _attend_split(
    q, k_ptr, v_ptr, bt_ptr, b, kvh, start, end, qk_scale, cap_log2,
    stride_kb, stride_ko, stride_kh, stride_kd, stride_vb, stride_vo, stride_vh, stride_vd, stride_btb, stride_bts,
    offs_n, offs_d, d_mask,
    BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
):  # fmt: skip
    """Context tokens [start, end) of one (sequence, kv head) for its group's q rows: the fp32 online softmax's
    (acc, running max, running sum). Scores in log2 units: ``dot * qk_scale``, or with SOFTCAP
    ``cap_log2 * tanh(dot * qk_scale)`` (qk_scale then holds scale / softcap)."""
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    kv_base_k = k_ptr + kvh * stride_kh
    kv_base_v = v_ptr + kvh * stride_vh
    for t0 in range(start, end, BLOCK_N):
        t = t0 + offs_n
        t_mask = t < end
        blk = tl.load(bt_ptr + b * stride_btb + (t // BLOCK_SIZE) * stride_bts, mask=t_mask, other=0)
        blk = blk.to(tl.int64)
        off = t % BLOCK_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(
            kv_base_k + blk[:, None] * stride_kb + off[:, None] * stride_ko + offs_d[None, :] * stride_kd,
            mask=kv_mask,
            other=0.0,
        )  # [N, D]
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [G, N]
        if SOFTCAP:
            qk = _tanh(qk) * cap_log2
        qk = tl.where(t_mask[None, :], qk, float("-inf"))
        # NOTE: every tile holds at least one valid token (t0 < end), so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            kv_base_v + blk[:, None] * stride_vb + off[:, None] * stride_vo + offs_d[None, :] * stride_vd,
            mask=kv_mask,
            other=0.0,
        )  # [N, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _store_partial(po_ptr, plse_ptr, acc, m_i, l_i, b, heads, split, stride_pob, stride_poh, stride_pos, stride_lb,
                   stride_lh, offs_d, out_mask, g_mask):  # fmt: skip
    """One split's normalized partial output and its log2-sum-exp, for the merge."""
    tl.store(
        po_ptr + b * stride_pob + heads[:, None] * stride_poh + split * stride_pos + offs_d[None, :],
        acc / l_i[:, None],
        mask=out_mask,
    )
    tl.store(plse_ptr + b * stride_lb + heads * stride_lh + split, m_i + tl.log2(l_i), mask=g_mask)


# NOTE: no variant per alignment of the step's metadata views (docs/kernels.md, "One compile per variant")
@triton.jit(do_not_specialize_on_alignment=["bt_ptr", "lens_ptr"])
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, po_ptr, plse_ptr,
    qk_scale, cap_log2, split_len, window,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_btb, stride_bts,
    stride_ob, stride_oh,
    stride_pob, stride_poh, stride_pos,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr, PDL_TRIGGER: tl.constexpr,
):  # fmt: skip
    pdl_trigger(PDL_TRIGGER)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    # NOTE: the window's first position (0 without one); the tiles before it are skipped, not masked
    first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)
    end = tl.minimum(split * split_len + split_len, ctx)
    start = tl.maximum(split * split_len, first)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    if not DIRECT:  # noqa: SIM102 (a constexpr test, resolved at compile time)
        # NOTE: an empty split (past the end or before the window) writes nothing; the merge never reads it.
        if start >= end:
            return
    q = _load_q(q_ptr, b, heads, offs_d, stride_qb, stride_qh, stride_qd, g_mask[:, None] & d_mask[None, :])
    acc, m_i, l_i = _attend_split(
        q, k_ptr, v_ptr, bt_ptr, b, kvh, start, end, qk_scale, cap_log2,
        stride_kb, stride_ko, stride_kh, stride_kd, stride_vb, stride_vo, stride_vh, stride_vd, stride_btb,
        stride_bts, offs_n, offs_d, d_mask, BLOCK_SIZE, BLOCK_G, BLOCK_D, BLOCK_N, DOT_PRECISION, SOFTCAP,
    )  # fmt: skip
    out_mask = g_mask[:, None] & d_mask[None, :]
    if DIRECT:
        # NOTE: a row with no context (l_i == 0) yields zeros, as the reference does.
        res = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
            res.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:
        _store_partial(po_ptr, plse_ptr, acc, m_i, l_i, b, heads, split, stride_pob, stride_poh, stride_pos,
                       stride_lb, stride_lh, offs_d, out_mask, g_mask)  # fmt: skip


def paged_decode_attention_triton(
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
    split_len: int | None = None,
    block_n: int = BLOCK_N,
    num_warps: int = 4,
    num_stages: int | None = None,
    pdl: bool = True,
    attn_stages: bool = True,
) -> torch.Tensor:
    """Launch the split + merge kernels. The keyword knobs override the defaults (tests, benchmarks).
    `num_stages` None: `choose_num_stages`'s depth, or triton's default when `attn_stages` (the switch) is
    False. `pdl` (the switch): both kernels let a PDL-launched GEMV after them start early. `softcap` > 0
    compiles the soft-capping variant of the split kernel (0: the plain one, unchanged). `window` > 0: a
    sliding window of that many positions (0: the whole context)."""
    _check_inputs(q, k_cache, v_cache, block_tables, context_lens)
    check_softcap(softcap)
    check_window(window)
    bs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if k_cache.dtype != q.dtype:
        raise ValueError(f"the Triton kernel needs the cache in q's dtype: {k_cache.dtype} vs {q.dtype}")
    if out is None:
        out = torch.empty(bs, num_heads, head_dim, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a unit last stride")
    if bs == 0:
        return out

    bound = effective_len_bound(max_len_bound, block_tables.shape[1], block_size)
    if split_len is None:
        split_len = choose_split_len(num_kv_heads, bound, device_num_sms(q.device), block_n)
    elif split_len <= 0:
        raise ValueError(f"split_len must be positive, got {split_len}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    num_splits = -(-bound // split_len)
    direct = num_splits == 1
    # NOTE: scratch sized from host ints only, so this is capturable; a graph keeps it in its private pool.
    if direct:
        part_out = out
        part_lse = out
    else:
        part_out = torch.empty(bs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(bs, num_heads, num_splits, dtype=torch.float32, device=q.device)

    block_d = triton.next_power_of_2(head_dim)
    grid = (bs, num_kv_heads, num_splits)
    if num_stages is None and attn_stages:
        num_stages = choose_num_stages(math.prod(grid), device_num_sms(q.device))
    stages = {} if num_stages is None else {"num_stages": num_stages}
    pdl = pdl_on(q.device, pdl)
    _decode_split_kernel[grid](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        scale / softcap if softcap else scale * LOG2E, softcap * LOG2E, split_len, window,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2) if not direct else 0,
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, BLOCK_N=block_n,
        DIRECT=direct, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", SOFTCAP=softcap > 0,
        PDL_TRIGGER=pdl,
        num_warps=num_warps, **stages,
    )  # fmt: skip
    if not direct:
        _decode_merge_kernel[(bs, num_heads)](
            part_out, part_lse, context_lens, out,
            split_len, num_splits, window,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d, PDL_TRIGGER=pdl, num_warps=4,
        )  # fmt: skip
    return out
