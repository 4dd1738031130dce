"""The decode step the pool captures: its static-input layout and its forward, shared by the runner and
the benchmarks so that both capture the very same step. The pool captures `decode_hidden` (the model up to
its final norm); `decode_head` (the LM head) runs after the replay on the live rows, and the engine's sampler
takes the tokens from its logits. `decode_sampled` is the engine's step: at most `sample_rows` rows, the head
and the kernel draw run inside it (from each row's draw parameters, a static input), so such a replay gives
the tokens. `decode_forward` is the forward with its head in one (`bench step`'s graph rows)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from graphpool.kernels.sample import PARAM_COLUMNS
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.pool import GraphPool, InputSpec
from graphpool.pool.lockstep import Decision


def decode_input_specs(max_blocks: int, sample: bool = False) -> list[InputSpec]:
    """Batch-first static inputs (pad value): input_ids (0), positions (0), slot_mapping (0: the dummy slot),
    block_tables [max_blocks] (0: the dummy block), context_lens (1); with `sample`, sample_params
    [PARAM_COLUMNS] int64 (kernels/sample.py's columns, every cut present; 0: temperature 0, the argmax)."""
    specs = [
        InputSpec("input_ids", (), torch.int64, pad_value=0),
        InputSpec("positions", (), torch.int64, pad_value=0),
        InputSpec("slot_mapping", (), torch.int64, pad_value=0),
        InputSpec("block_tables", (max_blocks,), torch.int32, pad_value=0),
        InputSpec("context_lens", (), torch.int32, pad_value=1),
    ]
    if sample:
        specs.append(InputSpec("sample_params", (PARAM_COLUMNS,), torch.int64, pad_value=0))
    return specs


def _meta(static: Mapping[str, torch.Tensor], max_len_bound: int) -> AttentionMetadata:
    return AttentionMetadata(
        is_prefill=False,
        positions=static["positions"],
        slot_mapping=static["slot_mapping"],
        block_tables=static["block_tables"],
        context_lens=static["context_lens"],
        max_len_bound=max_len_bound,
    )


def decode_hidden(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    static: Mapping[str, torch.Tensor], max_len_bound: int,
) -> torch.Tensor:
    """The step the engine's pool captures: one token per sequence -> the final hidden rows [bs, hidden].
    The LM head runs after the replay (`decode_head`): inside a graph its logits were the largest piece of
    the arena (bs 256 x 128,256 x 2 B = 63 MiB), and outside it covers only the live rows, not the padding."""
    return model(static["input_ids"], _meta(static, max_len_bound), kv_caches)


def decode_head(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [bs, hidden] -> logits [bs, vocab] in the model's dtype (the sampler upcasts them when it needs
    probabilities, and takes a greedy batch's tokens with `ModelOps.step_argmax`)."""
    return model.compute_logits(hidden, upcast=False)


def decode_sampled(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    static: Mapping[str, torch.Tensor], max_len_bound: int, sample_rows: int,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`decode_hidden`, and for at most `sample_rows` rows the LM head and the kernel draw too -> (logits
    [bs, vocab] in the model's dtype, tokens [bs] int64), each row drawn from its `sample_params` row (the
    kernel's columns, every cut column present). Inside a graph that is one launch where the head and the draw
    were three after the replay; the logits of `sample_rows` rows are a bounded part of the arena."""
    hidden = decode_hidden(model, kv_caches, static, max_len_bound)
    if hidden.shape[0] > sample_rows:
        return hidden
    logits = decode_head(model, hidden)
    # NOTE: the kernel takes its parameters column by column, the static input holds them row by row
    tokens = model.ops.step_sample(logits, static["sample_params"].t().reshape(-1))
    if tokens is None:
        raise RuntimeError("decode_sampled needs the kernel draw (CUDA, Triton and the step_sample switch on)")
    return logits, tokens


def decode_forward(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    static: Mapping[str, torch.Tensor], max_len_bound: int,
) -> torch.Tensor:
    """The model's whole decode forward, LM head included -> logits [bs, vocab] in the model's dtype
    (`bench step`'s graph rows: the forward in one graph)."""
    return model.compute_logits(decode_hidden(model, kv_caches, static, max_len_bound), upcast=False)


def decode_hidden_microbatches(
    model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    *statics: Mapping[str, torch.Tensor], max_len_bound: int,
) -> tuple[torch.Tensor, ...]:
    """`decode_hidden` of two (or more) microbatches with their layers interleaved (microbatch overlap:
    `LlamaModel.forward_microbatches`) -> the hidden rows of each microbatch."""
    return tuple(model.forward_microbatches([(s["input_ids"], _meta(s, max_len_bound)) for s in statics],
                                            kv_caches))


def run_decode(pool: GraphPool, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
               inputs: Mapping[str, torch.Tensor], num_microbatches: int, *, eager_bound: int, max_len: int,
               decision: Decision, head_rows: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """A decode step's inputs -> (logits, the tokens drawn in the step or None, whether a graph replayed): the
    hidden rows through the pool with its `decision` (`decode_sampled`'s step: the logits and tokens of a step
    of few rows), or eagerly outside it with `eager_bound` when that is set (the decision's routing: no CUDA, or
    a context past the graphs' bound), then `decode_head` on the live rows where the step gave hidden rows.
    With two microbatches the rows are split in halves, the first the larger (the pool's batch size).
    `head_rows`: the rows whose logits are returned (the head runs on those alone where it runs after the step;
    a graph that ran it returns its logits of those rows, a copy, and every row's tokens)."""
    if num_microbatches == 1:
        if eager_bound:
            hidden = decode_hidden(model, kv_caches, inputs, max_len_bound=eager_bound)
            return decode_head(model, _rows(hidden, head_rows)), None, False
        out = pool.run(inputs, max_len_in_batch=max_len, decision=decision)
        if isinstance(out, tuple):
            return _rows(out[0], head_rows), out[1], pool.last_replayed
        return decode_head(model, _rows(out, head_rows)), None, pool.last_replayed
    first = -(-next(iter(inputs.values())).shape[0] // num_microbatches)
    mbs = [{k: t[:first] for k, t in inputs.items()}, {k: t[first:] for k, t in inputs.items()}]
    if eager_bound:
        parts = decode_hidden_microbatches(model, kv_caches, *mbs, max_len_bound=eager_bound)
        return decode_head(model, _rows(torch.cat(parts), head_rows)), None, False
    parts = pool.run(mbs, max_len_in_batch=max_len, decision=decision)
    # NOTE: one LM head over both microbatches (the cat copies: a replay's outputs are views of its buffers)
    return decode_head(model, _rows(torch.cat(parts), head_rows)), None, pool.last_replayed


def _rows(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    return t if rows is None else t.index_select(0, rows)
