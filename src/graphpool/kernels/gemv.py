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

from typing import NamedTuple

import torch
from torch import nn

from graphpool.kernels._dispatch import triton_impl

_DTYPES = (torch.bfloat16, torch.float16)
MAX_ROWS = 2  # as _triton_gemv.MAX_ROWS (that module imports triton; this one must not)
MAX_NORM_K = 2048  # _triton_gemv.MAX_BLOCK_K: a folded norm needs the whole row in the one weight tile


class RowNorm(NamedTuple):
    """The RMSNorm a fused GEMV folds in: it projects ``rms_norm(x + residual) * weight`` (x alone where
    `residual` is None), as `norm_rope.add_rms_norm` then the GEMV would."""

    residual: torch.Tensor | None
    weight: torch.Tensor
    eps: float


def _norm_folds(x: torch.Tensor, norm: RowNorm | None, fold_norm: bool) -> bool:
    """Whether a fused GEMV can take `norm` (none asked, or the ``gemv_norm`` switch on and the norm folding
    into its one-row input `x`; host-side facts only: capturable)."""
    if norm is None:
        return True
    k = x.shape[-1]
    r = norm.residual
    return (
        fold_norm
        and k <= MAX_NORM_K
        and norm.weight.shape == (k,)
        and norm.weight.stride(0) == 1
        and norm.weight.device == x.device
        and (r is None or (r.shape == x.shape and r.dtype == x.dtype and r.is_contiguous()))
    )


def norm_args(
    norm: RowNorm | None, stream: torch.Tensor | None, x_row: torch.Tensor
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float], dict[str, bool]]:
    """The fused kernels' norm arguments (residual row, stream row, norm weight, eps; `x_row` standing in for
    each one absent: a compiled-out branch never reads it) and their NORM and HAS_RESIDUAL constexprs."""
    if norm is None:
        return (x_row, x_row, x_row, 0.0), {"NORM": False, "HAS_RESIDUAL": False}
    r_row = norm.residual.reshape(-1) if norm.residual is not None else x_row
    s_row = stream.reshape(-1) if stream is not None else x_row
    return (r_row, s_row, norm.weight, norm.eps), {"NORM": True, "HAS_RESIDUAL": norm.residual is not None}


def _stream_of(x: torch.Tensor, norm: RowNorm | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the buffer a fused call stores ``x + residual`` in, None where there is no residual; the stream the
    call returns: that sum, else x itself)."""
    if norm is None or norm.residual is None:
        return None, x
    stream = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return stream, stream


def uses_gemv(x: torch.Tensor, weight: torch.Tensor, max_rows: int = 1) -> bool:
    """Whether the Triton GEMV takes these operands, `x` holding at most `max_rows` rows (host-side facts
    only: capturable)."""
    return (
        x.is_cuda
        and weight.device == x.device
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
    norm: RowNorm | None = None,
    fold_norm: bool = True,
    pdl: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The qkv projection of one row, rotary on its q and k heads at ``positions[0]`` and k, v stored at
    ``slot_mapping[0]`` of the caches, in one kernel, where `linear` would take the GEMV; `norm`: of the row's
    RMSNorm (`RowNorm`). Returns (the qkv row (q, k rotated), the stream: ``x + norm.residual``, else x itself),
    or None (the caller norms, runs `linear`, then rotary and the KV write).
    `heads`: (Hq, Hkv, head_dim); `fold_norm` False (the ``gemv_norm`` switch): None whenever `norm` is given.
    Bitwise the GEMV then the rotary kernel (both rotate with `_triton_norm_rope.rotate_pair`)."""
    hq, hkv, dim = heads
    if (
        uses_gemv(x, weight)  # NOTE: first: a batch of 2+ rows fails it
        and _norm_folds(x, norm, fold_norm)
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
            out, stream = _stream_of(x, norm)
            qkv = impl.gemv_rope_triton(
                x, weight, bias, positions, cos, sin, k_cache, v_cache, slot_mapping, heads, norm=norm,
                stream=out, pdl=pdl,
            )  # fmt: skip
            return qkv, stream
    return None


def linear_swiglu(
    x: torch.Tensor, weight: torch.Tensor, norm: RowNorm | None = None, *, fold_norm: bool = True,
    pdl: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """SwiGLU's ``silu(gate) * up`` of one row's gate/up projection (`weight` ``[2I, K]``, gate first, no bias)
    in one kernel, where `linear` would take the GEMV; `norm`: of the row's RMSNorm (`RowNorm`). Returns (the
    activation ``[..., I]``, the stream as `fused_linear_rope`'s), or None (the caller runs them one by one);
    `fold_norm` as `fused_linear_rope`'s. Bitwise the GEMV then the SwiGLU kernel."""
    if (
        uses_gemv(x, weight)
        and _norm_folds(x, norm, fold_norm)
        and weight.shape[0] % 2 == 0
    ):
        impl = triton_impl("_triton_gemv_swiglu")
        if impl is not None:
            out, stream = _stream_of(x, norm)
            act = impl.gemv_swiglu_triton(x, weight, norm=norm, stream=out, pdl=pdl)
            return act.view(*x.shape[:-1], weight.shape[0] // 2), stream
    return None
