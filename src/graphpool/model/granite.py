"""IBM Granite (3.x): the Llama decoder with four scales: the embedding multiplied by `embedding_multiplier`, the
attention scores by `attention_multiplier` (in place of 1/sqrt(head_dim)), each attention and MLP output by
`residual_multiplier` before it joins the residual stream, and the logits divided by `logits_scaling`."""

from __future__ import annotations

import torch

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig
from graphpool.model.layers import RotaryEmbedding
from graphpool.model.llama import KVCache, LlamaAttention, LlamaDecoderLayer, LlamaModel
from graphpool.model.ops import ModelOps

__all__ = ["GraniteModel"]


class GraniteAttention(LlamaAttention):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: ModelOps, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(config, rotary, ops, device, dtype)
        assert config.granite is not None
        self.scale = config.granite.attention_multiplier


class GraniteDecoderLayer(LlamaDecoderLayer):
    attention_cls = GraniteAttention

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: ModelOps, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(config, rotary, ops, device, dtype)
        assert config.granite is not None
        self.residual_multiplier = config.granite.residual_multiplier

    # NOTE: each stage's output is a partial sum under tensor parallel: scaled before the all-reduce, as after it
    def attention_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata, kv_cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = super().attention_stage(x, residual, meta, kv_cache)
        return h * self.residual_multiplier, residual

    def mlp_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = super().mlp_stage(x, residual, meta, kv_cache)
        return h * self.residual_multiplier, residual


class GraniteModel(LlamaModel):
    """`LlamaModel` with Granite's scales (same weights, caches and tensor-parallel sharding)."""

    layer_cls = GraniteDecoderLayer

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        assert self.config.granite is not None
        return self.embed_tokens(input_ids) * self.config.granite.embedding_multiplier

    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        assert self.config.granite is not None
        return super().compute_logits(hidden, upcast) / self.config.granite.logits_scaling
