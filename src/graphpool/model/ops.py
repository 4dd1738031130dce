"""The model's swappable operations: plain torch, or the fused Triton kernels of `graphpool.kernels`.

Backend "torch" is the reference (CPU and GPU, graph-capturable). Backend "triton" uses, on CUDA, the Triton
paged decode attention plus fused residual-add+RMSNorm, rotary+KV-write and SwiGLU silu*mul kernels: fewer
kernels per step, and a Triton GEMV for the linear layers of a one-row step. Both follow the same numerics contract (norm statistics in float32, rotary in float32 over
the same cache, silu rounded to the activation dtype before the product).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

# NOTE: the kernels' reference numerics (one copy), in their check-free forms: no host checks per layer.
from graphpool.kernels.norm_rope import rms_norm_unchecked as rms_norm_torch
from graphpool.kernels.norm_rope import rotary_and_write_kv_unchecked as rotary_and_write_kv_torch
from graphpool.kernels.silu_mul import silu_mul_unchecked as silu_mul_torch
from graphpool.model.attn_ops import paged_decode_attention_torch

AttnBackend = Literal["torch", "triton"]
Tensor = torch.Tensor


def add_rms_norm_torch(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    s = x + residual
    return rms_norm_torch(s, weight, eps), s


def no_fusion(*_: object) -> None:
    """The torch op set's fused_* ops: no kernel does two ops at once, the model runs them one by one."""
    return None


@dataclass(frozen=True)
class ModelOps:
    backend: AttnBackend
    decode_attention: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float, int], Tensor]
    rms_norm: Callable[[Tensor, Tensor, float], Tensor]
    add_rms_norm: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]
    rotary_and_write_kv: Callable[..., tuple[Tensor, Tensor]]
    silu_mul: Callable[[Tensor], Tensor]  # the gate/up projection's [T, 2I] -> silu(gate) * up [T, I]
    linear: Callable[[Tensor, Tensor, Tensor | None], Tensor]  # x @ w.T + b, every projection and the LM head
    # (x, residual | None, norm weight, eps, w, b) -> (linear(rms_norm(x + residual)), x + residual) from one
    # kernel that does both (a layer's norm and the projection after it), or None: then the model runs them
    fused_norm_linear: Callable[..., tuple[Tensor, Tensor] | None]
    # (gate_up, w, b) -> linear(silu_mul(gate_up), w, b) from one kernel (SwiGLU and down_proj), or None
    fused_silu_linear: Callable[..., Tensor | None]
    # (x, w, b, positions, cos, sin, k_cache, v_cache, slots, (Hq, Hkv, D)) -> the qkv projection with q and k
    # rotated and k, v stored in the caches, from one kernel, or None: then the model runs them one by one
    fused_linear_rope: Callable[..., Tensor | None]


TORCH_OPS = ModelOps(
    "torch",
    paged_decode_attention_torch,
    rms_norm_torch,
    add_rms_norm_torch,
    rotary_and_write_kv_torch,
    silu_mul_torch,
    torch.nn.functional.linear,
    no_fusion,
    no_fusion,
    no_fusion,
)


def kernel_ops() -> ModelOps:
    """The `graphpool.kernels` entry points (Triton on CUDA tensors, their torch references elsewhere)."""
    from graphpool.kernels.decode_attention import paged_decode_attention
    from graphpool.kernels.gemv import fused_linear_rope, fused_norm_linear, fused_silu_linear, linear
    from graphpool.kernels.norm_rope import add_rms_norm, apply_rotary_and_write_kv, rms_norm
    from graphpool.kernels.silu_mul import silu_mul

    return ModelOps(
        "triton",
        paged_decode_attention,
        rms_norm,
        add_rms_norm,
        apply_rotary_and_write_kv,
        silu_mul,
        linear,
        fused_norm_linear,
        fused_silu_linear,
        fused_linear_rope,
    )


def default_attn_backend(backend: str, device: torch.device) -> AttnBackend:
    """The one place "auto" is decided: Triton kernels on CUDA, the torch ops elsewhere."""
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend not in ("torch", "triton"):
        raise ValueError(f"attn_backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return backend  # type: ignore[return-value]


def resolve_ops(backend: AttnBackend, device: torch.device) -> ModelOps:
    if backend not in ("torch", "triton"):
        raise ValueError(f"attn_backend must be 'torch' or 'triton', got {backend!r}")
    if backend == "torch":
        return TORCH_OPS
    if device.type != "cuda":
        warnings.warn("the triton backend needs a CUDA device; using the torch backend", stacklevel=3)
        return TORCH_OPS
    try:
        return kernel_ops()
    except ImportError as exc:
        warnings.warn(f"graphpool.kernels unavailable ({exc}); using the torch backend", stacklevel=3)
        return TORCH_OPS
