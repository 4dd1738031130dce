"""Triton kernels for ``w @ x (+ bias)`` with one input row (a decode step's projections at batch size 1) and
with two (batch size 2), whose programs load each weight tile once for both rows.

Each program owns BLOCK_N output features: it streams its ``[BLOCK_N, K]`` slice of the weight in ``[BLOCK_N,
BLOCK_K]`` tiles (one tile when K <= BLOCK_K: 1B's qkv, o and gate_up), keeps an fp32 partial product per
(feature, k lane), and reduces over the k lanes once at the end. Many small programs, each a contiguous
stream, keep enough bytes in flight where cuBLAS's tiles (made for larger M) leave bandwidth unused.

With ``pdl`` the kernel is launched with programmatic dependent launch: it may start while the kernel before
it is still running (once that one has called ``griddepcontrol.launch_dependents``, as graphpool's norm,
attention, SwiGLU and GEMV kernels do: `kernels/pdl.py`), loads its first weight tile (its whole slice when K
<= BLOCK_K; weights never depend on the previous kernel), and only then waits (``griddepcontrol.wait``: the
previous kernel complete, its writes visible) before it reads x. Everything earlier in the stream is complete
by then too, so the contract of a plain launch holds. With NORM, `gemv_features`' x is the RMSNorm of the
row (+ residual), computed by every program after the wait (`_triton_gemv_rope`, `_triton_gemv_swiglu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from graphpool.kernels._triton_norm_rope import residual_sum, rms_norm_row
from graphpool.kernels.pdl import pdl_on, pdl_trigger

# NOTE: the fastest of a sweep of tilings (docs/kernels.md): a whole K <= 2048 row slice is one tile, loaded
# before the PDL wait
BLOCK_N = 4  # output features per program: N / 4 programs (512 for a 2048-wide projection)
MAX_BLOCK_K = 2048  # weight columns per tile: 16 KB of bf16
NUM_WARPS = 4
NUM_STAGES = 1
MAX_ROWS = 2  # the few-row kernel's rows: at 3-4 rows it lost to cuBLAS on the 1B and 8B shapes (docs/kernels.md)


@dataclass(frozen=True)
class Tiles:
    """The launch's tiling (tests and benchmarks override it); block_k None: min(MAX_BLOCK_K, next_pow2(K))."""

    block_n: int = BLOCK_N
    block_k: int | None = None
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES


DEFAULT_TILES = Tiles()


