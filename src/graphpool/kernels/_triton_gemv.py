"""Triton kernel for ``w @ x (+ bias)`` with one input row: a decode step's projections at batch size 1.

Each program owns BLOCK_N output features: it streams its ``[BLOCK_N, K]`` slice of the weight in
``[BLOCK_N, BLOCK_K]`` tiles (pipelined by ``num_stages``), keeps an fp32 partial product per (feature,
k lane), and reduces over the k lanes once at the end. Many small programs, each a contiguous stream, keep
enough bytes in flight where cuBLAS's tiles (made for larger M) leave bandwidth unused.

With ``pdl`` the kernel is launched with programmatic dependent launch: it may start while the kernel before
it is still running (once that one has called ``griddepcontrol.launch_dependents``, as graphpool's norm,
attention and SwiGLU kernels do: `kernels/pdl.py`), loads its first weight tile (weights never depend on
the previous kernel), and only then waits (``griddepcontrol.wait``: the previous kernel complete, its writes
visible) before it reads x. Everything earlier in the stream is complete by then too, so the contract of
a plain launch holds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from graphpool.kernels.pdl import pdl_trigger

BLOCK_N = 8  # output features per program: N / 8 programs (256 for a 2048-wide projection)
MAX_BLOCK_K = 1024  # weight columns per tile: 16 KB of bf16 per stage
NUM_WARPS = 8
NUM_STAGES = 3


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn,
    K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
    PDL_TRIGGER: tl.constexpr,
):  # fmt: skip
    pdl_trigger(PDL_TRIGGER)
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    k_mask = offs_k < K
    w = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if PDL:
        gdc_wait()  # NOTE: after the first weight tile's load, before the first read of x
    x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0)
    acc = w.to(tl.float32) * x.to(tl.float32)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptr + k, mask=k_mask, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    pdl: bool = False,
    trigger: bool = False,
    block_n: int = BLOCK_N,
    block_k: int | None = None,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> torch.Tensor:
    """``x [..., K]`` holding one row -> ``[..., N]``; `trigger`: let a PDL-launched kernel after this one
    start (the staged PDL chain); the other keywords override the tiles (tests, benchmarks). The caller checks
    shapes (`gemv.linear`)."""
    n, k = weight.shape
    row = x.reshape(k)
    if row.stride(0) != 1:
        row = row.contiguous()
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    if block_k is None:
        block_k = min(MAX_BLOCK_K, triton.next_power_of_2(k))
    if n > 0:
        _gemv_kernel[(triton.cdiv(n, block_n),)](
            row, weight, bias if bias is not None else weight, out, n, weight.stride(0),
            K=k, BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, PDL=pdl, PDL_TRIGGER=trigger,
            num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl,
        )  # fmt: skip
    return out.view(*x.shape[:-1], n)
