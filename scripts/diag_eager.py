"""Diagnostic: per-step time of eager decode in the engine (graphs off) vs graphs on, and Triton JIT count."""
from __future__ import annotations

import time

import torch
import triton

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling import SamplingParams

compiles = 0
_orig = triton.compile


def _count(*a, **k):
    global compiles
    compiles += 1
    return _orig(*a, **k)


triton.compile = _count
import triton.runtime.jit as jit  # noqa: E402

if hasattr(jit, "compile"):
    jit.compile = _count

for disable in (True, False):
    eng = LLMEngine(EngineConfig(model="random:llama3.2-1b", device="cuda", dtype="bfloat16", max_model_len=2048,
                                 num_kv_blocks=4096, disable_cudagraph=disable, profile_steps=True))
    g = torch.Generator().manual_seed(0)
    for i in range(24):
        n = int(torch.randint(20, 400, (1,), generator=g))
        eng.add_request(f"r{i}", list(range(1, n + 1)), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    times = []
    c0 = compiles
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        s = time.perf_counter()
        eng.step()
        times.append((eng.last_step.kind, eng.last_step.batch_size, (time.perf_counter() - s) * 1e3))
    dec = [t for k, b, t in times if k == "decode"]
    print(f"disable_cudagraph={disable}: steps={len(times)} total {time.perf_counter() - t0:.2f}s jit={compiles - c0}"
          f" decode median {sorted(dec)[len(dec) // 2]:.2f} ms max {max(dec):.1f} ms")
    print("  first decode steps ms:", [round(t, 1) for k, b, t in times if k == "decode"][:25])
    print("  prefill ms:", [round(t, 1) for k, b, t in times if k == "prefill"][:10])
