"""The decode step the pool captures: its static-input layout and its forward, shared by the runner and
the benchmarks so that both capture the very same step: `decode_step` (the engine's, and `bench profile`'s)
is the model's `decode_forward` (`bench step`'s graph rows) plus the logits' row argmax."""

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


def decode_step(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    static: Mapping[str, torch.Tensor], max_len_bound: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's step: `decode_forward`'s logits and each row's argmax of them (int64 [bs]), the greedy
    token, taken inside the step so a graph holds it (`ModelOps.step_argmax`: two Triton launches on CUDA,
    which cost nothing on the host there and less device time than torch's argmax; docs/kernels.md)."""
    logits = decode_forward(model, kv_caches, static, max_len_bound)
    return logits, model.ops.step_argmax(logits)


def _microbatch_step(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    statics: tuple[Mapping[str, torch.Tensor], ...], max_len_bound: int,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The microbatches' logits in one tensor (one LM head), their argmaxes, and each microbatch's row count."""
    hidden = model.forward_microbatches([(s["input_ids"], _meta(s, max_len_bound)) for s in statics], kv_caches)
    logits = model.compute_logits(torch.cat(hidden), upcast=False)
    return logits, model.ops.step_argmax(logits), [h.shape[0] for h in hidden]


def decode_step_microbatches(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    *statics: Mapping[str, torch.Tensor], max_len_bound: int,
) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """`decode_step` of two (or more) microbatches with their layers interleaved (microbatch overlap:
    `LlamaModel.forward_microbatches`) -> (logits, argmax) per microbatch, views of one LM-head output."""
    logits, greedy, rows = _microbatch_step(model, kv_caches, statics, max_len_bound)
    return tuple(zip(logits.split(rows), greedy.split(rows), strict=True))


def run_decode(pool: GraphPool, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
               inputs: Mapping[str, torch.Tensor], num_microbatches: int, *, eager_bound: int, max_len: int,
               decision: Decision) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A decode step's inputs -> (logits, their row argmaxes, whether a graph replayed): through the pool with
    its `decision`, or eagerly outside it with `eager_bound` when that is set (the decision's routing: no CUDA,
    or a context past the graphs' bound). With two microbatches the rows are split in halves, the first the
    larger (the pool's batch size)."""
    if num_microbatches == 1:
        if eager_bound:
            return *decode_step(model, kv_caches, inputs, max_len_bound=eager_bound), False
        logits, greedy = pool.run(inputs, max_len_in_batch=max_len, decision=decision)
        return logits, greedy, pool.last_replayed
    first = -(-next(iter(inputs.values())).shape[0] // num_microbatches)
    mbs = [{k: t[:first] for k, t in inputs.items()}, {k: t[first:] for k, t in inputs.items()}]
    if eager_bound:
        return *_microbatch_step(model, kv_caches, tuple(mbs), eager_bound)[:2], False
    # NOTE: copies: a replay's outputs are views of its buffers with padding rows between the microbatches
    (l0, g0), (l1, g1) = pool.run(mbs, max_len_in_batch=max_len, decision=decision)
    return torch.cat((l0, l1)), torch.cat((g0, g1)), pool.last_replayed
