"""The decode attention's merge (imported lazily with `_triton_decode_attention`: GPU only): a query head's
output from its splits' partial outputs and log2-sum-exps, the second kernel of a step's attention."""

from __future__ import annotations

import triton
import triton.language as tl

from graphpool.kernels.pdl import pdl_trigger


@triton.jit
def _merge_one_head(po_ptr, plse_ptr, out_ptr, b, h, first_valid, n_valid,
                    stride_pob, stride_poh, stride_pos, stride_lb, stride_lh, stride_ob, stride_oh,
                    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[b, h] from splits [first_valid, n_valid)'s partial outputs and log-sum-exps (one query head)."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = (offs_s >= first_valid) & (offs_s < n_valid)
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(plse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(s_mask, tl.exp2(lse - m), 0.0)  # [S]
    o = tl.load(
        po_ptr + b * stride_pob + h * stride_poh + offs_s[:, None] * stride_pos + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [S, D]
    denom = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0)
    res = tl.where(denom > 0, res / denom, 0.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, res.to(out_ptr.dtype.element_ty), mask=d_mask)


# NOTE: no variant per alignment of the step's metadata views (docs/kernels.md, "One compile per variant")
@triton.jit(do_not_specialize_on_alignment=["lens_ptr"])
def _decode_merge_kernel(
    po_ptr, plse_ptr, lens_ptr, out_ptr,
    split_len, num_splits, window,
    stride_pob, stride_poh, stride_pos,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL_TRIGGER: tl.constexpr,
):  # fmt: skip
    pdl_trigger(PDL_TRIGGER)
    b = tl.program_id(0)
    h = tl.program_id(1)
    ctx = tl.load(lens_ptr + b)
    n_valid = tl.minimum(tl.cdiv(ctx, split_len), num_splits)
    # NOTE: the splits wholly before a sliding window's first position wrote nothing
    first_valid = tl.where(window > 0, tl.maximum(ctx - window, 0) // split_len, 0)
    _merge_one_head(po_ptr, plse_ptr, out_ptr, b, h, first_valid, n_valid, stride_pob, stride_poh, stride_pos, stride_lb,
                    stride_lh, stride_ob, stride_oh, HEAD_DIM, BLOCK_S, BLOCK_D)

