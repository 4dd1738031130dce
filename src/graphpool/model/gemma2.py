"""Gemma 2: Llama's attention scaled by query_pre_attn_scalar with its scores soft-capped
(`attn_logit_softcapping`, in every attention path: prefill, the paged decode kernel and its torch op), a
GeLU-tanh gated MLP, norms after attention and around the MLP, the embedding scaled by sqrt(hidden) and the
final logits soft-capped (`LlamaModel.compute_logits`). Gemma's norms multiply by (1 + w): the loader stores
1 + w (in float32), so the shared RMSNorm ops apply. Its sliding-window layers (every other one) get their
window from `LlamaModel` (`ModelConfig.layer_window`). Gemma 3 (model/gemma3.py) builds on these classes."""

from __future__ import annotations

import math
import re

import torch
from torch.nn import functional as F

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig
from graphpool.model.layers import RMSNorm, RotaryEmbedding, SwiGLU
from graphpool.model.llama import KVCache, LlamaDecoderLayer, LlamaModel
from graphpool.model.ops import ModelOps

__all__ = ["GeGLU", "Gemma2DecoderLayer", "Gemma2Model"]

# every norm weight of the checkpoint: input, post-attention, pre/post feed-forward, (Gemma 3) q/k and the final
_NORM = re.compile(r"norm\.weight$")


class GeGLU(SwiGLU):
    """down(gelu_tanh(gate) * up), on SwiGLU's fused gate/up layout."""

    fuses_swiglu = False

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out = self.down_proj.partial(F.gelu(gate, approximate="tanh") * up)
        return self.down_proj.tp.all_reduce(out) if reduce else out


class Gemma2DecoderLayer(LlamaDecoderLayer):
    # NOTE: LlamaAttention: its scale follows query_pre_attn_scalar, its scores the config's soft cap
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


class Gemma2Model(LlamaModel):
    """`LlamaModel` with Gemma's layers, scaled embedding and (1 + w) norms; one rank only (no tensor-parallel
    sharding)."""

    layer_cls: type[LlamaDecoderLayer] = Gemma2DecoderLayer

    def __init__(self, config: ModelConfig, **kwargs: object) -> None:
        super().__init__(config, **kwargs)  # type: ignore[arg-type]
        # NOTE: the norms' 1 + w in float32, as transformers multiplies by it: in bf16 it would lose w's low bits
        # (its spacing near 1 is 2^-7), a measurable step further from the model (tests/bf16_agreement.py)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.data = module.weight.data.float()
        # NOTE: rounded to the model's dtype first, as transformers scales
        self.embed_scale = float(torch.tensor(math.sqrt(config.hidden_size), dtype=self.dtype))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale

    def from_checkpoint(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() + 1.0 if _NORM.search(name) else tensor
