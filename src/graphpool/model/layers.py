"""Llama building blocks: RMSNorm, rotary embedding (with Llama-3 frequency scaling), SwiGLU MLP."""

from __future__ import annotations

import math

import torch
from torch import nn

from graphpool.kernels.gemv import RowNorm
from graphpool.kernels.norm_rope import rotate_ref as _rotate
from graphpool.model.config import ModelConfig, RopeScaling
from graphpool.model.linear import ColumnLinear, RowLinear
from graphpool.model.ops import TORCH_OPS, ModelOps, rms_norm_torch

__all__ = ["RMSNorm", "RotaryEmbedding", "SwiGLU", "_rotate", "rope_inv_freq"]


class RMSNorm(nn.Module):
    """Holds the norm weight; the computation is one of `ModelOps`' norm functions."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_torch(x, self.weight, self.eps)


def rope_inv_freq(
    head_dim: int,
    theta: float,
    scaling: RopeScaling | None,
    freq_factors: tuple[float, ...] | None = None,
) -> torch.Tensor:
    """Inverse rotary frequencies [head_dim // 2] (float32), with Llama-3 scaling when given (as parameters,
    or as llama.cpp's per-frequency divisors `freq_factors`)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if freq_factors is not None:
        return inv_freq / torch.tensor(freq_factors, dtype=torch.float32)
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths (low frequencies) are slowed by `factor`, short ones kept, the band between blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Float32 cos/sin caches `[max_positions, head_dim // 2]`, computed once at construction and indexed
    by position each step (never reallocated)."""

    def __init__(self, config: ModelConfig, max_positions: int, device: torch.device) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(
            config.head_dim, config.rope_theta, config.rope_scaling, config.rope_freq_factors
        )
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", freqs.cos().to(device), persistent=False)
        self.register_buffer("sin", freqs.sin().to(device), persistent=False)


class NoRotary(nn.Module):
    """A rotary of cos 1 and sin 0 (`RotaryEmbedding`'s shape): the layers of a model without one (SmolLM3's NoPE
    layers) run every rotary path, fused decode kernels included, and leave q and k as they are."""

    def __init__(self, head_dim: int, max_positions: int, device: torch.device) -> None:
        super().__init__()
        self.register_buffer("cos", torch.ones(max_positions, head_dim // 2, device=device), persistent=False)
        self.register_buffer("sin", torch.zeros(max_positions, head_dim // 2, device=device), persistent=False)


class SwiGLU(nn.Module):
    """down(silu(gate) * up): the fused gate/up projection's output is ``[T, 2I]``, gate first; the
    activation is `ModelOps.silu_mul` (one Triton kernel with the triton ops on CUDA), or folded into the
    gate/up GEMV of a one-row step (`ModelOps.linear_swiglu`)."""

    fuses_swiglu = True  # the one-row gate/up GEMV may apply the activation itself (a subclass with another: not)

    def __init__(
        self, config: ModelConfig, device: torch.device, dtype: torch.dtype, ops: ModelOps = TORCH_OPS
    ) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = ColumnLinear(config.hidden_size, (size, size), False, device, dtype, ops.linear)
        self.down_proj = RowLinear(size, config.hidden_size, False, device, dtype, ops.linear)
        self.ops = ops

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """`reduce=False`: the output before down_proj's all-reduce (a rank's partial sum under tensor parallel)."""
        fused = self._fused(x, None)
        return self._down(fused[0] if fused is not None else self.ops.silu_mul(self.gate_up_proj(x)), reduce)

    def forward_normed(
        self, x: torch.Tensor, norm: RowNorm, reduce: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`forward` of the RMSNorm `norm` of x, the norm folded into the fused gate/up GEMV: (the output, the
        stream ``x + norm.residual`` (x without one)), or None where that fusion does not apply (the caller
        norms and calls `forward`)."""
        fused = self._fused(x, norm)
        if fused is None:
            return None
        act, stream = fused
        return self._down(act, reduce), stream

    def _fused(self, x: torch.Tensor, norm: RowNorm | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.ops.linear_swiglu(x, self.gate_up_proj.weight, norm=norm) if self.fuses_swiglu else None

    def _down(self, act: torch.Tensor, reduce: bool) -> torch.Tensor:
        down = self.down_proj
        # NOTE: down's partial sum (RowLinear.partial: its bias on rank 0 only)
        out = down.partial(act)
        return down.tp.all_reduce(out) if reduce else out
