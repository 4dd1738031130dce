"""Replaying a trace through a live engine in wall-clock time.

The driver adds every request whose arrival time has passed, then runs one `engine.step()`; each token's
timestamp is taken when the step that produced it returns. At `duration_s` the run stops and requests still
in flight are aborted (they count as unfinished): every configuration gets the same window of time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphpool.bench.common import MIB, driver_used_bytes
from graphpool.bench.latency import RequestTimeline
from graphpool.bench.workload import TraceRequest, prompt_token_ids


@dataclass
class ReplayResult:
    timelines: list[RequestTimeline]
    duration_s: float  # wall time the trace ran for
    decode_batch_sizes: list[int] = field(default_factory=list)
    decode_graph_steps: int = 0
    prefill_steps: int = 0
    peak_resident_bytes: int = 0  # pool's accounted graph bytes, max over every step
    stats_start: dict[str, Any] | None = None  # pool stats after start-up
    stats_end: dict[str, Any] | None = None
    driver_used_start_mib: float = 0.0  # device memory in use after start-up (driver view)
    driver_used_end_mib: float = 0.0  # ... at the end of the run, before the engine is torn down
    aborted: int = 0


def _pool_dict(stats: Any) -> dict[str, Any] | None:
    return None if stats is None else stats.as_dict()


def replay_trace(engine: Any, trace: Sequence[TraceRequest], duration_s: float, seed: int = 0) -> ReplayResult:
    """Runs `trace` through `engine` (an LLMEngine: add_request / step / abort_request / graph_stats)."""
    from graphpool.engine.sampling_params import SamplingParams

    device = getattr(engine, "device", torch.device("cpu"))
    timelines = [RequestTimeline(arrival_s=r.arrival_s, output_len=r.output_len) for r in trace]
    prompts = [prompt_token_ids(r, seed) for r in trace]  # NOTE: built before the clock starts
    by_id: dict[str, RequestTimeline] = {}
    res = ReplayResult(timelines=timelines, duration_s=duration_s)
    res.stats_start = _pool_dict(engine.graph_stats())
    res.driver_used_start_mib = driver_used_bytes(device) / MIB
    nxt = 0
    t0 = time.perf_counter()
    now = 0.0
    while now < duration_s:
        while nxt < len(trace) and trace[nxt].arrival_s <= now:
            req = trace[nxt]
            rid = f"r{req.index}"
            engine.add_request(rid, prompts[nxt], SamplingParams(temperature=0.0, max_tokens=req.output_len,
                                                                 ignore_eos=True))
            by_id[rid] = timelines[nxt]
            nxt += 1
        if not engine.has_unfinished_requests():
            wait = (trace[nxt].arrival_s if nxt < len(trace) else duration_s) - now
            time.sleep(max(0.0, min(wait, duration_s - now)))
            now = time.perf_counter() - t0
            continue
        outputs = engine.step()
        now = time.perf_counter() - t0
        for out in outputs:
            tl = by_id[out.request_id]
            tl.token_times.extend([now] * len(out.new_token_ids))
            if out.finished:
                tl.finished = True
                del by_id[out.request_id]
        info = engine.last_step
        if info is not None:
            if info.kind == "decode":
                res.decode_batch_sizes.append(info.batch_size)
                res.decode_graph_steps += bool(info.graph)
            else:
                res.prefill_steps += 1
        stats = engine.graph_stats()
        if stats is not None:
            res.peak_resident_bytes = max(res.peak_resident_bytes, stats.resident_bytes)
    res.duration_s = now
    res.stats_end = _pool_dict(engine.graph_stats())
    res.driver_used_end_mib = driver_used_bytes(device) / MIB
    for rid in list(by_id):
        engine.abort_request(rid)
        res.aborted += 1
    return res
