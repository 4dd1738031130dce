"""Guided decoding on the GPU (default model, CUDA graphs, async scheduling on, xgrammar's Triton mask kernel):
every decode step that holds a guided row replays a graph (none goes eager) and is stepped synchronously (no
step launched ahead); the outputs follow their constraints; in float32, greedy outputs equal those of the
engine without async scheduling."""

from __future__ import annotations

import time
from typing import Any

import torch
from gpu_helpers import report, require

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model
from guided_cases import GUIDES, check

MAX_MODEL_LEN = 512
PROMPTS = ["Describe a person as JSON with a name, an age and a city:", "The capital of France is",
           "Here is a JSON object with a name and an age:", "Answer yes or no:"]


def _work() -> list[tuple[str, SamplingParams]]:
    """Each constraint greedy and sampled on every prompt, and unguided requests that outlast them."""
    work = [(p, SamplingParams(temperature=t, seed=i, max_tokens=64, guided=g))
            for i, p in enumerate(PROMPTS) for g in GUIDES for t in (0, 0.8)]
    return work + [(p, SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)) for p in PROMPTS]


def _drive(engine: LLMEngine, work: list[tuple[str, SamplingParams]]) -> tuple[dict[str, Any], list[bool]]:
    for i, (prompt, params) in enumerate(work):
        engine.add_request(f"r{i}", prompt, params)
    out: dict[str, Any] = {}
    guided_steps: list[bool] = []
    while engine.has_unfinished_requests():
        guided = any(s.guide is not None for s in engine.scheduler.running)
        eager = engine.graph_stats().eager_steps
        outputs = engine.step()
        step = engine.last_step
        if guided and step is not None and step.kind == "decode":
            # a graph replayed, the pool counted no eager step, and nothing was launched ahead
            guided_steps.append(step.graph and engine.graph_stats().eager_steps == eager)
            assert engine._async is None or engine._async.inflight is None
        out.update({o.request_id: (o.token_ids, o.text, o.finish_reason) for o in outputs if o.finished})
    return out, guided_steps


def test_guided_decode_steps_replay_graphs_and_step_synchronously() -> None:
    require("xgrammar")
    engine = LLMEngine(EngineConfig(device="cuda", max_model_len=MAX_MODEL_LEN, num_kv_blocks=512))
    assert engine.graphs_off is None and engine._async is not None
    work = _work()
    out, guided_steps = _drive(engine, work)
    for i, (_, params) in enumerate(work):
        if params.guided is not None:
            _, text, reason = out[f"r{i}"]
            assert reason == "stop", (params.guided, text)
            check(params.guided, text)
    report("guided_gpu decode steps with guided rows (all replayed)", len(guided_steps))
    report("guided_gpu chained steps after the guided requests ended", engine._async.chained_steps)
    assert len(guided_steps) > 10 and all(guided_steps)
    assert engine._async.chained_steps > 0  # async scheduling resumed once no guided row was left


def test_float32_greedy_guided_outputs_equal_the_synchronous_engine() -> None:
    require("xgrammar")
    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=MAX_MODEL_LEN)
    base = {"device": "cuda", "dtype": "float32", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 512}
    work = [(p, s) for p, s in _work() if s.temperature == 0]
    want, _ = _drive(LLMEngine(EngineConfig(**base, async_scheduling=False), loaded=loaded), work)
    start = time.perf_counter()
    got, _ = _drive(LLMEngine(EngineConfig(**base), loaded=loaded), work)
    report("guided_gpu fp32 greedy run with async scheduling (s)", round(time.perf_counter() - start, 3))
    assert got == want
