"""The model's swappable operations: plain torch, or the fused Triton kernels of `graphpool.kernels`.

Backend "torch" is the reference (CPU and GPU, graph-capturable). Backend "triton" uses, on CUDA, the Triton
paged decode attention plus fused residual-add+RMSNorm, rotary+KV-write and SwiGLU silu*mul kernels: fewer
kernels per step, and a Triton GEMV for the linear layers of a one-row step, into which the rotary, SwiGLU
and the norm before them fold (`kernels/gemv.py`). Both follow the same numerics
contract (norm statistics in float32, rotary in float32 over the same cache, silu rounded to the activation
dtype before the product). The kernel switches (`kernels/switches.py`) are resolved here, once, when the
model is built: a switched-off kernel's function is not in the op set, or its launcher gets the switch bound.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from graphpool.kernels.argmax import argmax_rows

# NOTE: the kernels' reference numerics (one copy), in their check-free forms: no host checks per layer.
from graphpool.kernels.norm_rope import rms_norm_unchecked as rms_norm_torch
from graphpool.kernels.norm_rope import rotary_and_write_kv_unchecked as rotary_and_write_kv_torch
from graphpool.kernels.sample import sample_rows
from graphpool.kernels.silu_mul import silu_mul_unchecked as silu_mul_torch
from graphpool.kernels.switches import check_switches
from graphpool.model.attn_ops import paged_decode_attention_torch

AttnBackend = Literal["torch", "triton"]
Tensor = torch.Tensor


def add_rms_norm_torch(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    s = x + residual
    return rms_norm_torch(s, weight, eps), s


def no_fusion(*_: object, **__: object) -> None:
    """The torch op set's fused_* ops: no kernel does two ops at once, the model runs them one by one."""
    return None


def argmax_torch(x: Tensor) -> Tensor:
    """torch's row argmax (the decode step's with ``step_argmax`` off)."""
    return x.argmax(dim=-1)


def no_draw(*_: object) -> None:
    """The draw with ``step_sample`` off: none here, the sampler draws in torch."""
    return None


@dataclass(frozen=True)
class ModelOps:
    backend: AttnBackend
    # (q, k_cache, v_cache, block_tables, context_lens, scale, max_len_bound, *, softcap) -> [bs, Hq, D]; softcap
    # is passed only when on (Gemma 2), so an op without it serves every other family
    decode_attention: Callable[..., Tensor]
    rms_norm: Callable[[Tensor, Tensor, float], Tensor]
    add_rms_norm: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]
    rotary_and_write_kv: Callable[..., tuple[Tensor, Tensor]]
    silu_mul: Callable[[Tensor], Tensor]  # the gate/up projection's [T, 2I] -> silu(gate) * up [T, I]
    linear: Callable[[Tensor, Tensor, Tensor | None], Tensor]  # x @ w.T + b, every projection and the LM head
    # (x, w, b, positions, cos, sin, k_cache, v_cache, slots, (Hq, Hkv, D), norm=RowNorm | None) -> (the qkv
    # projection of x (or of its norm) with q and k rotated and k, v stored in the caches, the stream) from one
    # kernel, or None: then the model runs them one by one (`kernels.gemv.fused_linear_rope`)
    fused_linear_rope: Callable[..., tuple[Tensor, Tensor] | None]
    # (x, gate_up w, norm=RowNorm | None) -> (silu(gate) * up of x (or of its norm), the stream) from one
    # kernel, or None (`kernels.gemv.linear_swiglu`)
    linear_swiglu: Callable[..., tuple[Tensor, Tensor] | None]
    # logits [bs, vocab] -> int64 [bs]: a greedy batch's token of each row (the sampler's)
    step_argmax: Callable[[Tensor], Tensor]
    # (logits [bs, vocab], int64 params `kernels.sample.sample_params`) -> int64 [bs]: each row drawn at its
    # temperature, or None where no kernel applies (then the sampler draws in torch)
    step_sample: Callable[[Tensor, Tensor], Tensor | None]


# NOTE: the step's argmax and draw are the Triton ones on CUDA tensors whatever the backend: the argmax costs
# less device time than torch's, with the same indices, and the draw one call where torch takes a dozen
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
    argmax_rows,
    sample_rows,
)


def _bind(fn: Callable[..., Any], **switches: bool) -> Callable[..., Any]:
    """`fn` with its switched-off kernel arguments bound (`fn` itself when every switch is on)."""
    off = {name: False for name, on in switches.items() if not on}
    return functools.partial(fn, **off) if off else fn


def torch_ops(disabled: Iterable[str] = ()) -> ModelOps:
    """TORCH_OPS; of the kernel switches only ``step_argmax`` and ``step_sample`` apply to it."""
    off = check_switches(disabled)
    if "step_argmax" not in off and "step_sample" not in off:
        return TORCH_OPS
    return replace(TORCH_OPS, step_argmax=argmax_torch if "step_argmax" in off else argmax_rows,
                   step_sample=no_draw if "step_sample" in off else sample_rows)


def kernel_ops(disabled: Iterable[str] = ()) -> ModelOps:
    """The `graphpool.kernels` entry points (Triton on CUDA tensors, their torch references elsewhere), with
    the kernel switches named in `disabled` off."""
    from graphpool.kernels.decode_attention import paged_decode_attention
    from graphpool.kernels.gemv import fused_linear_rope, linear, linear_swiglu
    from graphpool.kernels.norm_rope import add_rms_norm, apply_rotary_and_write_kv, rms_norm
    from graphpool.kernels.silu_mul import silu_mul

    off = check_switches(disabled)
    pdl = "pdl" not in off
    fold_norm = "gemv_norm" not in off
    return ModelOps(
        "triton",
        _bind(paged_decode_attention, pdl=pdl, attn_stages="attn_stages" not in off),
        _bind(rms_norm, pdl=pdl),
        _bind(add_rms_norm, pdl=pdl),
        apply_rotary_and_write_kv,
        _bind(silu_mul, pdl=pdl),
        torch.nn.functional.linear if "gemv" in off else _bind(linear, pdl=pdl, rows="gemv_rows" not in off),
        no_fusion if "gemv" in off or "gemv_rope" in off else _bind(fused_linear_rope, pdl=pdl, fold_norm=fold_norm),
        no_fusion if "gemv" in off or "gemv_swiglu" in off else _bind(linear_swiglu, pdl=pdl, fold_norm=fold_norm),
        argmax_torch if "step_argmax" in off else argmax_rows,
        no_draw if "step_sample" in off else sample_rows,
    )


def default_attn_backend(backend: str, device: torch.device) -> AttnBackend:
    """The one place "auto" is decided: Triton kernels on CUDA, the torch ops elsewhere."""
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend not in ("torch", "triton"):
        raise ValueError(f"attn_backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return backend  # type: ignore[return-value]


def resolve_ops(backend: AttnBackend, device: torch.device, disabled: Iterable[str] = ()) -> ModelOps:
    """The op set of `backend` on `device`, with the kernel switches named in `disabled` off."""
    if backend not in ("torch", "triton"):
        raise ValueError(f"attn_backend must be 'torch' or 'triton', got {backend!r}")
    if backend == "torch":
        return torch_ops(disabled)
    if device.type != "cuda":
        warnings.warn("the triton backend needs a CUDA device; using the torch backend", stacklevel=3)
        return torch_ops(disabled)
    try:
        return kernel_ops(disabled)
    except ImportError as exc:
        warnings.warn(f"graphpool.kernels unavailable ({exc}); using the torch backend", stacklevel=3)
        return torch_ops(disabled)
