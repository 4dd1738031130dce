"""Triton kernel for ``x @ w.T (+ bias)`` when x has a handful of rows (a decode step at batch size 1-4).

At those sizes a linear layer is a matrix-vector product bound by reading the weight once; cuBLAS picks
tiles made for larger M (on the H200, 5.2 us for a 12 MB projection whose read takes 3). Here each program
owns BLOCK_N output features of every row: it streams its ``[BLOCK_N, K]`` slice of the weight in
``[BLOCK_N, BLOCK_K]`` tiles (pipelined by ``num_stages``), keeps an fp32 partial product per (row, feature,
k lane), and reduces over the k lanes once at the end. Many small programs, each a contiguous stream, keep
enough bytes in flight to reach the copy bandwidth where a few large tiles cannot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 8  # output features per program: N / 8 programs (256 for a 2048-wide projection)
MAX_BLOCK_K = 512  # weight columns per tile: 8 KB of bf16 per stage
NUM_WARPS = 8
NUM_STAGES = 4


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, stride_xm, stride_wn, stride_ym,
    K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + k[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
    y = tl.sum(acc, 2)  # [BLOCK_M, BLOCK_N]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
        y.to(y_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


def skinny_linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block_n: int = BLOCK_N,
    block_k: int | None = None,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> torch.Tensor:
    """``x [..., K]`` (at most a few rows in all) -> ``[..., N]``; the keywords override the tiles (tests,
    benchmarks). The caller checks shapes (`skinny_gemm.linear`)."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if block_k is None:
        block_k = min(MAX_BLOCK_K, triton.next_power_of_2(k))
    if rows > 0 and n > 0:
        _skinny_gemm_kernel[(triton.cdiv(n, block_n),)](
            x2, weight, bias if bias is not None else weight, out, rows, n,
            x2.stride(0), weight.stride(0), out.stride(0),
            K=k, BLOCK_M=triton.next_power_of_2(rows), BLOCK_N=block_n, BLOCK_K=block_k,
            HAS_BIAS=bias is not None, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
    return out.view(*x.shape[:-1], n)
