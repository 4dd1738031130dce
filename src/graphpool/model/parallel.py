"""Tensor parallelism for `LlamaModel`: cut a loaded model down to one rank's shard.

`shard_model(model, tp)` keeps, on rank r of W:
- q/k/v: the rows of heads [r*H/W, (r+1)*H/W) and KV heads [r*KV/W, (r+1)*KV/W) (column-parallel: the
  contiguous split keeps GQA's q-head -> KV-head mapping inside the rank), so attention runs on the rank's
  heads and its KV cache holds only its KV heads;
- gate/up: rows [r*I/W, (r+1)*I/W) of each (column-parallel); o_proj and down: the matching input columns
  (row-parallel: partial sums, all-reduced);
- the embedding and lm head: vocab rows [r*V', (r+1)*V') with V' = ceil(V/W), the last shard zero-padded
  (vocab-parallel: the embedding looks up the ids it holds and all-reduces; the logits are gathered).
Norm weights and the rotary cache are replicated.

NOTE on memory: each rank loads the full model first and then drops what it does not keep (simple, and
every loader works unchanged), so loading peaks at the full model plus one shard per device.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from graphpool.model.config import ModelConfig
from graphpool.model.linear import ColumnLinear, RowLinear
from graphpool.model.llama import LlamaModel
from graphpool.model.tp_group import TPGroup

__all__ = ["VocabParallelEmbedding", "check_shardable", "rank_config", "shard_model"]


class VocabParallelEmbedding(nn.Module):
    """Embedding rows [start, start + rows) of the vocabulary (`weight [rows, hidden]`); ids outside them
    give zeros, and the all-reduce over the ranks adds each row from the one rank that holds it (exact)."""

    def __init__(self, weight: torch.Tensor, start: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start = start
        self.tp = tp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


# NOTE: families that run on one rank only: Gemma norms each attention and MLP output, and OLMo 2 its q/k (over
# every head) and layer outputs, whole sums where a rank holds a part; Qwen3-MoE's experts are not sharded
_NOT_SHARDED = {"gemma2": "Gemma 2", "gemma3": "Gemma 3", "olmo2": "OLMo 2",
                "qwen3_moe": "mixture-of-experts (Qwen3-MoE)"}


def check_shardable(config: ModelConfig, world_size: int) -> None:
    """ValueError unless the heads, KV heads and MLP width divide evenly over `world_size` ranks (and the
    family shards at all)."""
    if world_size > 1 and config.family in _NOT_SHARDED:
        raise ValueError(f"tensor parallel does not support {_NOT_SHARDED[config.family]} models: run them with "
                         "tensor_parallel_size 1")
    for name in ("num_heads", "num_kv_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % world_size:
            raise ValueError(
                f"tensor_parallel_size {world_size} must divide the model's {name} ({value})"
            )


def rank_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """The per-rank view of the architecture (heads and KV heads of one rank): what sizes its KV cache."""
    check_shardable(config, world_size)
    return dataclasses.replace(
        config, num_heads=config.num_heads // world_size, num_kv_heads=config.num_kv_heads // world_size
    )


def _keep(t: torch.Tensor) -> nn.Parameter:
    # NOTE: a copy, so the full tensor's storage is freed once the module drops it
    return nn.Parameter(t.contiguous().clone(), requires_grad=False)


def _shard_column(linear: ColumnLinear, tp: TPGroup) -> None:
    pieces = [linear.shard_slice(i) for i in range(len(linear.sizes))]
    local = [tp.split(p.stop - p.start) for p in pieces]
    rows = torch.cat([torch.arange(p.start + s.start, p.start + s.stop) for p, s in zip(pieces, local, strict=True)])
    rows = rows.to(linear.weight.device)
    linear.weight = _keep(linear.weight.index_select(0, rows))
    if linear.bias is not None:
        linear.bias = _keep(linear.bias.index_select(0, rows))
    linear.sizes = tuple(s.stop - s.start for s in local)


def _shard_row(linear: RowLinear, tp: TPGroup) -> None:
    linear.weight = _keep(linear.weight[:, tp.split(linear.weight.shape[1])])
    if linear.bias is not None and tp.rank != 0:
        linear.bias = _keep(torch.zeros_like(linear.bias))
    linear.tp = tp


def _vocab_rows(weight: torch.Tensor, tp: TPGroup) -> tuple[torch.Tensor, int]:
    """This rank's vocab rows of `weight [V, hidden]`, zero-padded to ceil(V / W), and the first one's id."""
    vocab = weight.shape[0]
    share = -(-vocab // tp.world_size)
    start = tp.rank * share
    rows = weight[start : min(start + share, vocab)]
    if rows.shape[0] < share:
        rows = torch.cat([rows, rows.new_zeros(share - rows.shape[0], rows.shape[1])])
    return rows, start


@torch.no_grad()
def shard_model(model: LlamaModel, tp: TPGroup) -> LlamaModel:
    """Cut `model` (full weights, loaded) down to rank `tp.rank`'s shard, in place; returns it."""
    if model.tp.world_size != 1:
        raise ValueError("the model is already sharded")
    check_shardable(model.config, tp.world_size)
    if tp.world_size == 1:
        return model
    for layer in model.layers:
        attn = layer.self_attn
        _shard_column(attn.qkv_proj, tp)
        _shard_row(attn.o_proj, tp)
        attn.num_heads //= tp.world_size
        attn.num_kv_heads //= tp.world_size
        _shard_column(layer.mlp.gate_up_proj, tp)
        _shard_row(layer.mlp.down_proj, tp)
    rows, start = _vocab_rows(model.embed_tokens.weight, tp)
    model.embed_tokens = VocabParallelEmbedding(rows.contiguous().clone(), start, tp)
    if model.lm_head is not None:
        model.lm_head = _keep(_vocab_rows(model.lm_head, tp)[0])
    model.num_kv_heads //= tp.world_size
    model.tp = tp
    return model
