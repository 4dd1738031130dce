"""Triton kernel for ``w @ x (+ bias)`` with one input row: a decode step's projections at batch size 1.

Each program owns BLOCK_N output features: it streams its ``[BLOCK_N, K]`` slice of the weight in ``[BLOCK_N,
BLOCK_K]`` tiles (one tile when K <= BLOCK_K: 1B's qkv, o and gate_up), keeps an fp32 partial product per
(feature, k lane), and reduces over the k lanes once at the end. Many small programs, each a contiguous
stream, keep enough bytes in flight where cuBLAS's tiles (made for larger M) leave bandwidth unused.

With ``pdl`` the kernel is launched with programmatic dependent launch: it may start while the kernel before
it is still running (once that one has called ``griddepcontrol.launch_dependents``, as graphpool's norm,
attention and SwiGLU kernels do: `kernels/pdl.py`), loads its first weight tile (its whole slice when K <=
BLOCK_K; weights never depend on the previous kernel), and only then waits (``griddepcontrol.wait``: the
previous kernel complete, its writes visible) before it reads x. Everything earlier in the stream is complete
by then too, so the contract of a plain launch holds.

Staged (`norm_gemv_triton`; passes its GPU tests, no faster on the H200): an RMSNorm (after a residual add)
folded in front. The product's input is then ``g * s`` with ``s = x + residual``; each program sums ``s^2``
beside the product over its K loop and scales its outputs by ``rsqrt(mean(s^2) + eps)``, and program 0 stores
``s``. And (`gemv_triton(..., swiglu=True)`) SwiGLU folded in front: the input tile is ``silu(gate) * up`` of
the gate/up row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from graphpool.kernels._triton_silu_mul import silu_times_up
from graphpool.kernels.pdl import LaunchFlags, launch_flags, pdl_trigger

# NOTE: from a sweep of 12 tilings on the H200 (session 20, 16-layer chains with PDL, results/h200-session20):
# 4 features x 2048 columns, 4 warps, no software pipelining: 1B 652 -> 631 us, 8B 2006 -> 1841 us against
# the former 8 x 1024, 8 warps, 3 stages; a whole K <= 2048 row slice is one tile, loaded before the PDL wait
BLOCK_N = 4  # output features per program: N / 4 programs (512 for a 2048-wide projection)
MAX_BLOCK_K = 2048  # weight columns per tile: 16 KB of bf16
NUM_WARPS = 4
NUM_STAGES = 1


@dataclass(frozen=True)
class Tiles:
    """The launch's tiling (tests and benchmarks override it); block_k None: min(MAX_BLOCK_K, next_pow2(K))."""

    block_n: int = BLOCK_N
    block_k: int | None = None
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES


DEFAULT_TILES = Tiles()


@triton.jit
def _gemv_input(
    x_ptr, r_ptr, g_ptr, rout_ptr, k, k_mask, pid,
    K: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):  # fmt: skip
    """A tile of the product's input in fp32 (g * (x + residual) with the staged norm prologue; silu(gate) *
    up of the gate/up row with the staged SwiGLU prologue; else x) and of the row the norm's statistics come
    from. Program 0 stores the residual stream after the add."""
    if SWIGLU:
        # NOTE: the SwiGLU kernel's own code, roundings included: the product sees its bits
        gate = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + K + k, mask=k_mask, other=0.0).to(tl.float32)
        x = silu_times_up(gate, up, x_ptr.dtype.element_ty, LIBDEVICE_EXP).to(x_ptr.dtype.element_ty)
    else:
        x = tl.load(x_ptr + k, mask=k_mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + k, mask=k_mask, other=0.0)
        # NOTE: rounded to the activation dtype, as `x + residual` in torch is (and the RMSNorm kernel does).
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(rout_ptr + k, x, mask=k_mask & (pid == 0))
    s = x.to(tl.float32)
    if NORM:
        return s * tl.load(g_ptr + k, mask=k_mask, other=0.0).to(tl.float32), s
    return s, s


