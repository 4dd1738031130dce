"""The one-row qkv projection, rotary and the KV-cache write in one kernel (the ``gemv_rope`` switch).

The one-row GEMV (`_triton_gemv.py`) with its output features owned in rotary pairs: a program computes 2
pairs ``(d, d + D/2)`` of one head (4 features, the GEMV's tiling), so the neox rotation of its outputs needs
nothing from another program. It rounds each product to the activation dtype (the GEMV's output), rotates q
and k heads in fp32 as the rotary kernel does (`_triton_norm_rope.rotate_pair`, the same helper), rounds
again, stores the whole qkv row, and stores k and v at the token's flat slot of the caches. So the decode
step's rotary kernel (one per layer) is gone, and the attention reads q from the returned row. With NORM the
input is the RMSNorm of the row (+ residual), computed in every program (`gemv_features` with NORM): the norm
kernel before it is gone too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphpool.kernels._triton_gemv import MAX_BLOCK_K, NUM_WARPS, _row, gemv_features
from graphpool.kernels._triton_norm_rope import rotate_pair
from graphpool.kernels.gemv import RowNorm, norm_args
from graphpool.kernels.pdl import pdl_on


# NOTE: no variant per alignment of the step's metadata views (docs/kernels.md, "One compile per variant")
@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def _gemv_rope_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, kc_ptr, vc_ptr, r_ptr, s_ptr, nw_ptr, eps,
    stride_wn, stride_cos, stride_sin, stride_kcb, stride_kco, stride_kch, stride_vcb, stride_vco, stride_vch,
    K: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    half: tl.constexpr = HEAD_DIM // 2
    pid = tl.program_id(0)
    head = pid // (half // 2)
    d0 = (pid % (half // 2)) * 2
    j = tl.arange(0, 4)
    # NOTE: features j = (half index) * 2 + pair: d0, d0 + 1, d0 + D/2, d0 + D/2 + 1 of the head
    offs_n = head * HEAD_DIM + d0 + (j % 2) + (j // 2) * half
    y = gemv_features(
        x_ptr, w_ptr, offs_n, offs_n >= 0, stride_wn, r_ptr, s_ptr, nw_ptr, eps, K, BLOCK_K, NORM, HAS_RESIDUAL, PDL
    )
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n).to(tl.float32)
    # NOTE: the GEMV's output rounding, then the rotary kernel's fp32 rotation and rounding
    y = y.to(y_ptr.dtype.element_ty).to(tl.float32)
    x1, x2 = tl.split(tl.permute(tl.reshape(y, (2, 2)), (1, 0)))
    pos = tl.load(pos_ptr).to(tl.int64)
    c = tl.load(cos_ptr + pos * stride_cos + d0 + tl.arange(0, 2)).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_sin + d0 + tl.arange(0, 2)).to(tl.float32)
    r1, r2 = rotate_pair(x1, x2, c, s)
    o1, o2 = r1.to(y_ptr.dtype.element_ty).to(tl.float32), r2.to(y_ptr.dtype.element_ty).to(tl.float32)
    rotated = tl.reshape(tl.permute(tl.join(o1, o2), (1, 0)), (4,))
    out = tl.where(head < HQ + HKV, rotated, y).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_n, out)
    if head >= HQ:
        slot = tl.load(slot_ptr).to(tl.int64)
        blk = slot // BLOCK_SIZE
        off = slot % BLOCK_SIZE
        d = offs_n - head * HEAD_DIM
        if head < HQ + HKV:
            tl.store(kc_ptr + blk * stride_kcb + off * stride_kco + (head - HQ) * stride_kch + d,
                     out.to(kc_ptr.dtype.element_ty))  # fmt: skip
        else:
            tl.store(vc_ptr + blk * stride_vcb + off * stride_vco + (head - HQ - HKV) * stride_vch + d,
                     out.to(vc_ptr.dtype.element_ty))  # fmt: skip


def gemv_rope_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    heads: tuple[int, int, int],
    *,
    norm: RowNorm | None = None,
    stream: torch.Tensor | None = None,
    pdl: bool = True,
) -> torch.Tensor:
    """``x [1, K]`` -> the qkv row ``[1, (Hq + 2 Hkv) * D]`` with q and k rotated at ``positions[0]``, and
    k, v stored at ``slot_mapping[0]`` of the caches ``[num_blocks, block_size, Hkv, D]``; `heads`: (Hq, Hkv,
    D); `norm`: project the RMSNorm of ``x (+ norm.residual)`` instead of x, the sum stored in `stream` (K
    within one tile); `pdl`: as `gemv_triton`'s. The caller checks shapes (`gemv.fused_linear_rope`)."""
    hq, hkv, dim = heads
    n, k = weight.shape
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    pdl = pdl_on(x.device, pdl)
    x_row = _row(x, k)
    norm_ptrs, norm_flags = norm_args(norm, stream, x_row)
    _gemv_rope_kernel[(n // 4,)](
        x_row, weight, bias if bias is not None else weight, out, positions, cos, sin, slot_mapping, k_cache,
        v_cache, *norm_ptrs, weight.stride(0), cos.stride(0), sin.stride(0),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        K=k, HQ=hq, HKV=hkv, HEAD_DIM=dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_K=min(MAX_BLOCK_K, triton.next_power_of_2(k)), HAS_BIAS=bias is not None, PDL=pdl,
        **norm_flags,
        num_warps=NUM_WARPS, num_stages=1, launch_pdl=pdl,
    )  # fmt: skip
    return out
