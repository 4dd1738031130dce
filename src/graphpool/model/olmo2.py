"""OLMo 2: the Llama decoder with its norms after the attention and the MLP (none before them), and RMSNorms over
the whole q and k projections (all heads together) before the rotary."""

from __future__ import annotations

import torch

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig
from graphpool.model.layers import RMSNorm, RotaryEmbedding
from graphpool.model.llama import KVCache, LlamaAttention, LlamaDecoderLayer, LlamaModel
from graphpool.model.ops import ModelOps

__all__ = ["Olmo2Model"]


class Olmo2Attention(LlamaAttention):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: ModelOps, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(config, rotary, ops, device, dtype)
        # NOTE: over every head at once: a whole sum, so one rank only (model/parallel.py refuses to shard it)
        self.q_norm = RMSNorm(config.q_size, config.rms_norm_eps, device, dtype)
        self.k_norm = RMSNorm(config.kv_size, config.rms_norm_eps, device, dtype)

    fuses_rope = False  # the norms sit between the projection and the rotary

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        proj = self.qkv_proj
        q, k, v = proj(x).split(proj.sizes, dim=-1)
        q = self.ops.rms_norm(q.contiguous(), self.q_norm.weight, self.q_norm.eps)
        k = self.ops.rms_norm(k.contiguous(), self.k_norm.weight, self.k_norm.eps)
        return (q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))


class Olmo2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Olmo2Attention

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: ModelOps, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(config, rotary, ops, device, dtype)
        del self.input_layernorm  # NOTE: OLMo 2 norms outputs, not inputs
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)

    def attention_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata, kv_cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream (the previous layer's delta added) goes into the attention as it is."""
        stream = x if residual is None else x + residual
        return self.self_attn(stream, meta, kv_cache, reduce=False), stream

    def mlp_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """stream += post_attention_norm(attention); returns (post_feedforward_norm(mlp(stream)), stream)."""
        if residual is None:
            raise ValueError("the MLP stage follows an attention stage: it needs the residual stream")
        post, after = self.post_attention_layernorm, self.post_feedforward_layernorm
        stream = residual + self.ops.rms_norm(x, post.weight, post.eps)
        return self.ops.rms_norm(self.mlp(stream, reduce=False), after.weight, after.eps), stream


class Olmo2Model(LlamaModel):
    """`LlamaModel` with OLMo 2's layers; one rank only (no tensor-parallel sharding)."""

    layer_cls = Olmo2DecoderLayer
