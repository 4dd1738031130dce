"""Qwen3: the Llama decoder with a per-head RMSNorm on q and k between the projection and the rotary."""

from __future__ import annotations

import torch

from graphpool.model.config import ModelConfig
from graphpool.model.layers import RMSNorm, RotaryEmbedding
from graphpool.model.llama import LlamaAttention, LlamaDecoderLayer, LlamaModel
from graphpool.model.ops import ModelOps

__all__ = ["Qwen3Model"]


class Qwen3Attention(LlamaAttention):
    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        ops: ModelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(config, rotary, ops, device, dtype)
        # NOTE: over head_dim, shared by all heads: replicated as they are under tensor parallel
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device, dtype)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device, dtype)

    fuses_rope = False  # the norms sit between the projection and the rotary

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().project(x)
        q = self.ops.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
        return q, self.ops.rms_norm(k, self.k_norm.weight, self.k_norm.eps), v


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    """`LlamaModel` with Qwen3's attention (same interface, caches and tensor-parallel sharding)."""

    layer_cls = Qwen3DecoderLayer
