"""`graphpool bench trace`: a serving trace replayed through the real engine under several graph policies."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from graphpool.bench import common
from graphpool.bench.common import MIB, progress
from graphpool.bench.trace.config import (
    CONFIG_HELP,
    CONFIG_NAMES,
    ServingConfig,
    TraceBenchConfig,
    serving_configs,
)
from graphpool.bench.trace.replay import replay_trace
from graphpool.bench.trace.report import RunResult, summarize_run, write_trace_report
from graphpool.bench.trace.warmup import WarmupReport, warm_engine
from graphpool.bench.workload import generate_trace, summarize_trace
from graphpool.engine.values import resolve_device
from graphpool.pool.gc_control import heap_frozen


def warm_process(cfg: TraceBenchConfig) -> WarmupReport:
    """One untimed eager engine run first, so that one-time costs of the process (Triton JIT compiles for
    each kernel variant, cuBLAS handles) land in no timed configuration: decode batches shrinking 17 -> 1,
    then eager decode across every context length the trace can reach (trace/warmup.py says why)."""
    from graphpool.engine.engine import LLMEngine

    engine = LLMEngine(cfg.engine_config({"disable_cudagraph": True}))
    try:
        return warm_engine(engine, cfg.max_context)
    finally:
        del engine
        common.free_device_memory(resolve_device(cfg.device))


def run_one(cfg: TraceBenchConfig, sc: ServingConfig, rate: float, ladder: Sequence[int]) -> RunResult:
    from graphpool.engine.engine import LLMEngine

    trace = generate_trace(cfg.trace_config(rate))
    ecfg = cfg.engine_config(sc.overrides)
    device = ecfg.torch_device
    common.free_device_memory(device)
    t0 = time.perf_counter()
    engine = LLMEngine(ecfg)
    common.sync(device)
    startup = time.perf_counter() - t0
    try:
        # NOTE: the heap so far frozen, as the server freezes its start-up heap: a collection then walks only what
        # the run makes, not every object earlier runs (or tests in this process) left alive
        with torch.inference_mode(), heap_frozen():
            rr = replay_trace(engine, trace, cfg.duration_s, seed=cfg.seed)
    finally:
        del engine
        common.free_device_memory(device)
    run = summarize_run(sc, rate, startup, rr, ladder, cfg.window)
    lat = run.latency
    progress(f"  [{sc.key}] {sc.label} @ {rate:g} req/s: start-up {startup:.1f} s, {run.tokens_per_s:.0f} tok/s, "
             f"ITL p50/p99/max {lat.itl_p50_ms:.1f}/{lat.itl_p99_ms:.1f}/{lat.itl_max_ms:.0f} ms, "
             f"captures {run.captures_serving}, decode/prefill steps {run.decode_steps}/{run.prefill_steps}, "
             f"buckets {run.working_set.distinct_buckets} "
             f"(window max {run.working_set.max_window_buckets}), mean batch {run.working_set.mean_batch:.1f}")
    return run


def run_trace_bench(cfg: TraceBenchConfig, out_dir: Path, argv: Sequence[str] | None = None) -> dict[str, Any]:
    device = resolve_device(cfg.device)
    env = common.collect_env(argv, device)
    print(env.header_markdown(), flush=True)
    probe = cfg.engine_config({})
    ladder = list(probe.pool_config.ladder().sizes)
    configs = [c for c in serving_configs(ladder, cfg.budget_mib * MIB) if c.key in cfg.configs]
    progress(f"trace bench on {env.gpu}: {len(cfg.rates)} loads x {len(configs)} configs x {cfg.duration_s:g} s")
    warm = warm_process(cfg)
    progress(f"process warm-up (untimed, graphs off): {warm.seconds:.1f} s, {warm.decode_steps} decode steps at "
             f"{len(warm.contexts)} context lengths up to {cfg.max_context}; slowest decode step "
             f"{warm.first_pass_max_ms:.0f} ms (JIT compiles), then {warm.second_pass_max_ms:.0f} ms on a second pass")
    runs: list[RunResult] = []
    traces: dict[float, dict[str, float]] = {}
    results: dict[str, Any] = {}
    body = ""
    for i, rate in enumerate(cfg.rates):
        traces[rate] = summarize_trace(generate_trace(cfg.trace_config(rate)), cfg.duration_s)
        mine: list[RunResult] = []
        # NOTE: the order rotates by one config per load, so no policy always runs first (or right after no-graphs)
        order = configs[i % len(configs):] + configs[:i % len(configs)]
        for sc in order:
            mine.append(run_one(cfg, sc, rate, ladder))
            mine[-1].run_order = len(mine) - 1
            base = next((r for r in mine if r.config == "no-graphs"), None)
            for r in mine:
                r.driver_delta_mib = r.driver_end_mib - base.driver_end_mib if base else math.nan
            # NOTE: rewritten after every run (the plot after every load), so a run cut short keeps its numbers
            results, body = write_trace_report(runs + mine, traces, cfg, ladder, env, out_dir, warm.as_dict(),
                                               plot=sc is order[-1])
        runs += mine
    print(body, flush=True)
    return results


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="random:llama3.2-1b",
                   help="any model the engine takes (a random:<preset>, smollm2-135m-instruct, a .gguf file, a "
                        "Hugging Face folder); prompts are token ids either way (default %(default)s)")
    p.add_argument("--rates", type=float, nargs="+", default=None, help="request rates (req/s), one run each")
    p.add_argument("--duration", type=float, default=None, help="seconds of trace per config x load")
    p.add_argument("--quick", action="store_true",
                   help="~1.5 min: two loads (16 and 40 req/s), 5 s each (default: 4, 16, 40 req/s, 8 s each, "
                        "~4 min for the 7 configs on the H200)")
    p.add_argument("--configs", nargs="+", default=list(TraceBenchConfig.configs), choices=list(CONFIG_NAMES),
                   metavar="NAME", help=f"graph policies, of: {CONFIG_HELP} (default: all)")
    p.add_argument("--budget-mib", type=int, default=256, help="graph memory budget of config budget")
    p.add_argument("--kv-gib", type=float, default=8.0, help="KV cache size, the same for every config")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", type=Path, default=Path("results/trace"))


def config_from_args(args: argparse.Namespace) -> TraceBenchConfig:
    rates = args.rates or ([16.0, 40.0] if args.quick else list(TraceBenchConfig.rates))
    duration = args.duration or (5.0 if args.quick else TraceBenchConfig.duration_s)
    return TraceBenchConfig(model=args.model, rates=tuple(rates), duration_s=duration, configs=tuple(args.configs),
                            budget_mib=args.budget_mib, kv_gib=args.kv_gib, seed=args.seed, device=args.device,
                            dtype=args.dtype)


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    run_trace_bench(config_from_args(args), args.out, argv)
