"""Decode graphs of few rows that draw their tokens in the replay (`graph_sample_max_batch_size`,
decode_step.decode_sampled), on the GPU with the embedded default model: against an engine whose LM head and
kernel draw run after every replay, every request's tokens and logprobs are the same, batch by batch (every
size its own graph: no padding, so both engines compute each row with the same kernels), greedy, seeded and
unseeded sampling, top-k and top-p, penalties, a batch above the bound, synchronous and async scheduling; and
the engine that draws in the replay calls the sampler's own draw only for the steps the bound or a penalty
leaves to it."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import report

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Water boils at",
           "The three primary colors are"]


def _params(i: int) -> SamplingParams:
    kinds = [
        SamplingParams(temperature=0.8, seed=100 + i, max_tokens=24, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.9, max_tokens=22, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=7, top_k=20, top_p=0.9, max_tokens=18, ignore_eos=True),
    ]
    return kinds[i % len(kinds)]


def _run(engine: LLMEngine, n: int, penalty: bool) -> tuple[dict, int]:
    """n requests at once -> (request id -> (tokens, chosen logprobs), the sampler's own draw calls)."""
    calls = [0]
    draw = engine.sampler.draw
    assert draw is not None

    def counted(logits: torch.Tensor, params: torch.Tensor) -> torch.Tensor | None:
        calls[0] += 1
        return draw(logits, params)

    engine.sampler.draw = counted
    tok = engine.tokenizer
    for i in range(n):
        p = _params(i)
        if penalty and i == 1:
            p = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3)
        engine.add_request(f"n{n}-{i}", [*tok.encode(PROMPTS[i % len(PROMPTS)]), i + 1], p)
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                lps = [(lp.logprob, lp.top) for lp in o.logprobs] if o.logprobs else None
                out[o.request_id] = (o.token_ids, lps)
    engine.sampler.draw = draw
    return out, calls[0]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_tokens_drawn_in_the_replay_equal_those_drawn_after_it(async_scheduling: bool) -> None:
    settings = {"max_model_len": 512, "graph_miss_policy": "capture", "graph_warmup": "none",
                "async_scheduling": async_scheduling}
    inside = LLMEngine(EngineConfig(**settings))
    after = LLMEngine(EngineConfig(graph_sample_max_batch_size=0, **settings))
    assert inside.runner.sample_rows == 8 and after.runner.sample_rows == 0
    for n, penalty in ((1, False), (2, False), (3, True), (5, False), (8, False), (10, False)):
        got, inside_calls = _run(inside, n, penalty)
        want, after_calls = _run(after, n, penalty)
        assert got == want, n
        assert len(got) == n and all(len(tokens) >= 18 for tokens, _ in got.values())
        if n <= 8 and not penalty:
            # NOTE: the sampler draws only the prompts' first tokens (one prefill step, or a few)
            assert inside_calls < after_calls / 4, (n, inside_calls, after_calls)
        else:
            assert inside_calls >= after_calls / 2, (n, inside_calls, after_calls)
    # the engine drew in its replays: its graphs of at most 8 rows give tokens, the 10-row one hidden rows
    graphs = inside.runner.pool._graphs
    assert isinstance(graphs[8].outputs, tuple) and isinstance(graphs[10].outputs, torch.Tensor)
    # graph memory: the same sizes resident, the arena at most 8 rows of logits (and the draw's scratch) larger
    st_in, st_after = inside.graph_stats(), after.graph_stats()
    assert st_in is not None and st_after is not None
    assert sorted(st_in.resident_sizes) == sorted(st_after.resident_sizes)
    logits_8 = 8 * inside.model_config.vocab_size * 2
    report("arena MiB, draw in the replay / after it", (st_in.arena_bytes / 2**20, st_after.arena_bytes / 2**20))
    assert st_in.arena_bytes <= st_after.arena_bytes + logits_8 + 2**20, (st_in.arena_bytes, st_after.arena_bytes)
