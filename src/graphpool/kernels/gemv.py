"""The model's linear layers: ``nn.functional.linear``, or a Triton GEMV when the input is one row.

A decode step at batch size 1 multiplies one row by every weight once: bound by the weight's read, where
cuBLAS's tiles (made for larger M) leave bandwidth unused. On the H200 (session 20, `python -m
graphpool.bench.gemm_kernel`: 16 layers of a model's projections with their norm and SwiGLU kernels, each
fed by the one before, one CUDA graph) llama3.2-1b's took 816 us with cuBLAS and 652 us with this kernel
launched with programmatic dependent launch (`kernels/pdl.py`), against a floor of 458 us for the weights'
bytes; llama3-8b's 2038 and 1848 us (floor 1642). The whole decode step at batch size 1 (`bench step`, graph
replay): 1B 1.16 -> 0.934 ms, 8B 4.74 -> 4.30 ms. Used on CUDA for a bf16/fp16 input of one
row and a weight with unit inner stride; everything else (prefill, larger batches, fp32, CPU) is
``nn.functional.linear``. fp32 stays on cuBLAS on purpose: it is the dtype of the exact-equality tests, and
the kernel sums in another order. Numerics: fp32 accumulation, one rounding to the output dtype (a bias
added before it), as cuBLAS; the order of the sums differs, so results agree with cuBLAS to a rounding or
two, not bitwise. ``GRAPHPOOL_KERNELS_OFF=gemv`` turns it off.
"""

from __future__ import annotations

import torch
from torch import nn

from graphpool.kernels._dispatch import triton_impl
from graphpool.kernels.staging import kernel_on, staged_kernels_on

_DTYPES = (torch.bfloat16, torch.float16)


def uses_gemv(x: torch.Tensor, weight: torch.Tensor, in_features: int | None = None) -> bool:
    """Whether `linear` takes the Triton GEMV for these operands (host-side facts only: capturable);
    `in_features`: the weight's, when x's row is wider (the gate/up row of `fused_silu_linear`)."""
    return (
        x.is_cuda
        and x.numel() == x.shape[-1]
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.shape[1] == (x.shape[-1] if in_features is None else in_features)
        and weight.stride(1) == 1
        and kernel_on("gemv")
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``nn.functional.linear(x, weight, bias)``; on CUDA with one input row, one Triton GEMV."""
    if uses_gemv(x, weight):
        impl = triton_impl("_triton_gemv")
        if impl is not None:
            return impl.gemv_triton(x, weight, bias)
    return nn.functional.linear(x, weight, bias)


def fused_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Staged (``GRAPHPOOL_STAGED_KERNELS=norm_gemv``; passes its GPU tests, does not pay on the H200:
    docs/kernels.md): ``linear(rms_norm(x + residual), weight, bias)`` and the residual stream after the add
    (``x`` itself when `residual` is None) in one kernel, where `linear` would take the GEMV; None otherwise
    (the caller runs the norm, then `linear`)."""
    if (
        staged_kernels_on("norm_gemv")  # NOTE: first: off by default, asked by every layer every step
        and uses_gemv(x, weight)
        and norm_weight.dtype == x.dtype
        and (residual is None or (residual.dtype == x.dtype and residual.shape == x.shape))
    ):
        impl = triton_impl("_triton_gemv")
        if impl is not None:
            return impl.norm_gemv_triton(x, residual, norm_weight, eps, weight, bias)
    return None


def fused_silu_linear(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Staged (``GRAPHPOOL_STAGED_KERNELS=silu_gemv``; passes its GPU tests, does not pay on the H200):
    ``linear(silu_mul(gate_up), weight, bias)`` in one kernel that computes the SwiGLU of the columns it reads
    (the two kernels' bits), where `linear` would take the GEMV; None otherwise (the caller runs SwiGLU, then
    `linear`)."""
    half = gate_up.shape[-1] // 2
    if (
        staged_kernels_on("silu_gemv")  # NOTE: first, as in fused_norm_linear
        and gate_up.shape[-1] == 2 * half
        and uses_gemv(gate_up, weight, in_features=half)
    ):
        impl = triton_impl("_triton_gemv")
        if impl is not None:
            return impl.gemv_triton(gate_up, weight, bias, swiglu=True)
    return None


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
) -> torch.Tensor | None:
    """The qkv projection of one row, rotary on its q and k heads at ``positions[0]`` and k, v stored at
    ``slot_mapping[0]`` of the caches, in one kernel, where `linear` would take the GEMV; returns the qkv row
    (q, k rotated), or None (the caller runs `linear`, then rotary and the KV write). `heads`: (Hq, Hkv,
    head_dim). Bitwise the GEMV then the rotary kernel (both rotate with `_triton_norm_rope.rotate_pair`);
    ``GRAPHPOOL_KERNELS_OFF=gemv_rope`` turns it off."""
    hq, hkv, dim = heads
    if (
        uses_gemv(x, weight)  # NOTE: first: a batch of 2+ rows fails its first test, before any environment read
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
        and kernel_on("gemv_rope")
    ):
        impl = triton_impl("_triton_gemv_rope")
        if impl is not None:
            return impl.gemv_rope_triton(
                x, weight, bias, positions, cos, sin, k_cache, v_cache, slot_mapping, heads
            )
    return None
