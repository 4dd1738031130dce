"""Triton kernel for ``silu(gate) * up`` over the gate/up projection's output (imported lazily: GPU only).

Grid ``(rows, cdiv(I, BLOCK))``: each program reads BLOCK gate and BLOCK up values of one row and writes
BLOCK outputs, replacing torch's silu and multiply kernels (and the ``[T, I]`` silu intermediate's HBM round
trip) with one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from graphpool.kernels.pdl import pdl_on, pdl_trigger

MAX_BLOCK = 1024  # outputs per program; 8 per thread at 4 warps (16-byte loads in bf16)


@triton.jit
def silu_times_up(gate, up, dtype: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """``silu(gate) * up`` of fp32 tiles, in fp32, with silu rounded to `dtype` first (the product is rounded
    by the caller's store). NOTE: torch's op order and functions (expf, IEEE division; tl.exp and `/` are
    approximate in fp32), and silu rounded to the activation dtype before the product, as torch's two kernels
    do. The interpreter has no libdevice, so it runs tl.exp (numpy's exp there)."""
    e = libdevice.exp(-gate) if LIBDEVICE_EXP else tl.exp(-gate)
    silu = tl.math.div_rn(gate, 1.0 + e)
    return silu.to(dtype).to(tl.float32) * up


@triton.jit
def _silu_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, n_cols,
    BLOCK: tl.constexpr, LIBDEVICE_EXP: tl.constexpr, PDL_TRIGGER: tl.constexpr,
):  # fmt: skip
    pdl_trigger(PDL_TRIGGER)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    src = x_ptr + row * stride_x + cols
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + n_cols, mask=mask, other=0.0).to(tl.float32)
    y = silu_times_up(gate, up, out_ptr.dtype.element_ty, LIBDEVICE_EXP)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_triton(
    x: torch.Tensor, *, block: int | None = None, num_warps: int = 4, pdl: bool = True
) -> torch.Tensor:
    """``x [..., 2 * I]`` -> ``[..., I]``; ``block`` (a power of two) overrides the tile (tests); `pdl`: trigger
    a PDL-launched kernel after this one, where the device has PDL (the ``pdl`` switch)."""
    width = x.shape[-1]
    inter = width // 2
    x2 = x.reshape(-1, width)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)
    if block is None:
        block = min(MAX_BLOCK, triton.next_power_of_2(max(1, inter)))
    elif block <= 0 or block & (block - 1):
        raise ValueError(f"block must be a positive power of two, got {block}")
    rows = x2.shape[0]
    if rows > 0 and inter > 0:
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
            x2, out, x2.stride(0), out.stride(0), inter,
            BLOCK=block, LIBDEVICE_EXP=not triton.knobs.runtime.interpret, PDL_TRIGGER=pdl_on(x.device, pdl),
            num_warps=num_warps,
        )  # fmt: skip
    return out.view(*x.shape[:-1], inter)
