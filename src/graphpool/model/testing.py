"""A minimal paged-KV greedy loop over the model alone (no scheduler, no graphs): a reference for tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphpool.model.attention import AttentionMetadata
from graphpool.model.llama import LlamaModel


@torch.no_grad()
def paged_greedy(
    model: LlamaModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, block_size: int = 16
) -> list[list[int]]:
    """Prefill all prompts in one batch, then decode them together greedily for `max_new_tokens` tokens
    (no stop tokens). Sequence i owns a contiguous run of blocks; block 0 stays reserved as the dummy."""
    device = model.device
    max_len = max(len(p) for p in prompts) + max_new_tokens
    blocks_per_seq = -(-max_len // block_size)
    tables = torch.tensor(
        [[1 + i * blocks_per_seq + j for j in range(blocks_per_seq)] for i in range(len(prompts))],
        dtype=torch.int32,
        device=device,
    )
    kv = model.allocate_kv_caches(1 + len(prompts) * blocks_per_seq, block_size)

    def slots(i: int, positions: torch.Tensor) -> torch.Tensor:
        return tables[i].long()[positions // block_size] * block_size + positions % block_size

    positions = [torch.arange(len(p), device=device) for p in prompts]
    meta = AttentionMetadata(
        is_prefill=True,
        positions=torch.cat(positions),
        slot_mapping=torch.cat([slots(i, pos) for i, pos in enumerate(positions)]),
        seq_lens=[len(p) for p in prompts],
    )
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=device)
    hidden = model(ids, meta, kv)
    last = torch.tensor([len(p) for p in prompts], device=device).cumsum(0) - 1
    next_ids = model.compute_logits(hidden[last]).argmax(-1)
    out = [next_ids]
    pos = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
    for _ in range(max_new_tokens - 1):
        meta = AttentionMetadata(
            is_prefill=False,
            positions=pos,
            slot_mapping=torch.stack([slots(i, pos[i]) for i in range(len(prompts))]),
            block_tables=tables,
            context_lens=(pos + 1).to(torch.int32),
            max_len_bound=max_len,
        )
        next_ids = model.compute_logits(model(next_ids, meta, kv)).argmax(-1)
        out.append(next_ids)
        pos = pos + 1
    return torch.stack(out, dim=1).tolist()
