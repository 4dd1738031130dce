"""Async scheduling on the GPU (default model, Triton kernels, real CUDA graphs), where the next decode step
really runs while the host processes the one before: fp32 greedy outputs equal the synchronous engine's; bf16
decode step wall times, synchronous against async, reported (not asserted: benchmarks hold speed targets)."""

from __future__ import annotations

import statistics
import time

import torch
from gpu_helpers import report
from test_prefix_chunked_gpu import MAX_MODEL_LEN, prompts  # noqa: F401 (a fixture)

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model
from model_reference import run_waves

BASE = {"device": "cuda", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 256}


def test_float32_greedy_equal_the_synchronous_engine(prompts) -> None:  # noqa: F811
    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=MAX_MODEL_LEN)
    base = BASE | {"dtype": "float32"}
    waves = [[0], list(range(1, len(prompts)))]
    want = run_waves(LLMEngine(EngineConfig(**base), loaded=loaded), prompts, waves, max_tokens=24)
    engine = LLMEngine(EngineConfig(**base, async_scheduling=True), loaded=loaded)
    got = run_waves(engine, prompts, waves, max_tokens=24)
    report("async_scheduling_gpu fp32 chained decode steps", engine._async.chained_steps)
    assert got == want and engine._async.chained_steps > 0


def test_bfloat16_decode_step_wall_sync_and_async(prompts) -> None:  # noqa: F811
    loaded = load_model(None, "cuda", torch.bfloat16, "triton", max_positions=MAX_MODEL_LEN)
    medians: dict[str, float] = {}
    for bs in (1, 8):
        for mode in (False, True):
            engine = LLMEngine(EngineConfig(**BASE, async_scheduling=mode, graph_warmup=(bs,)), loaded=loaded)
            for i in range(bs):
                engine.add_request(f"r{i}", prompts[i % len(prompts)][:32],
                                   SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))
            for _ in range(10):
                engine.step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            n = 0
            walls = []
            while engine.has_unfinished_requests() and n < 100:
                t = time.perf_counter()
                engine.step()
                walls.append(time.perf_counter() - t)
                n += 1
            torch.cuda.synchronize()
            medians[f"bs{bs} {'async' if mode else 'sync'}"] = round(statistics.median(walls) * 1e3, 3)
            medians[f"bs{bs} {'async' if mode else 'sync'} mean"] = round((time.perf_counter() - t0) / n * 1e3, 3)
    report("async_scheduling_gpu bf16 decode step wall ms (median per call, mean over 100 calls)", medians)
