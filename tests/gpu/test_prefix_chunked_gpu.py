"""Prefix caching and chunked prefill on the GPU (default model, Triton decode attention, decode through CUDA
graphs): float32 greedy tokens equal those of a run with neither; bfloat16 step times are reported."""

from __future__ import annotations

import time

import pytest
import torch
from gpu_helpers import report

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model
from model_reference import run_waves

MAX_MODEL_LEN = 512
SYSTEM = ("You are a careful assistant. Answer in one short paragraph, name your sources, and say so when you are "
          "unsure. The user asks about the history of science: astronomy, medicine, printing, navigation and the "
          "instruments that made each possible, from the astrolabe to the microscope and the telescope. ")
QUESTIONS = ["Who built the first telescope?", "What did Vesalius change?", "Why did printing spread so fast?",
             "How did sailors find their longitude?", "What is an astrolabe?", "Who discovered cells?"]


def _run(engine: LLMEngine, prompts: list[list[int]], waves: list[list[int]]) -> dict[str, list[int]]:
    return run_waves(engine, prompts, waves, max_tokens=24)


@pytest.fixture(scope="module")
def prompts(default_gguf) -> list[list[int]]:
    tok = load_model(None, "cpu", torch.float32, "torch", max_positions=64)[2]
    system = tok.encode(SYSTEM * 3)
    return [system + tok.encode(q) for q in QUESTIONS] + [system[:129]]


@pytest.mark.parametrize("settings", [{"enable_prefix_caching": True},
                                      {"enable_prefix_caching": False, "max_num_batched_tokens": 48},
                                      {"enable_prefix_caching": True, "max_num_batched_tokens": 33}])
def test_float32_greedy_equal_with_prefix_caching_and_chunks(prompts, settings) -> None:
    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=MAX_MODEL_LEN)
    base = {"device": "cuda", "dtype": "float32", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 256}
    waves = [[0], list(range(1, len(prompts)))]
    ref = _run(LLMEngine(EngineConfig(**base, enable_prefix_caching=False), loaded=loaded), prompts, waves)
    engine = LLMEngine(EngineConfig(**(base | settings)), loaded=loaded)
    got = _run(engine, prompts, waves)
    assert got == ref
    stats = engine.prefix_cache_stats()
    report(f"prefix_chunked_gpu {settings} prefix hit rate", round(stats.hit_rate, 3))
    assert (stats.hits_tokens > 0) == settings["enable_prefix_caching"]
    assert engine.graph_stats() is not None and engine.graph_stats().hits + engine.graph_stats().padded_hits > 0


def test_bfloat16_step_times_chunked_long_prompt(prompts) -> None:
    """Reports (no bound asserted) the wall time of each step while a decode runs next to a long prompt: eager
    chunks in strict interleaving (test_graph_prefill_gpu.py times the default's graph prefill and mixed steps)."""
    loaded = load_model(None, "cuda", torch.bfloat16, "triton", max_positions=MAX_MODEL_LEN)
    for budget in (None, 64, 128):
        engine = LLMEngine(EngineConfig(device="cuda", max_model_len=MAX_MODEL_LEN, num_kv_blocks=256,
                                        max_num_batched_tokens=budget, graph_prefill_max_tokens=0,
                                        enable_mixed_steps=False), loaded=loaded)
        engine.add_request("short", prompts[0][:20], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        for _ in range(5):
            engine.step()
        long = prompts[1] * 2
        engine.add_request("long", long[:MAX_MODEL_LEN - 8], SamplingParams(temperature=0, max_tokens=1))
        times: dict[str, list[float]] = {"prefill": [], "decode": []}
        done = False
        while not done:  # until the long prompt's first (and only) token
            torch.cuda.synchronize()
            t = time.perf_counter()
            done = any(o.request_id == "long" for o in engine.step())
            torch.cuda.synchronize()
            times[engine.last_step.kind].append((time.perf_counter() - t) * 1e3)
        report(f"prefix_chunked_gpu bf16 budget={budget} prefill step ms", [round(x, 2) for x in times["prefill"]])
        report(f"prefix_chunked_gpu bf16 budget={budget} decode step ms", [round(x, 2) for x in times["decode"]])
        assert times["prefill"]
