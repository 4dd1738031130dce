"""Start-up warm-up of the eager prefill path.

NOTE: the first eager prefill of a process pays a one-time cost far above a warm one's (docs/benchmarks.md),
which a served run would pay while every stream waits. Engines pay such costs before serving (vLLM's
start-up profile run, SGLang's warm-up request); so does this: one eager prefill just past the graph-prefill
bound and one of the token budget (at most WARMUP_MAX_TOKENS), before the graph warm-up. Their K/V go to the
dummy block (block 0, never handed out), so no request's cache is touched. A prefill of the few-row GEMV's
MAX_ROWS tokens, with the LM head over each of its rows, compiles that kernel's variants (one per projection
width), which a two-row eager step or a mixed step's two head rows would otherwise compile mid-serving. The
last prefill's logits then go through the decode step's argmax and sampling kernels (the draw with and
without a cut: two variants), which would otherwise compile in the first request that needs them.
"""

from __future__ import annotations

import torch

from graphpool.engine.host_copy import to_device
from graphpool.engine.kv_cache import DUMMY_BLOCK, KVCache
from graphpool.kernels.gemv import MAX_ROWS
from graphpool.kernels.sample import sample_params
from graphpool.model.attn_metadata import AttentionMetadata

WARMUP_MAX_TOKENS = 2048  # NOTE: first-call costs, not a memory profile: a long context's budget would take seconds


def prefill_warmup_lengths(graph_prefill_max_tokens: int, token_budget: int, max_model_len: int) -> tuple[int, ...]:
    """The prompt lengths of the warm-up's eager prefills."""
    cap = min(max_model_len, WARMUP_MAX_TOKENS)
    return tuple(sorted({min(n, cap) for n in (graph_prefill_max_tokens + 1, token_budget)}))


@torch.inference_mode()
def warm_eager_prefill(model: torch.nn.Module, kv_caches: list[KVCache], lengths: tuple[int, ...]) -> None:
    """One eager prefill of each length and of MAX_ROWS (token id 0 throughout), K/V into the dummy block's
    first slot, the MAX_ROWS one with logits for every row; then the greedy token and two sampled ones (without
    and with a top-k/top-p cut) of the last one's logits, in the model's dtype and in float32."""
    device = model.device
    block_size = kv_caches[0][0].shape[1]
    logits = None
    # NOTE: a model loaded elsewhere may hold fewer positions
    for n in sorted({min(n, model.max_positions) for n in (*lengths, MAX_ROWS)}):
        meta = AttentionMetadata(
            is_prefill=True,
            positions=torch.arange(n, device=device),
            slot_mapping=torch.full((n,), DUMMY_BLOCK * block_size, dtype=torch.int64, device=device),
            seq_lens=[n],
        )
        hidden = model(torch.zeros(n, dtype=torch.int64, device=device), meta, kv_caches)
        logits = model.compute_logits(hidden if n == MAX_ROWS else hidden[-1:], upcast=False)[-1:]
    if logits is not None:
        draws = [to_device(p, torch.int64, device) for p in (sample_params([0], [1.0]),
                                                              sample_params([0], [1.0], [20], [0.9], [0.0]))]
        # NOTE: the float32 forms too: penalties, min_tokens and grammars sample from a float32 copy
        for rows in (logits, logits.float()):
            model.ops.step_argmax(rows)
            for params in draws:
                model.ops.step_sample(rows, params)