@triton.jit
def gemv_features(
    x_ptr, w_ptr, r_ptr, g_ptr, rout_ptr, eps, offs_n, n_mask, stride_wn, pid,
    K: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    SWIGLU: tl.constexpr, LIBDEVICE_EXP: tl.constexpr,
):  # fmt: skip
    """The fp32 products of the one-row input with the weight rows `offs_n` (no bias, not rounded): the
    program's weight slice streamed in ``[len(offs_n), BLOCK_K]`` tiles, fp32 partials per k lane, one reduction;
    with PDL the first tile is loaded before the wait. `_gemv_kernel` and the staged `_gemv_rope_kernel` call it."""
    offs_k = tl.arange(0, BLOCK_K)
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    k_mask = offs_k < K
    w = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if PDL:
        gdc_wait()  # NOTE: after the first weight tile's load, before the first read of x
    xin, s = _gemv_input(
        x_ptr, r_ptr, g_ptr, rout_ptr, offs_k, k_mask, pid, K, NORM, HAS_RESIDUAL, SWIGLU, LIBDEVICE_EXP
    )
    acc = w.to(tl.float32) * xin[None, :]
    ss = s * s
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        xin, s = _gemv_input(
            x_ptr, r_ptr, g_ptr, rout_ptr, k, k_mask, pid, K, NORM, HAS_RESIDUAL, SWIGLU, LIBDEVICE_EXP
        )
        acc += w.to(tl.float32) * xin[None, :]
        if NORM:
            ss += s * s
    y = tl.sum(acc, 1)
    if NORM:
        # NOTE: rms_norm(x) @ (g * w).T = rsqrt(mean(x^2) + eps) * (x * g) @ w.T: the scale is one scalar
        y = y * tl.rsqrt(tl.sum(ss, 0) / K + eps)
    return y


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn, r_ptr, g_ptr, rout_ptr, eps,
    K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
    PDL_TRIGGER: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):  # fmt: skip
    pdl_trigger(PDL_TRIGGER)
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    y = gemv_features(x_ptr, w_ptr, r_ptr, g_ptr, rout_ptr, eps, offs_n, n_mask, stride_wn, pid, K, BLOCK_K, PDL,
                      NORM, HAS_RESIDUAL, SWIGLU, LIBDEVICE_EXP)  # fmt: skip
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def _launch(
    row: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
    norm: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, float] | None,
    flags: LaunchFlags | None, tiles: Tiles, swiglu: bool = False,
) -> None:  # fmt: skip
    n, k = weight.shape
    if flags is None:
        flags = launch_flags(row.device)
    # NOTE: the GEMV is launched with PDL whenever PDL is on; it triggers its own dependents in the staged chain
    pdl, trigger = flags.pdl, flags.chain
    residual, g, rout, eps = norm if norm is not None else (None, row, row, 0.0)
    block_n = tiles.block_n
    block_k = tiles.block_k if tiles.block_k is not None else min(MAX_BLOCK_K, triton.next_power_of_2(k))
    if n > 0:
        _gemv_kernel[(triton.cdiv(n, block_n),)](
            row, weight, bias if bias is not None else weight, out, n, weight.stride(0),
            residual if residual is not None else row, g, rout, eps,
            K=k, BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, PDL=pdl, PDL_TRIGGER=trigger,
            NORM=norm is not None, HAS_RESIDUAL=residual is not None, SWIGLU=swiglu,
            LIBDEVICE_EXP=not triton.knobs.runtime.interpret,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl,
        )  # fmt: skip


def _row(x: torch.Tensor, k: int) -> torch.Tensor:
    row = x.reshape(k)
    return row if row.stride(0) == 1 else row.contiguous()


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    flags: LaunchFlags | None = None,
    tiles: Tiles = DEFAULT_TILES,
    swiglu: bool = False,
) -> torch.Tensor:
    """``x [..., K]`` holding one row -> ``[..., N]``; `flags`: PDL's (None: `pdl.launch_flags` of x's device;
    tests pass their own); `swiglu` (staged): x is a gate/up row
    ``[..., 2 * K]`` (gate first) and the product's input ``silu(gate) * up``, computed by each program for the
    columns it reads with `_silu_mul_kernel`'s roundings (so the two kernels' bits). The caller checks shapes
    (`gemv.linear`, `gemv.fused_silu_linear`)."""
    n, k = weight.shape
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    _launch(_row(x, 2 * k if swiglu else k), weight, bias, out, None, flags, tiles, swiglu)
    return out.view(*x.shape[:-1], n)


def norm_gemv_triton(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    flags: LaunchFlags | None = None,
    tiles: Tiles = DEFAULT_TILES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Staged: ``linear(rms_norm(x + residual), weight, bias)`` of one row in one kernel, and the residual
    stream after the add (``x`` itself without a residual). Every program reads the whole row anyway, so each
    computes the norm's statistics itself; the normalized row is never stored (nor rounded: it differs from
    the two kernels by that rounding). The caller checks shapes (`gemv.fused_norm_linear`)."""
    n, k = weight.shape
    row = _row(x, k)
    res = _row(residual, k) if residual is not None else None
    rout = torch.empty_like(row) if res is not None else row
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    _launch(row, weight, bias, out, (res, norm_weight.contiguous(), rout, eps), flags, tiles)
    return out.view(*x.shape[:-1], n), (rout.view(x.shape) if res is not None else x)
