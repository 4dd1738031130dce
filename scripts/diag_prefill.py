"""Diagnostic: why is a batched prefill slow? Times prefill steps and profiles one."""
from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling import SamplingParams

eng = LLMEngine(EngineConfig(model="random:llama3.2-1b", device="cuda", dtype="bfloat16", max_model_len=2048,
                             num_kv_blocks=8192, disable_cudagraph=True))
sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
for rep in range(4):
    for i in range(9):
        eng.add_request(f"r{rep}-{i}", list(range(1, 400 + 7 * i + rep)), sp)
    torch.cuda.synchronize()
    t = time.perf_counter()
    if rep == 3:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            eng.step()
            torch.cuda.synchronize()
    else:
        eng.step()
        torch.cuda.synchronize()
    print(f"prefill rep {rep}: {eng.last_step.num_tokens} tokens {1e3 * (time.perf_counter() - t):.1f} ms", flush=True)
    while eng.has_unfinished_requests():
        eng.step()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=45))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=45))
