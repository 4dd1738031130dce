"""Prefix caching and chunked prefill on the GPU (default model, Triton decode attention, decode through CUDA
graphs): float32 greedy tokens equal those of a run with neither. benchmarks/chunked_prefill_steps.py times the
steps next to a chunked long prompt."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import report

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
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
