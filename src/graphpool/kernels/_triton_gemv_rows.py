"""Triton kernel for ``x @ w.T (+ bias)`` with a few input rows (2 to `gemv.MAX_ROWS`): decode steps at batch sizes 2-8.

The one-row GEMV's design (`_triton_gemv`) with the weight tile shared by the rows: each program owns
BLOCK_N output features and streams its ``[BLOCK_N, K]`` weight slice once in ``[BLOCK_N, BLOCK_K]`` tiles;
for each row it multiplies the tile by that row's ``[BLOCK_K]`` slice (from the L2: every program reads all
rows) and reduces over k at once, into an fp32 ``[rows, BLOCK_N]`` accumulator (a ``[rows, BLOCK_N,
BLOCK_K]`` one, reduced at the end as the one-row kernel does, would not fit in registers). The weight is
read once for all rows, as cuBLAS reads it; the rows' reads grow with the row count (rows * BLOCK_K per tile
against the tile's BLOCK_N * BLOCK_K), which bounds where it pays. With ``pdl`` the first weight tile is
loaded before ``griddepcontrol.wait``, as in the one-row kernel.

Staged (``GRAPHPOOL_STAGED_KERNELS=gemv_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from graphpool.kernels.pdl import LaunchFlags, launch_flags, pdl_trigger


@dataclass(frozen=True)
class RowTiles:
    """The launch's tiling (tests and benchmarks override it); block_k None: min(max_block_k, next_pow2(K))."""

    block_n: int = 8
    max_block_k: int = 1024
    block_k: int | None = None
    num_warps: int = 4
    num_stages: int = 1


DEFAULT_ROW_TILES = RowTiles()


@triton.jit
def _rows_tile(acc, w, x_ptr, stride_xm, k, k_mask, offs_m, M: tl.constexpr):
    """acc [M_PAD, BLOCK_N] += each row's [BLOCK_K] slice times the weight tile, reduced over k."""
    wf = w.to(tl.float32)
    for m in tl.static_range(M):
        x = tl.load(x_ptr + m * stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
        part = tl.sum(wf * x[None, :], 1)
        acc += tl.where(offs_m[:, None] == m, part[None, :], 0.0)
    return acc


@triton.jit
def _gemv_rows_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn, stride_xm, stride_ym,
    K: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, PDL: tl.constexpr, PDL_TRIGGER: tl.constexpr,
):  # fmt: skip
    pdl_trigger(PDL_TRIGGER)
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, M_PAD)
    n_mask = offs_n < N
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    k_mask = offs_k < K
    w = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if PDL:
        gdc_wait()  # NOTE: after the first weight tile's load, before the first read of x
    acc = _rows_tile(tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32), w, x_ptr, stride_xm, offs_k, k_mask, offs_m, M)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc = _rows_tile(acc, w, x_ptr, stride_xm, k, k_mask, offs_m, M)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & n_mask[None, :])


def gemv_rows_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    flags: LaunchFlags | None = None,
    tiles: RowTiles = DEFAULT_ROW_TILES,
) -> torch.Tensor:
    """``x [M, K]`` (a few rows) -> ``[M, N]``; `flags`: PDL's (None: those of
    x's device). The caller checks shapes (`gemv.linear`)."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if flags is None:
        flags = launch_flags(x.device)
    block_k = tiles.block_k if tiles.block_k is not None else min(tiles.max_block_k, triton.next_power_of_2(k))
    if n > 0:
        _gemv_rows_kernel[(triton.cdiv(n, tiles.block_n),)](
            x, weight, bias if bias is not None else weight, out, n, weight.stride(0), x.stride(0), out.stride(0),
            K=k, M=m, M_PAD=triton.next_power_of_2(m), BLOCK_N=tiles.block_n, BLOCK_K=block_k,
            HAS_BIAS=bias is not None, PDL=flags.pdl, PDL_TRIGGER=flags.chain,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=flags.pdl,
        )  # fmt: skip
    return out
