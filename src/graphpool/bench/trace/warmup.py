"""The trace bench's untimed process warm-up: one-time costs of the process stay out of every timed config.

With graphs off it runs decode batches shrinking 17 -> 1, then two passes of one request at a time at one
context length in every 64-token interval up to the longest context the trace can reach. One-time costs are
Triton JIT compiles (one per kernel variant: the launch constants and the integer arguments Triton
specialises on; not the metadata pointers' alignment, docs/kernels.md), cuBLAS handles and module loads;
paid inside a timed run they stall decode while prefill-first scheduling keeps admitting prompts. The
decode steps all take the runner's one length bound (engine/runner.py), so their attention variant no
longer changes with context length; the batches still vary the batch size and the sweep the prompt length
(prefill), and the second pass shows what is left once the compiles are done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

INTERVAL = 64  # tokens between swept context lengths


def warm_contexts(max_context: int, interval: int = INTERVAL) -> list[int]:
    """One decode context length (>= 2: a prompt of at least one token) per `interval`-token interval up to
    `max_context`, and `max_context` itself."""
    if max_context < 2 or interval < 1:
        raise ValueError(f"max_context must be >= 2 and interval >= 1, got {max_context}, {interval}")
    mids = (k * interval + interval // 2 for k in range(-(-max_context // interval)))
    return sorted({max(2, min(m, max_context)) for m in mids} | {max_context})


@dataclass
class WarmupReport:
    seconds: float = 0.0
    contexts: list[int] = field(default_factory=list)
    # slowest eager decode step of each pass over the contexts: the first holds the JIT compiles, the
    # second shows what is left once they are done
    first_pass_max_ms: float = 0.0
    second_pass_max_ms: float = 0.0
    decode_steps: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _drain(engine: Any) -> list[float]:
    """Steps `engine` until idle; returns the wall seconds of its decode steps."""
    out = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        info = engine.last_step
        if info is not None and info.kind == "decode":
            out.append(dt)
    return out


def sweep_contexts(engine: Any, contexts: list[int], tag: str = "c") -> list[float]:
    """One request per context length L, alone: a prompt of L-1 tokens, then exactly one decode step at
    context L. Returns the decode steps' wall seconds."""
    from graphpool.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    times: list[float] = []
    for L in contexts:
        engine.add_request(f"{tag}{L}", [100 + i % 800 for i in range(L - 1)], params)
        times += _drain(engine)
    return times


def shrinking_batches(engine: Any, n: int = 17) -> list[float]:
    """Decode batches shrinking n -> 1 at short contexts (the kernels' batch-size specializations)."""
    from graphpool.engine.sampling_params import SamplingParams

    for i in range(n):
        engine.add_request(f"w{i}", list(range(100, 108 + i)),
                           SamplingParams(temperature=0.0, max_tokens=i + 2, ignore_eos=True))
    return _drain(engine)


def warm_engine(engine: Any, max_context: int) -> WarmupReport:
    """Runs the warm-up on an engine built with graphs off."""
    rep = WarmupReport(contexts=warm_contexts(max_context))
    t0 = time.perf_counter()
    with torch.inference_mode():
        first = shrinking_batches(engine) + sweep_contexts(engine, rep.contexts, "c")
        second = sweep_contexts(engine, rep.contexts, "d")
    rep.seconds = time.perf_counter() - t0
    rep.first_pass_max_ms = max(first, default=0.0) * 1e3
    rep.second_pass_max_ms = max(second, default=0.0) * 1e3
    rep.decode_steps = len(first) + len(second)
    return rep
