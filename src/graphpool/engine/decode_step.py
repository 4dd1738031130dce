"""The decode step the pool captures: its static-input layout and its forward, shared by the runner and
the benchmarks so that both capture the very same step."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.pool import InputSpec


def decode_input_specs(max_blocks: int) -> list[InputSpec]:
    """Batch-first static inputs (pad value): input_ids (0), positions (0), slot_mapping (0: the dummy slot),
    block_tables [max_blocks] (0: the dummy block), context_lens (1)."""
    return [
        InputSpec("input_ids", (), torch.int64, pad_value=0),
        InputSpec("positions", (), torch.int64, pad_value=0),
        InputSpec("slot_mapping", (), torch.int64, pad_value=0),
        InputSpec("block_tables", (max_blocks,), torch.int32, pad_value=0),
        InputSpec("context_lens", (), torch.int32, pad_value=1),
    ]


def decode_forward(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    static: Mapping[str, torch.Tensor], max_len_bound: int,
) -> torch.Tensor:
    """One token per sequence -> logits [bs, vocab] in the model's dtype (a graph then holds a third of the
    bytes of float32 logits; the sampler upcasts when it needs probabilities)."""
    meta = AttentionMetadata(
        is_prefill=False,
        positions=static["positions"],
        slot_mapping=static["slot_mapping"],
        block_tables=static["block_tables"],
        context_lens=static["context_lens"],
        max_len_bound=max_len_bound,
    )
    hidden = model(static["input_ids"], meta, kv_caches)
    return model.compute_logits(hidden, upcast=False)
