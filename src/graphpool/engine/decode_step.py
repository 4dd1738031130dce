"""The decode step the pool captures: its static-input layout and its forward, shared by the runner and
the benchmarks so that both capture the very same step."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.pool import GraphPool, InputSpec
from graphpool.pool.lockstep import Decision


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


def _meta(static: Mapping[str, torch.Tensor], max_len_bound: int) -> AttentionMetadata:
    return AttentionMetadata(
        is_prefill=False,
        positions=static["positions"],
        slot_mapping=static["slot_mapping"],
        block_tables=static["block_tables"],
        context_lens=static["context_lens"],
        max_len_bound=max_len_bound,
    )


def decode_forward(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    static: Mapping[str, torch.Tensor], max_len_bound: int,
) -> torch.Tensor:
    """One token per sequence -> logits [bs, vocab] in the model's dtype (a graph then holds a third of the
    bytes of float32 logits; the sampler upcasts when it needs probabilities)."""
    hidden = model(static["input_ids"], _meta(static, max_len_bound), kv_caches)
    return model.compute_logits(hidden, upcast=False)


def _microbatch_logits(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    statics: tuple[Mapping[str, torch.Tensor], ...], max_len_bound: int,
) -> tuple[torch.Tensor, list[int]]:
    """The microbatches' logits in one tensor (one LM head), and each microbatch's row count."""
    hidden = model.forward_microbatches([(s["input_ids"], _meta(s, max_len_bound)) for s in statics], kv_caches)
    return model.compute_logits(torch.cat(hidden), upcast=False), [h.shape[0] for h in hidden]


def decode_forward_microbatches(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    *statics: Mapping[str, torch.Tensor], max_len_bound: int,
) -> tuple[torch.Tensor, ...]:
    """`decode_forward` of two (or more) microbatches with their layers interleaved (microbatch overlap:
    `LlamaModel.forward_microbatches`) -> logits per microbatch, views of one LM-head output."""
    logits, rows = _microbatch_logits(model, kv_caches, statics, max_len_bound)
    return tuple(logits.split(rows))


def run_decode(pool: GraphPool, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
               inputs: Mapping[str, torch.Tensor], num_microbatches: int, *, eager_bound: int, max_len: int,
               decision: Decision | None) -> tuple[torch.Tensor, bool]:
    """A decode step's inputs -> (logits, whether a graph replayed): through the pool (its decision, or one
    made now), or eagerly with `eager_bound` when that is set (a context past the graphs' bound). With two
    microbatches the rows are split in halves, the first the larger (the pool's batch size)."""
    if num_microbatches == 1:
        if eager_bound:
            return decode_forward(model, kv_caches, inputs, max_len_bound=eager_bound), False
        return pool.run(inputs, max_len_in_batch=max_len, decision=decision), pool.last_replayed
    first = -(-next(iter(inputs.values())).shape[0] // num_microbatches)
    mbs = [{k: t[:first] for k, t in inputs.items()}, {k: t[first:] for k, t in inputs.items()}]
    if eager_bound:
        return _microbatch_logits(model, kv_caches, tuple(mbs), eager_bound)[0], False
    # NOTE: a copy: a replay's two outputs are views of its buffer with padding rows between them
    return torch.cat(pool.run(mbs, max_len_in_batch=max_len, decision=decision)), pool.last_replayed
