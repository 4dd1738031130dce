"""`bench profile`'s prefill part: one engine step that prefills one short prompt, through
`LLMEngine.step` (scheduler, the runner's real prefill, sampling, prefix-cache commit, detokenization), after
warm-up steps of the same length; where the step's wall time goes."""

from __future__ import annotations

import cProfile
import pstats
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from graphpool.bench.common import md_table, median, sync
from graphpool.bench.profile import events as pe
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine, LoadedModel
from graphpool.engine.sampling_params import SamplingParams

STEP_RANGE = "gp.prefill_step"
# the mixed prefill step whose ops are counted: 8 prompts, as a serving step holds several (p50 ~230 tokens)
MIXED_PROMPTS = (40, 7, 230, 95, 12, 180, 64, 3)


@dataclass(frozen=True)
class PrefillOpCount:
    """aten ops dispatched by one engine step that prefills `prompt_lens` together (device-independent: what
    the host dispatches, whatever each op then launches)."""
    prompt_lens: tuple[int, ...]
    step_ops: int  # the whole step: scheduler, runner inputs, model, logits, sampling
    layer_ops: tuple[int, ...]  # inside each decoder layer's forward
    attention_ops: tuple[int, ...]  # inside each layer's attention stage (its norm and projections included)

    @property
    def per_layer(self) -> float:
        return sum(self.layer_ops) / len(self.layer_ops)

    @property
    def outside_layers(self) -> int:
        return self.step_ops - sum(self.layer_ops)


@dataclass
class PrefillProfile:
    prompt_tokens: int
    first_step_ms: float  # the first prefill of this length (may JIT-compile Triton kernels)
    warm_step_ms: float  # median of the timed steps, no profiler
    timed_steps: int
    profiled_step_ms: float  # the profiled step's own range (profiler on: the host is slowed a little)
    kernels: int  # device events of the profiled step (CPU: ops)
    kernel_ms: float  # their summed time
    busy_ms: float  # time covered by at least one of them, within the step's range
    idle_share: float  # 1 - busy / step range
    stack_step_ms: float  # the step under the with_stack profile (Python tracing slows it)
    launches: int = 0  # CUDA kernel launch calls (runtime/driver) in the step's range; CPU: 0
    launch_host_us: float = 0.0  # their summed host time (the calls alone)
    python_source: str = ""  # where top_python comes from: the with_stack profile, or cProfile
    stack_python_events: int = 0  # Python function events of the with_stack profile (all files)
    top_kernels: list[pe.KernelRow] = field(default_factory=list)
    top_ops: list[tuple[str, int, float]] = field(default_factory=list)  # (op, calls, self CPU us)
    top_python: list[tuple[str, int, float]] = field(default_factory=list)  # (function, calls, inclusive us)
    op_counts: list[PrefillOpCount] = field(default_factory=list)  # one prompt of prompt_tokens; MIXED_PROMPTS


# NOTE: on Python 3.12 (cProfile on sys.monitoring) a custom op in the step (torch's varlen_attn, on the H200
# with torch 2.11) made cProfile keep the model's layers but lose the frames above them (step, runner, model),
# and the pure-Python `profile` module fail with "Bad return"; the report says so where it happens.
LOST_FRAMES_NOTE = "the model's layers (seen on Python 3.12)"


