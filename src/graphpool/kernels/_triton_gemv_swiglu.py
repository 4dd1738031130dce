"""The one-row gate/up projection and SwiGLU's ``silu(gate) * up`` in one kernel (the ``gemv_swiglu`` switch),
optionally of the RMSNorm of ``x + residual`` (the ``gemv_norm`` switch).

The one-row GEMV (`_triton_gemv.py`) with its four output features owned as two gate/up pairs: a program
computes gate features f, f + 1 and up features I + f, I + f + 1 (the GEMV's ``[4, BLOCK_K]`` tile and
reduction), rounds them to the activation dtype (the GEMV's output) and applies `silu_times_up` as the SwiGLU
kernel does. So the ``[1, 2I]`` gate/up row never reaches memory, and the step's SwiGLU kernel (one per layer)
is gone; with the norm folded in, the norm kernel before it too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphpool.kernels._triton_gemv import MAX_BLOCK_K, NUM_WARPS, _row, gemv_features
from graphpool.kernels._triton_silu_mul import silu_times_up
from graphpool.kernels.gemv import RowNorm, norm_args
from graphpool.kernels.pdl import pdl_on


@triton.jit
def _gemv_swiglu_kernel(
    x_ptr, w_ptr, y_ptr, r_ptr, s_ptr, nw_ptr, eps, stride_wn, INTER,
    K: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    f0 = tl.program_id(0) * 2
    j = tl.arange(0, 4)
    # NOTE: features j: gate f0, gate f0 + 1, up f0, up f0 + 1
    feat = f0 + j % 2
    offs_n = feat + (j // 2) * INTER
    n_mask = feat < INTER
    y = gemv_features(
        x_ptr, w_ptr, offs_n, n_mask, stride_wn, r_ptr, s_ptr, nw_ptr, eps, K, BLOCK_K, NORM, HAS_RESIDUAL, PDL
    )
    # NOTE: the GEMV's output rounding, then the SwiGLU kernel's fp32 activation and rounding
    y = y.to(y_ptr.dtype.element_ty).to(tl.float32)
    gate, up = tl.split(tl.permute(tl.reshape(y, (2, 2)), (1, 0)))
    out = silu_times_up(gate, up, y_ptr.dtype.element_ty, LIBDEVICE_EXP)
    offs = f0 + tl.arange(0, 2)
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=offs < INTER)


def gemv_swiglu_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm: RowNorm | None = None,
    stream: torch.Tensor | None = None,
    pdl: bool = True,
) -> torch.Tensor:
    """``x [1, K]`` and the gate/up weight ``[2I, K]`` (gate first) -> ``silu(gate) * up`` ``[1, I]``; `norm`:
    of the RMSNorm of ``x (+ norm.residual)`` instead of x, the sum stored in `stream` (K within one tile);
    `pdl`: as `gemv_triton`'s. The caller checks shapes (`gemv.linear_swiglu`)."""
    n, k = weight.shape
    inter = n // 2
    out = torch.empty(1, inter, dtype=x.dtype, device=x.device)
    pdl = pdl_on(x.device, pdl)
    x_row = _row(x, k)
    norm_ptrs, norm_flags = norm_args(norm, stream, x_row)
    if inter > 0:
        _gemv_swiglu_kernel[(triton.cdiv(inter, 2),)](
            x_row, weight, out, *norm_ptrs, weight.stride(0), inter,
            K=k, BLOCK_K=min(MAX_BLOCK_K, triton.next_power_of_2(k)), LIBDEVICE_EXP=not triton.knobs.runtime.interpret,
            PDL=pdl, **norm_flags,
            num_warps=NUM_WARPS, num_stages=1, launch_pdl=pdl,
        )  # fmt: skip
    return out
