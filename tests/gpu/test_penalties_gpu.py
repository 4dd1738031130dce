"""Penalties on the GPU under graph-replayed decode steps: every penalised greedy row's token is the argmax
of its logits (the graph's bf16 output, as the sampler got them) penalised by the plain-Python reference
formulas, with the request's prompt and output so far; requests come and go so that count rows are reused.

Run on the device: .venv/bin/python -m pytest -q tests/gpu/test_penalties_gpu.py
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model

PRESET = "random:smollm2-135m"
NEAR_TIE = 1e-3
PENALTIES = [
    {"presence_penalty": 2.0},
    {"frequency_penalty": 1.5},
    {"repetition_penalty": 1.8},
    {"repetition_penalty": 0.7, "presence_penalty": -1.0},
    {"presence_penalty": 0.5, "frequency_penalty": 2.0, "repetition_penalty": 1.2},
    {},
]


@dataclass
class Row:
    prompt: list[int]
    output: list[int]
    params: SamplingParams
    logits: torch.Tensor  # float32 on the CPU
    token: int


def reference_top2(row: Row) -> tuple[int, int, float]:
    """HF's repetition penalty over prompt + output, then OpenAI's frequency/presence over the output, one
    seen token at a time (float64) -> (best token, runner-up, their gap)."""
    p = row.params
    values = row.logits.double().clone()
    if p.repetition_penalty != 1.0:
        r = p.repetition_penalty
        for t in set(row.prompt) | set(row.output):
            v = float(values[t])
            values[t] = v * r if v < 0 else v / r
    counts: dict[int, int] = {}
    for t in row.output:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        values[t] -= c * p.frequency_penalty + p.presence_penalty
    top = values.topk(2)
    return int(top.indices[0]), int(top.indices[1]), float(top.values[0] - top.values[1])


def run_recorded(engine: LLMEngine, seed: int = 0) -> tuple[list[Row], int]:
    """40 requests (greedy with each penalty mix, and some sampled with penalties), 8 at a time then 2 more
    every 3 steps; returns every greedy row sampled in a graph-replayed decode step, and that step count."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    work = []
    for i in range(40):
        kw = PENALTIES[i % len(PENALTIES)]
        sampled = i % 5 == 4
        params = SamplingParams(temperature=0.8 if sampled else 0, seed=i if sampled else None,
                                max_tokens=rng.randint(8, 40), ignore_eos=True, **kw)  # type: ignore[arg-type]
        # NOTE: prompts from a small id range, so that prompt tokens are likely candidates for the penalty
        work.append(([rng.randrange(100, 400) for _ in range(rng.randint(3, 60))], params))
    assert all(max(p) < vocab for p, _ in work)
    pending: list[Row] = []
    rows: list[Row] = []
    original = engine.sampler.sample

    def sample(logits: torch.Tensor, seqs: list, drawn: torch.Tensor | None = None) -> torch.Tensor:
        tokens = original(logits, seqs, drawn)
        host = logits.to("cpu", torch.float32, copy=True)
        pending.clear()
        for i, (s, t) in enumerate(zip(seqs, tokens.tolist(), strict=True)):
            if s.params.greedy:
                pending.append(Row(list(s.prompt_token_ids), list(s.output_token_ids), s.params, host[i], t))
        return tokens

    engine.sampler.sample = sample  # type: ignore[method-assign]
    queue = list(enumerate(work))
    step = graph_steps = 0
    while queue or engine.has_unfinished_requests():
        for _ in range(min(8 if step == 0 else (2 if step % 3 == 0 else 0), len(queue))):
            i, (prompt, params) = queue.pop(0)
            engine.add_request(f"r{i}", prompt, params)
        step += 1
        engine.step()
        if engine.last_step is not None and engine.last_step.graph:
            graph_steps += 1
            rows.extend(pending)
    return rows, graph_steps


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_penalties_under_graph_replay_match_the_reference(dtype: torch.dtype) -> None:
    max_model_len = 256
    loaded = load_model(PRESET, "cuda", dtype, "triton", seed=0, max_positions=max_model_len)
    config = EngineConfig(model=PRESET, device="cuda", dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
                          max_model_len=max_model_len, num_kv_blocks=512, max_num_seqs=32,
                          async_scheduling=False)  # fmt: skip
    # NOTE: synchronous: the recording sampler reads each row's output tokens, which a chained step holds as
    # placeholders (async scheduling with penalties: tests/engine/test_async_scheduling.py)
    engine = LLMEngine(config, loaded=loaded)
    assert engine.graphs_off is None
    rows, graph_steps = run_recorded(engine)
    assert graph_steps > 10 and engine.graph_stats().hits > 0  # type: ignore[union-attr]
    checked = moved = 0
    for row in rows:
        best, second, gap = reference_top2(row)
        if gap < NEAR_TIE:
            continue
        checked += 1
        assert row.token == best, (row.params, row.token, best, second)
        moved += best != int(row.logits.argmax())
    penalised = sum(r.params.has_penalties for r in rows)
    assert penalised > 100 and checked > 0.9 * len(rows)
    assert moved > 20  # the penalties changed the argmax often: the check above is not vacuous
    counts = engine.sampler.token_counts
    assert counts.counts.device.type == "cuda"
    assert len(counts._free) == counts.capacity  # every finished request gave its row back
