"""Triton kernel for ``x @ w.T (+ bias)`` with a few input rows (2 to MAX_ROWS): a decode step's projections
at small batch sizes.

The weight is the large operand and is read once; the rows are few. So the product is computed transposed
("swap AB"): each program owns BLOCK_N output features and computes ``w[n0:n0 + BLOCK_N, :] @ x.T`` as a
``[BLOCK_N, BLOCK_M]`` tile on the tensor cores (``tl.dot``; the rows padded with zeros to BLOCK_M >= 16,
the smallest tile ``tl.dot`` takes), streaming its weight slice in ``[BLOCK_N, BLOCK_K]`` tiles through
the software pipeline. The reduction over k is the tensor cores' (session 20's few-row GEMV reduced each
tile per row across warps and lost to cuBLAS), and the programs are as small as the tensor cores allow, so
there are many of them streaming at once (cuBLAS's tiles for these M are made for larger N per program).

With ``pdl`` the kernel is launched with programmatic dependent launch as the one-row GEMV is
(`_triton_gemv.py`, `kernels/pdl.py`): the first weight tile is loaded before ``griddepcontrol.wait``, the
rows after it.

Numerics: fp32 accumulation, one rounding to the output dtype (a bias added before it), as cuBLAS; the sums
run in another order, so results agree with cuBLAS to a rounding or two, not bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from graphpool.kernels._triton_decode_attention import merge_locks
from graphpool.kernels.pdl import LaunchFlags, launch_flags

MAX_ROWS = 64  # the rows one launch takes; the dispatcher's bound (kernels/gemv.py)
MIN_BLOCK_M = 16  # tl.dot's smallest tile


@dataclass(frozen=True)
class SkinnyTiles:
    """The launch's tiling (tests and benchmarks override it)."""

    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4
    # NOTE: split K until there are this many programs (0: never); the last of a block sums the partials
    programs: int = 0


DEFAULT_SKINNY_TILES = SkinnyTiles()


@triton.jit
def _skinny_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, locks_ptr, M, N, stride_xm, stride_wn, stride_ym,
    K: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    x_cols = x_ptr + offs_m[None, :] * stride_xm  # x.T: [BLOCK_K, BLOCK_M] tiles
    k_mask = offs_k < K
    w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if PDL:
        gdc_wait()  # NOTE: after the first weight tile's load, before the first read of x
    xt = tl.load(x_cols + offs_k[:, None], mask=k_mask[:, None] & m_mask[None, :], other=0.0)
    acc = tl.dot(w, xt)
    for k0 in range(BLOCK_K, K_SPLIT, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        xt = tl.load(x_cols + k[:, None], mask=k_mask[:, None] & m_mask[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
    out_mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K > 1:
        # NOTE: the fused attention merge's pattern (_triton_decode_attention): the barrier puts the program's
        # stores before its release; the last program of the block sums the partials in split order (the same
        # bits whichever finishes last), past L1 (other SMs wrote them), and puts the counter back to zero
        part = part_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.store(part + pid_k * M * N, acc, mask=out_mask)
        tl.debug_barrier()
        count = tl.atomic_add(locks_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if count == SPLIT_K - 1:
            tl.debug_barrier()
            acc = tl.load(part, mask=out_mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                acc += tl.load(part + s * M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            _store_rows(acc, b_ptr, y_ptr, offs_n, offs_m, n_mask, out_mask, stride_ym, HAS_BIAS)
            tl.store(locks_ptr + pid, 0)
    else:
        _store_rows(acc, b_ptr, y_ptr, offs_n, offs_m, n_mask, out_mask, stride_ym, HAS_BIAS)


@triton.jit
def _store_rows(acc, b_ptr, y_ptr, offs_n, offs_m, n_mask, out_mask, stride_ym, HAS_BIAS: tl.constexpr):
    """The output tile (acc is its transpose, fp32): the bias added, one rounding."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    tl.store(
        y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], acc.to(y_ptr.dtype.element_ty), mask=out_mask
    )


def skinny_gemm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    flags: LaunchFlags | None = None,
    tiles: SkinnyTiles = DEFAULT_SKINNY_TILES,
) -> torch.Tensor:
    """``x [..., K]`` holding 1 to MAX_ROWS rows -> ``[..., N]``; `flags`: PDL's (None: `pdl.launch_flags` of
    x's device; tests pass their own). The caller checks shapes (`gemv.linear`)."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    pdl = (flags if flags is not None else launch_flags(x.device)).pdl
    if n == 0 or m == 0:
        return out.view(*x.shape[:-1], n)
    blocks = triton.cdiv(n, tiles.block_n)
    block_k = min(tiles.block_k, max(16, triton.next_power_of_2(k)))
    split_k = max(1, min(triton.cdiv(tiles.programs, blocks), triton.cdiv(k, block_k)))
    locks = merge_locks(x.device, blocks) if split_k > 1 else None
    if locks is None:  # NOTE: no counters large enough during capture: one program along K
        split_k = 1
    k_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    part = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device) if split_k > 1 else out
    _skinny_kernel[(blocks, split_k)](
        rows, weight, bias if bias is not None else weight, out, part, locks if locks is not None else out, m, n,
        rows.stride(0), weight.stride(0), out.stride(0), K=k, K_SPLIT=k_split,
        BLOCK_M=max(MIN_BLOCK_M, triton.next_power_of_2(m)), BLOCK_N=tiles.block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, HAS_BIAS=bias is not None, PDL=pdl, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)
