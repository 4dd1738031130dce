"""Qwen3: the Llama decoder with a per-head RMSNorm on q and k between the projection and the rotary."""

from __future__ import annotations

import torch

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig
from graphpool.model.layers import RMSNorm, RotaryEmbedding
from graphpool.model.llama import KVCache, LlamaAttention, LlamaDecoderLayer, LlamaModel
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

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache, reduce: bool = True) -> torch.Tensor:
        # NOTE: never the fused projection+rotary kernel: the norms sit between the two
        k_cache, v_cache = kv_cache
        proj = self.qkv_proj
        q, k, v = proj(x).split(proj.sizes, dim=-1)
        q = self.ops.rms_norm(q.view(-1, self.num_heads, self.head_dim), self.q_norm.weight, self.q_norm.eps)
        k = self.ops.rms_norm(k.view(-1, self.num_kv_heads, self.head_dim), self.k_norm.weight, self.k_norm.eps)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.ops.rotary_and_write_kv(
            meta.positions, q, k, v, self.rotary.cos, self.rotary.sin, k_cache, v_cache, meta.slot_mapping
        )
        return self._attend(q, (k, v), meta, kv_cache, reduce)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    """`LlamaModel` with Qwen3's attention (same interface, caches and tensor-parallel sharding)."""

    layer_cls = Qwen3DecoderLayer
