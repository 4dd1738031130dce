"""Async scheduling on the GPU (default model, Triton kernels, real CUDA graphs), where the next decode step
really runs while the host processes the one before: fp32 greedy outputs equal the synchronous engine's.
`graphpool bench step` times the engine's decode step synchronous against async."""

from __future__ import annotations

import torch
from gpu_helpers import report
from test_prefix_chunked_gpu import MAX_MODEL_LEN, prompts  # noqa: F401 (a fixture)

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.model.loader import load_model
from model_reference import run_waves

BASE = {"device": "cuda", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 256}


def test_float32_greedy_equal_the_synchronous_engine(prompts) -> None:  # noqa: F811
    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=MAX_MODEL_LEN)
    base = BASE | {"dtype": "float32"}
    waves = [[0], list(range(1, len(prompts)))]
    want = run_waves(LLMEngine(EngineConfig(**base, async_scheduling=False), loaded=loaded), prompts, waves,
                     max_tokens=24)
    config = EngineConfig(**base)
    assert config.async_scheduling  # the default with CUDA
    engine = LLMEngine(config, loaded=loaded)
    got = run_waves(engine, prompts, waves, max_tokens=24)
    report("async_scheduling_gpu fp32 chained decode steps", engine._async.chained_steps)
    assert got == want and engine._async.chained_steps > 0