@triton.jit
def normed_row(x_ptr, r_ptr, s_ptr, nw_ptr, eps, offs_k, k_mask, K: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """RMSNorm of the one row ``x (+ residual)`` as fp32 values of the activation dtype, `_rms_norm_kernel`'s own
    arithmetic (`residual_sum`, `rms_norm_row`); with a residual, program 0 stores the sum (the new stream) at
    `s_ptr`."""
    x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0)
    if HAS_RESIDUAL:
        x = residual_sum(x, tl.load(r_ptr + offs_k, mask=k_mask, other=0.0))
        tl.store(s_ptr + offs_k, x, mask=k_mask & (tl.program_id(0) == 0))
    y = rms_norm_row(x, nw_ptr, offs_k, k_mask, K, eps)
    return y.to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def gemv_features(
    x_ptr, w_ptr, offs_n, n_mask, stride_wn, r_ptr, s_ptr, nw_ptr, eps,
    K: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The fp32 products of the one-row input with the weight rows `offs_n` (no bias, not rounded): the
    program's weight slice streamed in ``[len(offs_n), BLOCK_K]`` tiles, fp32 partials per k lane, one reduction;
    with PDL the first tile is loaded before the wait (and the next PDL launch let in first). With NORM (K
    within one tile) the input is the RMSNorm of the row (`normed_row`, its pointers r, s, nw and eps), which
    every program computes itself, so the norm needs no kernel of its own. `_gemv_kernel`, `_gemv_rope_kernel`
    and `_gemv_swiglu_kernel` call it."""
    pdl_trigger(PDL)
    offs_k = tl.arange(0, BLOCK_K)
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    k_mask = offs_k < K
    w = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if PDL:
        gdc_wait()  # NOTE: after the first weight tile's load, before the first read of x
    if NORM:
        x = normed_row(x_ptr, r_ptr, s_ptr, nw_ptr, eps, offs_k, k_mask, K, HAS_RESIDUAL)
    else:
        x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    acc = w.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    return tl.sum(acc, 1)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn,
    K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    y = gemv_features(x_ptr, w_ptr, offs_n, n_mask, stride_wn, x_ptr, x_ptr, x_ptr, 0.0, K, BLOCK_K, False, False, PDL)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _rows_tile(w, x_ptr, stride_xm, k, k_mask, acc0, acc1):
    """Both rows' products with one ``[BLOCK_N, BLOCK_K]`` weight tile, reduced over k and added to their
    accumulators (one tile, as at K <= BLOCK_K: the one-row kernel's very sums)."""
    wf = w.to(tl.float32)
    x = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
    acc0 += tl.sum(wf * x[None, :], 1)
    x = tl.load(x_ptr + stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
    acc1 += tl.sum(wf * x[None, :], 1)
    return acc0, acc1


@triton.jit
def _store_row(y_ptr, acc, bias, offs_n, n_mask, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += bias
    tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _gemv_rows_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn, stride_xm,
    K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """``y[m] = w @ x[m] (+ b)`` for two rows: each program's weight tiles are loaded once and multiplied by
    both rows (the first before the PDL wait); y is ``[2, N]``, contiguous."""
    pdl_trigger(PDL)
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    k_mask = offs_k < K
    w = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if PDL:
        gdc_wait()  # NOTE: after the first weight tile's load, before the first read of x
    acc0, acc1 = _rows_tile(w, x_ptr, stride_xm, offs_k, k_mask, acc0, acc1)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc0, acc1 = _rows_tile(w, x_ptr, stride_xm, k, k_mask, acc0, acc1)
    bias = tl.zeros([BLOCK_N], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    _store_row(y_ptr, acc0, bias, offs_n, n_mask, HAS_BIAS)
    _store_row(y_ptr + N, acc1, bias, offs_n, n_mask, HAS_BIAS)


def _row(x: torch.Tensor, k: int) -> torch.Tensor:
    row = x.reshape(k)
    return row if row.stride(0) == 1 else row.contiguous()


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    pdl: bool = True,
    tiles: Tiles = DEFAULT_TILES,
) -> torch.Tensor:
    """``x [..., K]`` holding one row or MAX_ROWS (two) rows -> ``[..., N]``; `pdl`: launched with PDL where
    the device has it (the ``pdl`` switch). The caller checks shapes (`gemv.linear`)."""
    n, k = weight.shape
    m = x.numel() // k if k > 0 else 0
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"the GEMV takes 1 to {MAX_ROWS} rows of {k}, got x of shape {tuple(x.shape)}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    pdl = pdl_on(x.device, pdl)
    block_k = tiles.block_k if tiles.block_k is not None else min(MAX_BLOCK_K, triton.next_power_of_2(k))
    if n > 0:
        grid = (triton.cdiv(n, tiles.block_n),)
        bias_arg = bias if bias is not None else weight
        if m == 1:
            _gemv_kernel[grid](
                _row(x, k), weight, bias_arg, out, n, weight.stride(0),
                K=k, BLOCK_N=tiles.block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, PDL=pdl,
                num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl,
            )  # fmt: skip
        else:
            rows = x.reshape(m, k)
            rows = rows if rows.stride(1) == 1 else rows.contiguous()
            _gemv_rows_kernel[grid](
                rows, weight, bias_arg, out, n, weight.stride(0), rows.stride(0),
                K=k, BLOCK_N=tiles.block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, PDL=pdl,
                num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl,
            )  # fmt: skip
    return out.view(*x.shape[:-1], n)
