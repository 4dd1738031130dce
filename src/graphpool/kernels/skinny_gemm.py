"""The model's linear layers: ``nn.functional.linear``, or a Triton kernel when the input has a few rows.

A decode step at batch size 1-4 multiplies a handful of rows by every weight once: bound by the weight's read,
where cuBLAS's tiles (made for larger M) leave bandwidth unused; `_triton_skinny_gemm` streams the weight
with many small programs. Used on CUDA for bf16/fp16 inputs with at most MAX_ROWS rows and a weight with unit
inner stride; everything else (prefill, larger batches, fp32, CPU) is ``nn.functional.linear``. fp32 stays
on cuBLAS on purpose: it is the dtype the exact-equality tests use, and the kernel sums in another order.
Numerics: fp32 accumulation, one rounding to the output dtype (a bias added before it), as cuBLAS does; the
order of the sums differs, so results agree with cuBLAS to a few output ulps, not bitwise.
"""

from __future__ import annotations

import torch
from torch import nn

from graphpool.kernels._dispatch import triton_impl
from graphpool.kernels.staging import staged_kernels_on

MAX_ROWS = 4
_DTYPES = (torch.bfloat16, torch.float16)


def uses_skinny_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` takes the Triton kernel for these operands (host-side facts only: capturable)."""
    return (
        x.is_cuda
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.stride(1) == 1
        and x.numel() // max(1, x.shape[-1]) <= MAX_ROWS
        and staged_kernels_on("skinny_gemm")
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``nn.functional.linear(x, weight, bias)``; on CUDA with at most MAX_ROWS rows, one Triton kernel."""
    if uses_skinny_kernel(x, weight) and x.shape[-1] == weight.shape[1]:
        impl = triton_impl("_triton_skinny_gemm")
        if impl is not None:
            return impl.skinny_linear_triton(x, weight, bias)
    return nn.functional.linear(x, weight, bias)
