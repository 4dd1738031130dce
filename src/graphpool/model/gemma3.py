"""Gemma 3 (text): Qwen3's attention (per-head q/k norms) scaled by query_pre_attn_scalar, a GeLU-tanh gated
MLP, norms after attention and around the MLP, the embedding scaled by sqrt(hidden), and the sliding-window
layers' own rotary base. Gemma's norms multiply by (1 + w): the loader stores 1 + w, so the shared RMSNorm ops
apply. Sliding windows are not implemented: `LlamaModel` refuses a context past the window, where every layer
attends over the whole context as the model does."""

from __future__ import annotations

import dataclasses
import math
import re

import torch
from torch.nn import functional as F

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig
from graphpool.model.layers import RMSNorm, RotaryEmbedding, SwiGLU
from graphpool.model.llama import KVCache, LlamaDecoderLayer, LlamaModel
from graphpool.model.ops import ModelOps
from graphpool.model.qwen3 import Qwen3Attention

__all__ = ["Gemma3Model"]

# every norm weight of the checkpoint: input, post-attention, pre/post feed-forward, q/k and the final norm
_NORM = re.compile(r"norm\.weight$")


class GeGLU(SwiGLU):
    """down(gelu_tanh(gate) * up), on SwiGLU's fused gate/up layout."""

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out = self.down_proj.partial(F.gelu(gate, approximate="tanh") * up)
        return self.down_proj.tp.all_reduce(out) if reduce else out


class Gemma3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention  # its scale follows query_pre_attn_scalar (LlamaAttention)
    mlp_cls = GeGLU

    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        ops: ModelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(config, rotary, ops, device, dtype)
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)

    def mlp_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """stream += post_attention_norm(attention); returns (post_feedforward_norm(mlp(pre_feedforward_norm(
        stream))), stream). NOTE: norms of whole sums: one rank only (model/parallel.py refuses to shard it)."""
        if residual is None:
            raise ValueError("the MLP stage follows an attention stage: it needs the residual stream")
        post, pre, after = self.post_attention_layernorm, self.pre_feedforward_layernorm, self.post_feedforward_layernorm
        h, residual = self.ops.add_rms_norm(self.ops.rms_norm(x, post.weight, post.eps), residual, pre.weight, pre.eps)
        return self.ops.rms_norm(self.mlp(h, reduce=False), after.weight, after.eps), residual


class Gemma3Model(LlamaModel):
    """`LlamaModel` with Gemma 3's layers; one rank only (no tensor-parallel sharding)."""

    layer_cls = Gemma3DecoderLayer

    def __init__(self, config: ModelConfig, **kwargs: object) -> None:
        super().__init__(config, **kwargs)  # type: ignore[arg-type]
        assert config.local_rope_theta is not None
        local = dataclasses.replace(config, rope_theta=config.local_rope_theta, rope_scaling=None,
                                    rope_freq_factors=None)
        # NOTE: a second shared cache, the sliding-window layers' (their base, no scaling)
        self.local_rotary = RotaryEmbedding(local, self.max_positions, self.device)
        for i in config.local_layers:
            self.layers[i].self_attn.rotary = self.local_rotary
        # NOTE: rounded to the model's dtype first, as transformers scales
        self.embed_scale = float(torch.tensor(math.sqrt(config.hidden_size), dtype=self.dtype))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale

    def from_checkpoint(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() + 1.0 if _NORM.search(name) else tensor
