"""SwiGLU's activation, ``silu(gate) * up``, from the fused gate/up projection ``[..., 2 * I]`` (gate first).

Semantics are torch's two eager ops (`nn.functional.silu(gate) * up`): silu in float32, rounded to the
activation dtype, then the product in float32, rounded again. The Triton kernel keeps that op order and uses
IEEE exp (libdevice) and division, so on CUDA it is expected to be bitwise equal to the reference; on CPU the
interpreter's numpy exp may differ from torch's by an fp32 ulp (one output ulp at most). Graph capturable:
no host syncs, the output is the one allocation, sized from the input's shape.
"""

from __future__ import annotations

import torch
from torch import nn

from graphpool.kernels._dispatch import triton_impl


def _check(x: torch.Tensor) -> None:
    if x.dim() < 1 or x.shape[-1] % 2 != 0:
        raise ValueError(f"x must be [..., 2 * intermediate] (gate then up), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got {x.dtype}")


def silu_mul_unchecked(x: torch.Tensor) -> torch.Tensor:
    """The reference without input checks (the model's torch ops call it every layer, every step)."""
    gate, up = x.chunk(2, dim=-1)
    return nn.functional.silu(gate) * up


def silu_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` for ``x [..., 2 * I]``: returns ``[..., I]`` in x's dtype."""
    _check(x)
    return silu_mul_unchecked(x)


def silu_mul(x: torch.Tensor, *, pdl: bool = True) -> torch.Tensor:
    """``silu(gate) * up`` of ``x [..., 2 * I]``: one Triton kernel on CUDA, the reference elsewhere; `pdl`
    (the ``pdl`` switch): the kernel lets a PDL-launched GEMV after it start early."""
    _check(x)
    impl = triton_impl("_triton_silu_mul") if x.is_cuda else None
    if impl is None:
        return silu_mul_unchecked(x)
    return impl.silu_mul_triton(x, pdl=pdl)
