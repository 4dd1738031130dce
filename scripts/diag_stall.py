"""Diagnostic: where does the first config of a new load level stall? Per-step wall times + Triton JIT count.

Run on a GPU: TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=src python3 scripts/diag_stall.py c e  (config letters)
"""
from __future__ import annotations

import os
import sys
import time

import torch

from graphpool.bench.replay import replay_trace
from graphpool.bench.trace import TraceBenchConfig, serving_configs, warm_process
from graphpool.bench.workload import generate_trace
from graphpool.engine.engine import LLMEngine

cache = os.environ["TRITON_CACHE_DIR"]


def jit_count() -> int:
    return sum(len(f) for _, _, f in os.walk(cache))


cfg = TraceBenchConfig(rates=(40.0,), duration_s=4.0)
print("warm-up", warm_process(cfg).as_dict(), flush=True)
ladder = list(cfg.engine_config({}).pool_config().ladder().sizes)
configs = {c.key: c for c in serving_configs(ladder, 256 << 20)}
for key in sys.argv[1:]:
    eng = LLMEngine(cfg.engine_config(configs[key].overrides))
    orig = eng.step
    slow = []

    def timed(orig=orig, eng=eng, slow=slow):
        j0, t = jit_count(), time.perf_counter()
        out = orig()
        dt = (time.perf_counter() - t) * 1e3
        info = eng.last_step
        if dt > 60:
            slow.append((round(dt), info.kind, info.batch_size, info.num_tokens, info.graph, jit_count() - j0))
        return out

    eng.step = timed
    with torch.inference_mode():
        rr = replay_trace(eng, generate_trace(cfg.trace_config(40.0)), cfg.duration_s)
    print(key, "decode", len(rr.decode_batch_sizes), "prefill", rr.prefill_steps, "stats", rr.stats_end, flush=True)
    print("  slow steps (ms, kind, bs, tokens, graph, new jit files):", slow[:30], flush=True)
    del eng
