"""Qwen3-MoE: Qwen3's decoder whose sparse layers (`MoeConfig.is_sparse`) replace the dense MLP by a router
over stacked SwiGLU experts; the other layers keep Qwen3's dense MLP. One rank only (no tensor parallel).

Prefill runs the experts expert by expert (eager, a host sync a layer); decode runs a capturable form with
static shapes (model/moe_ops.py), so the decode step is recorded in the graph pool like every family's."""

from __future__ import annotations

import torch
from torch import nn

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig
from graphpool.model.layers import RotaryEmbedding
from graphpool.model.linear import ColumnLinear
from graphpool.model.llama import KVCache, LlamaDecoderLayer, LlamaModel
from graphpool.model.moe_ops import experts_by_expert, experts_static, route
from graphpool.model.ops import TORCH_OPS, ModelOps
from graphpool.model.qwen3 import Qwen3DecoderLayer

__all__ = ["Qwen3MoeModel", "SparseMoe"]


class Experts(nn.Module):
    """Every expert's weights stacked (transformers' names and layout): gate_up_proj [E, 2I, H], gate rows
    first; down_proj [E, H, I]. The loader fills them from per-expert or stacked checkpoint tensors."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden, device=device,
                                                     dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate, device=device, dtype=dtype),
                                      requires_grad=False)


class SparseMoe(nn.Module):
    """Router (`gate`: logits over the experts) and experts; `forward(x, capturable)`."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype,
                 ops: ModelOps = TORCH_OPS) -> None:
        super().__init__()
        moe = config.moe
        if moe is None:
            raise ValueError("a sparse MoE layer needs ModelConfig.moe")
        self.top_k, self.normalize = moe.num_experts_per_tok, moe.norm_topk_prob
        self.gate = ColumnLinear(config.hidden_size, (moe.num_experts,), False, device, dtype, ops.linear)
        self.experts = Experts(moe.num_experts, config.hidden_size, moe.moe_intermediate_size, device, dtype)
        self.ops = ops

    def forward(self, x: torch.Tensor, capturable: bool = True) -> torch.Tensor:
        """`capturable`: the decode step's form (static shapes, no host sync); else the eager per-expert one."""
        weights, ids = route(self.gate(x), self.top_k, self.normalize)
        e = self.experts
        if capturable:
            return experts_static(x, e.gate_up_proj, e.down_proj, weights, ids, self.ops.silu_mul, self.ops.linear)
        return experts_by_expert(x, e.gate_up_proj, e.down_proj, weights, ids, self.ops.silu_mul)


class Qwen3MoeSparseLayer(LlamaDecoderLayer):
    """Qwen3's layer with the sparse MLP in place of the dense one."""

    attention_cls = Qwen3DecoderLayer.attention_cls
    mlp_cls = SparseMoe

    def mlp_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None or meta is None:
            raise ValueError("the sparse MLP stage follows an attention stage: it needs the residual and metadata")
        norm = self.post_attention_layernorm
        h, residual = self.ops.add_rms_norm(x, residual, norm.weight, norm.eps)
        return self.mlp(h, capturable=not meta.is_prefill), residual


class Qwen3MoeModel(LlamaModel):
    """`LlamaModel` with Qwen3's attention in every layer and the sparse MLP in `MoeConfig`'s sparse layers."""

    layer_cls = Qwen3DecoderLayer

    def make_layer(self, index: int, config: ModelConfig, rotary: RotaryEmbedding, ops: ModelOps,
                   device: torch.device, dtype: torch.dtype) -> LlamaDecoderLayer:
        assert config.moe is not None
        cls = Qwen3MoeSparseLayer if config.moe.is_sparse(index) else self.layer_cls
        return cls(config, rotary, ops, device, dtype)