def prefill_engine(loaded: LoadedModel, name: str, cfg: Any, max_len: int) -> LLMEngine:
    """An engine over the loaded model, as the server builds it, with a small KV cache, no graph warm-up and
    eager prefill steps (the profiled step; a short one would otherwise replay a decode graph once one is
    resident)."""
    blocks = max(-(-(cfg.prefill_tokens + 1) // cfg.block_size),
                 sum(-(-(n + 1) // cfg.block_size) for n in MIXED_PROMPTS))
    config = EngineConfig(model=name, device=cfg.device, dtype=cfg.dtype, attn_backend=cfg.attn_backend,
                          max_model_len=max_len, block_size=cfg.block_size, num_kv_blocks=2 + 4 * blocks,
                          graph_warmup="none", graph_prefill_max_tokens=0, enable_mixed_steps=False)
    return LLMEngine(config, loaded=loaded)


def _stepper(engine: LLMEngine, n_tokens: int) -> Callable[[], float]:
    """Each call: a new request of n_tokens random ids (a new prefix: no prefix-cache hit), one engine step
    (its prefill, which also samples its one token and finishes it); returns the step's wall ms."""
    vocab = engine.model_config.vocab_size
    count = 0

    def step() -> float:
        nonlocal count
        rng = random.Random(count)
        engine.add_request(f"p{count}", [rng.randrange(vocab) for _ in range(n_tokens)],
                           SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        count += 1
        sync(engine.device)
        t0 = time.perf_counter()
        with record_function(STEP_RANGE):
            engine.step()
        ms = (time.perf_counter() - t0) * 1e3
        if engine.last_step is None or engine.last_step.kind != "prefill" or engine.has_unfinished_requests():
            raise RuntimeError(f"the profiled step was not one whole prefill: {engine.last_step}")
        return ms

    return step


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.n += 1
        return func(*args, **(kwargs or {}))


def count_prefill_ops(engine: LLMEngine, prompt_lens: list[int], seed: int = 0) -> PrefillOpCount:
    """One engine step prefilling new prompts of `prompt_lens` random tokens (fresh prefixes) together,
    counted op by op; raises if the step was not that one whole prefill."""
    vocab = engine.model_config.vocab_size
    rng = random.Random(f"ops{seed}")  # not the stepper's prompts: a prefix-cache hit would take the paged path
    for i, n in enumerate(prompt_lens):
        engine.add_request(f"ops{seed}-{i}", [rng.randrange(vocab) for _ in range(n)],
                           SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    counter = _OpCounter()
    layers = engine.runner.model.layers
    marks: dict[str, list[int]] = {"layer": [], "attn": []}
    hooks = []

    def marked(stage: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            marks["attn"].append(-counter.n)
            out = stage(*args, **kwargs)
            marks["attn"].append(counter.n)
            return out

        return run

    for layer in layers:
        hooks.append(layer.register_forward_pre_hook(lambda *_: marks["layer"].append(-counter.n)))
        hooks.append(layer.register_forward_hook(lambda *_: marks["layer"].append(counter.n)))
        # NOTE: the attention stage is a method (its norm, projections and attention), not a module: wrapped
        # on the instance for the counted step
        layer.attention_stage = marked(layer.attention_stage)  # type: ignore[method-assign]
    try:
        with counter:
            engine.step()
    finally:
        for h in hooks:
            h.remove()
        for layer in layers:
            del layer.attention_stage  # back to the class's method
    step = engine.last_step
    if step is None or step.kind != "prefill" or engine.has_unfinished_requests():
        raise RuntimeError(f"the counted step was not one whole prefill of {len(prompt_lens)} prompts: {step}")

    def spans(xs: list[int]) -> tuple[int, ...]:
        return tuple(xs[i] + xs[i + 1] for i in range(0, len(xs), 2))

    return PrefillOpCount(tuple(prompt_lens), counter.n, spans(marks["layer"]), spans(marks["attn"]))


def profile_prefill(engine: LLMEngine, n_tokens: int, warmup: int, reps: int, top: int) -> PrefillProfile:
    cuda = engine.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    step = _stepper(engine, n_tokens)
    first = step()
    for _ in range(warmup):
        step()
    timed = [step() for _ in range(reps)]
    with profile(activities=acts) as prof:
        step()
    events = prof.events()
    lo, hi = pe.window_us(events, STEP_RANGE)
    evs = pe.device_events(events, cuda)
    # NOTE: verbose=True is what puts the Python stack on the events in torch releases before with_stack alone did
    with profile(activities=acts, with_stack=True, experimental_config=_ExperimentalConfig(verbose=True)) as sp:
        stack_ms = step()
    stack_events = sp.events()
    python = pe.top_python(stack_events, top)
    n_python = len(pe.python_events(stack_events))
    source = f"torch.profiler with_stack ({n_python} Python function events)"
    if not python:
        python, whole = cprofile_python(step, top)
        source = (f"cProfile of one more step (the with_stack profile had {n_python} Python function events, "
                  "none in graphpool)")
        if not whole:
            source += (f"; cProfile lost the frames above {LOST_FRAMES_NOTE}, so the step's own and the runner's "
                       "frames are missing")
    busy = pe.union_us(evs, lo, hi)
    n_launch, launch_us = pe.launch_stats(events, lo, hi)
    count_prefill_ops(engine, list(MIXED_PROMPTS), seed=0)  # warm-up: the mixed lengths' first step
    counts = [count_prefill_ops(engine, [n_tokens], seed=1), count_prefill_ops(engine, list(MIXED_PROMPTS), seed=2)]
    return PrefillProfile(
        prompt_tokens=n_tokens, first_step_ms=first, warm_step_ms=median(timed), timed_steps=reps,
        profiled_step_ms=(hi - lo) / 1e3, kernels=len(evs), kernel_ms=sum(e.dur_us for e in evs) / 1e3,
        busy_ms=busy / 1e3, idle_share=1.0 - busy / max(hi - lo, 1e-9), stack_step_ms=stack_ms,
        top_kernels=pe.kernel_table(evs, 1, engine.model_config.num_layers)[:top],
        top_ops=pe.top_ops(events, top), top_python=python, launches=n_launch, launch_host_us=launch_us,
        python_source=source, stack_python_events=n_python, op_counts=counts,
    )


def cprofile_python(step: Callable[[], float], top: int) -> tuple[list[tuple[str, int, float]], bool]:
    """top_python's table from cProfile (the standard library's tracer) around one step: (function, calls,
    inclusive us), named like top_python names them, `engine/runner.py(66): prefill`; and whether the profile
    is whole (it holds the profiled function itself: the outermost frame)."""
    prof = cProfile.Profile()
    prof.runcall(step)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, func), (_, calls, _, cum_s, _) in stats.items():
        frame = pe.graphpool_frame(f"{path}({line}): {func}")
        if frame is not None:
            rows.append((frame, int(calls), cum_s * 1e6))
    code = getattr(step, "__code__", None)
    whole = code is None or any(f == code.co_name and path == code.co_filename for path, _, f in stats)
    return sorted(rows, key=lambda r: -r[2])[:top], whole


def prefill_markdown(p: PrefillProfile, cuda: bool) -> str:
    dev = "GPU kernels" if cuda else "CPU ops (no CUDA: they stand in for kernels; self times)"
    idle = "GPU idle" if cuda else "outside any op (host Python, scheduling)"
    busy = "the GPU is busy (a kernel runs)" if cuda else "inside an op"
    # the host's share of a launch: the step's wall over its launches holds the Python, the op dispatch and
    # the launch call itself; the launch calls alone are the runtime/driver API time
    launch_rows = [
        ["kernel launch calls (cudaLaunchKernel, cuLaunchKernelEx, ... in the step)", p.launches],
        ["profiled step wall per launch, us", 1e3 * p.profiled_step_ms / p.launches],
        ["host time in the launch calls, ms (per launch, us)",
         f"{p.launch_host_us / 1e3:.3g} ({p.launch_host_us / p.launches:.3g})"],
    ] if p.launches else []
    out = [f"### Prefill step: one prompt of {p.prompt_tokens} tokens\n\n", md_table(["what", "value"], [
        ["first step of this length, ms (may JIT-compile Triton kernels)", p.first_step_ms],
        [f"warm step wall, ms (median of {p.timed_steps}, no profiler)", p.warm_step_ms],
        ["profiled step wall, ms", p.profiled_step_ms],
        [f"{dev} launched", p.kernels],
        [f"sum of {dev} time, ms", p.kernel_ms],
        [f"time covered by {dev}, ms", p.busy_ms],
        [f"share of the step {busy}", f"{100 * (1 - p.idle_share):.1f}%"],
        [f"share of the step {idle}", f"{100 * p.idle_share:.1f}%"],
        *launch_rows,
        ["step wall under with_stack (Python tracing), ms", p.stack_step_ms],
    ])]
    if p.op_counts:
        out.append("\naten ops dispatched by one prefill step (a TorchDispatchMode counter, no profiler; "
                   "Triton launches are no aten ops):\n\n")
        out.append(md_table(["prompts (tokens)", "step", "per layer", "attention stage per layer", "outside layers"],
                            [[f"{len(c.prompt_lens)} ({sum(c.prompt_lens)})", c.step_ops, c.per_layer,
                              sum(c.attention_ops) / len(c.attention_ops), c.outside_layers] for c in p.op_counts]))
    out.append(f"\nTop {dev} by time:\n\n")
    out.append(md_table(["name", "kind", "count", "us", "share %"],
                        [[r.name, r.kind, r.per_step, r.us_per_step, r.share_pct] for r in p.top_kernels]))
    out.append("\nHost: ops by self CPU time (profiler, no stack; CUDA runtime calls included):\n\n")
    out.append(md_table(["op", "calls", "self CPU us"], [list(r) for r in p.top_ops]))
    out.append(f"\nHost: graphpool's Python functions by inclusive CPU time (from {p.python_source}; inclusive, "
               "so a caller holds its callees):\n\n")
    out.append(md_table(["function", "calls", "inclusive CPU us"], [list(r) for r in p.top_python]))
    return "".join(out)


@torch.inference_mode()
def run_prefill(loaded: LoadedModel, name: str, cfg: Any, max_len: int) -> PrefillProfile:
    engine = prefill_engine(loaded, name, cfg, max_len)
    return profile_prefill(engine, cfg.prefill_tokens, cfg.warmup, cfg.reps, cfg.top)
