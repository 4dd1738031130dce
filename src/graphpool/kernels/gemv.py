"""The model's linear layers: ``nn.functional.linear``, or a Triton GEMV when the input is one row or a few.

A decode step at batch size 1 multiplies one row by every weight once: bound by the weight's read, where
cuBLAS's tiles (made for larger M) leave bandwidth unused (docs/kernels.md has the measurements); at 2 to
``MAX_ROWS`` rows the few-row kernel reads each weight tile once for all of them. Used on CUDA for a bf16/fp16
input of up to that many rows and a weight with unit inner stride; everything else (prefill, larger
batches, fp32, CPU) is ``nn.functional.linear``. fp32 stays on cuBLAS on purpose: it is the dtype of the
exact-equality tests, and the kernel sums in another order. Numerics: fp32 accumulation, one rounding to the
output dtype (a bias added before it), as cuBLAS; the order of the sums differs, so results agree with cuBLAS
to a rounding or two, not bitwise. The ``gemv`` switch (`model.ops.kernel_ops`) leaves every projection to
``nn.functional.linear``; the ``gemv_rows`` switch (the `rows` argument) leaves 2+ rows to it; the ``pdl``
switch reaches the launch as the `pdl` argument.
"""

from __future__ import annotations

import torch
from torch import nn

from graphpool.kernels._dispatch import triton_impl

_DTYPES = (torch.bfloat16, torch.float16)
MAX_ROWS = 2  # as _triton_gemv.MAX_ROWS (that module imports triton; this one must not)


def uses_gemv(x: torch.Tensor, weight: torch.Tensor, max_rows: int = 1) -> bool:
    """Whether the Triton GEMV takes these operands, `x` holding at most `max_rows` rows (host-side facts
    only: capturable)."""
    return (
        x.is_cuda
        and x.dim() >= 1
        and 0 < x.numel() <= max_rows * x.shape[-1]
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.shape[1] == x.shape[-1]
        and weight.stride(1) == 1
    )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, pdl: bool = True, rows: bool = True
) -> torch.Tensor:
    """``nn.functional.linear(x, weight, bias)``; on CUDA with one input row (or up to MAX_ROWS, unless `rows`
    is False), one Triton GEMV (launched with PDL where the device has it, unless `pdl` is False)."""
    if uses_gemv(x, weight, MAX_ROWS if rows else 1):
        impl = triton_impl("_triton_gemv")
        if impl is not None:
            return impl.gemv_triton(x, weight, bias, pdl=pdl)
    return nn.functional.linear(x, weight, bias)


def fused_linear_rope(
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
    pdl: bool = True,
) -> torch.Tensor | None:
    """The qkv projection of one row, rotary on its q and k heads at ``positions[0]`` and k, v stored at
    ``slot_mapping[0]`` of the caches, in one kernel, where `linear` would take the GEMV; returns the qkv row
    (q, k rotated), or None (the caller runs `linear`, then rotary and the KV write). `heads`: (Hq, Hkv,
    head_dim). Bitwise the GEMV then the rotary kernel (both rotate with `_triton_norm_rope.rotate_pair`)."""
    hq, hkv, dim = heads
    if (
        uses_gemv(x, weight)  # NOTE: first: a batch of 2+ rows fails it
        and dim % 4 == 0
        and weight.shape[0] == (hq + 2 * hkv) * dim
        and positions.numel() == 1
        and slot_mapping.numel() == 1
        and cos.dtype == sin.dtype == torch.float32
        and cos.stride(-1) == 1
        and sin.stride(-1) == 1
        and k_cache.dtype == v_cache.dtype == x.dtype
        and k_cache.shape == v_cache.shape
        and k_cache.shape[2:] == (hkv, dim)
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
    ):
        impl = triton_impl("_triton_gemv_rope")
        if impl is not None:
            return impl.gemv_rope_triton(
                x, weight, bias, positions, cos, sin, k_cache, v_cache, slot_mapping, heads, pdl=pdl
            )
    return None
