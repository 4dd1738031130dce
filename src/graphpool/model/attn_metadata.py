"""Attention metadata shared by the model, the kernels and the engine's runner.

The model reads this dataclass; the runner fills it. For a graph-captured decode step every tensor here is a
static buffer owned by the pool, so the model must only *read* it (never rebind or resize).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    is_prefill: bool
    positions: torch.Tensor  # [T] int64, rotary position of each token
    slot_mapping: torch.Tensor  # [T] int64, flat KV slot (block * block_size + offset) written by each token
    # decode only
    block_tables: torch.Tensor | None = None  # [bs, max_blocks] int32, block ids of each sequence
    context_lens: torch.Tensor | None = None  # [bs] int32, tokens in context including the current one
    max_len_bound: int = 0  # host int: upper bound of context_lens, baked into the decode kernel's grid
    # prefill only: each sequence's tokens are contiguous in the batch; prefill covers whole sequences
    seq_lens: list[int] | None = None  # host ints, sum == T
