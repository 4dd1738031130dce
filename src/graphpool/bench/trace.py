"""`graphpool bench trace`: a serving trace replayed through the real engine under several graph policies."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graphpool.bench import common
from graphpool.bench.common import MIB, md_table, progress, ratio
from graphpool.bench.latency import LatencySummary, WorkingSet, all_itls_ms, summarize_latency, working_set
from graphpool.bench.replay import ReplayResult, replay_trace
from graphpool.bench.workload import TraceConfig, generate_trace, summarize_trace
from graphpool.engine.config import EngineConfig


@dataclass(frozen=True)
class ServingConfig:
    key: str
    label: str
    overrides: dict[str, Any]  # EngineConfig fields


def serving_configs(ladder: Sequence[int], budget_bytes: int) -> list[ServingConfig]:
    """The policies under test, as EngineConfig overrides (graphpool's are named explicitly so the bench
    measures them whatever the defaults become)."""
    from graphpool.pool import PoolConfig

    all_sizes = tuple(ladder)  # NOTE: explicit sizes: "capture every size", whatever "all" means to the engine
    n = len(ladder)
    # NOTE: the seed captures every size at start-up and its LRU then keeps the 16 smallest; warming exactly
    # those gives the same resident set (its start-up capture time is then understated, not overstated).
    seed_resident = tuple(sorted(ladder)[:16])
    pool_defaults = PoolConfig()
    cover = tuple(pool_defaults.ladder().padding_cover(pool_defaults.max_padding_ratio)[:16])
    capture = {"graph_miss_policy": "capture", "graph_mempool": "shared"}
    ours = {"graph_miss_policy": "admit", "graph_mempool": "per_graph"}
    return [
        ServingConfig("a", "no graphs", {"disable_cudagraph": True}),
        ServingConfig("b", "capture all at start-up", {"max_graph_pool_size": n, "graph_warmup": all_sizes, **capture}),
        ServingConfig("c", "lazy, unbounded", {"max_graph_pool_size": n, "graph_warmup": "none", **capture}),
        ServingConfig("d", "seed: LRU 16", {"max_graph_pool_size": 16, "graph_warmup": seed_resident, **capture}),
        ServingConfig("e", "graphpool (admit, per_graph)", {**ours, "graph_warmup": "none"}),
        ServingConfig("f", f"graphpool + budget {budget_bytes // MIB} MiB",
                      {**ours, "graph_warmup": "none", "graph_memory_budget": budget_bytes}),
        ServingConfig("g", f"graphpool + warm cover ({len(cover)})", {**ours, "graph_warmup": cover}),
    ]


@dataclass
class RunResult:
    config: str
    label: str
    rate: float
    startup_s: float  # engine construction (model load, KV cache, warm-up captures)
    startup_capture_s: float  # capture seconds spent during start-up
    tokens_per_s: float
    latency: LatencySummary
    working_set: WorkingSet
    hit_rate: float  # (hits + padded hits) / decode steps through the pool, while serving
    captures_serving: int
    evictions_serving: int
    peak_graph_mib: float  # accounted resident bytes, max over every step
    driver_delta_mib: float  # device memory in use at the end minus config (a)'s at the same load
    driver_start_mib: float
    driver_end_mib: float
    graph_steps: int
    decode_steps: int
    aborted: int
    stats_end: dict[str, Any] | None = None
    itls_ms: list[float] = field(default_factory=list, repr=False)


def _delta(end: dict[str, Any] | None, start: dict[str, Any] | None, key: str) -> int:
    if end is None or start is None:
        return 0
    return int(end[key]) - int(start[key])


def summarize_run(sc: ServingConfig, rate: float, startup_s: float, rr: ReplayResult, ladder: Sequence[int],
                  window: int) -> RunResult:
    s0, s1 = rr.stats_start, rr.stats_end
    steps = _delta(s1, s0, "steps")
    replayed = _delta(s1, s0, "hits") + _delta(s1, s0, "padded_hits")
    lat = summarize_latency(rr.timelines)
    return RunResult(
        config=sc.key, label=sc.label, rate=rate, startup_s=startup_s,
        startup_capture_s=float(s0["capture_seconds_total"]) if s0 else 0.0,
        tokens_per_s=lat.output_tokens / rr.duration_s if rr.duration_s > 0 else math.nan,
        latency=lat, working_set=working_set(rr.decode_batch_sizes, ladder, window),
        hit_rate=replayed / steps if steps else math.nan,
        captures_serving=_delta(s1, s0, "captures"), evictions_serving=_delta(s1, s0, "evictions"),
        peak_graph_mib=rr.peak_resident_bytes / MIB, driver_delta_mib=math.nan,
        driver_start_mib=rr.driver_used_start_mib, driver_end_mib=rr.driver_used_end_mib,
        graph_steps=rr.decode_graph_steps, decode_steps=len(rr.decode_batch_sizes), aborted=rr.aborted,
        stats_end=s1, itls_ms=all_itls_ms(rr.timelines),
    )


@dataclass(frozen=True)
class TraceBenchConfig:
    model: str = "random:llama3.2-1b"
    rates: tuple[float, ...] = (4.0, 16.0, 40.0)
    duration_s: float = 10.0
    configs: tuple[str, ...] = tuple("abcdefg")
    budget_mib: int = 256
    kv_gib: float = 8.0
    max_model_len: int = 2048
    prompt_mean: float = 300.0
    prompt_cap: int = 1024
    output_mean: float = 256.0
    output_cap: int = 1024
    window: int = 1000  # decode steps over which the batch-size working set is counted
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if not self.rates or any(not r > 0 for r in self.rates):
            raise ValueError(f"trace bench: rates must be > 0 requests/s, got {self.rates}")
        unknown = set(self.configs) - set("abcdefg")
        if unknown or not self.configs:
            raise ValueError(f"trace bench: configs are letters a-g, got {self.configs}")
        if self.prompt_cap + self.output_cap > self.max_model_len:
            raise ValueError(f"prompt_cap + output_cap ({self.prompt_cap + self.output_cap}) must fit "
                             f"max_model_len ({self.max_model_len})")
        if not (self.duration_s > 0 and self.kv_gib > 0 and self.budget_mib > 0):
            raise ValueError("trace bench: duration_s, kv_gib and budget_mib must be > 0")

    def trace_config(self, rate: float) -> TraceConfig:
        return TraceConfig(rate=rate, duration_s=self.duration_s, prompt_mean=self.prompt_mean,
                           prompt_cap=self.prompt_cap, output_mean=self.output_mean, output_cap=self.output_cap,
                           seed=self.seed)

    def engine_config(self, overrides: dict[str, Any]) -> EngineConfig:
        from graphpool.engine.kv_cache import kv_bytes_per_block
        from graphpool.model.presets import get_preset

        base = EngineConfig(model=self.model, device=self.device, dtype=self.dtype,
                            max_model_len=self.max_model_len)
        per_block = kv_bytes_per_block(get_preset(self.model.removeprefix("random:")), base.block_size,
                                       base.torch_dtype)
        # NOTE: a fixed KV cache, the same for every configuration, so memory deltas are the graphs' own.
        blocks = max(2, int(self.kv_gib * (1 << 30)) // per_block)
        return EngineConfig(model=self.model, device=self.device, dtype=self.dtype, max_model_len=self.max_model_len,
                            num_kv_blocks=blocks, seed=self.seed, profile_steps=False, **overrides)


def warm_process(cfg: TraceBenchConfig) -> float:
    """One untimed eager engine run first, so that one-time costs of the process (Triton JIT compiles for
    each specialization, cuBLAS handles) do not land in whichever configuration happens to run first.
    Decode batches shrink 17 -> 1, covering the kernels' batch-size specializations."""
    from graphpool.engine.engine import LLMEngine
    from graphpool.engine.sampling import SamplingParams

    t0 = time.perf_counter()
    engine = LLMEngine(cfg.engine_config({"disable_cudagraph": True}))
    with torch.inference_mode():
        for i in range(17):
            engine.add_request(f"w{i}", list(range(100, 108 + i)), SamplingParams(temperature=0.0, max_tokens=i + 2,
                                                                                   ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    del engine
    common.free_device_memory(common.resolve_device(cfg.device))
    return time.perf_counter() - t0


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
        with torch.inference_mode():
            rr = replay_trace(engine, trace, cfg.duration_s, seed=cfg.seed)
    finally:
        del engine
        common.free_device_memory(device)
    run = summarize_run(sc, rate, startup, rr, ladder, cfg.window)
    lat = run.latency
    progress(f"  [{sc.key}] {sc.label} @ {rate:g} req/s: start-up {startup:.1f} s, {run.tokens_per_s:.0f} tok/s, "
             f"ITL p50/p99/max {lat.itl_p50_ms:.1f}/{lat.itl_p99_ms:.1f}/{lat.itl_max_ms:.0f} ms, "
             f"captures {run.captures_serving}, buckets {run.working_set.distinct_buckets} "
             f"(window max {run.working_set.max_window_buckets}), mean batch {run.working_set.mean_batch:.1f}")
    return run


def markdown(runs: Sequence[RunResult], traces: dict[float, dict[str, float]], cfg: TraceBenchConfig) -> str:
    out = [f"Model {cfg.model}, {cfg.duration_s:g} s of Poisson arrivals per run (requests still running at the "
           f"end are aborted), lognormal prompt (mean {cfg.prompt_mean:g}, cap {cfg.prompt_cap}) and output "
           f"(mean {cfg.output_mean:g}, cap {cfg.output_cap}) lengths, seed {cfg.seed}, greedy, ignore_eos. "
           "ITL = time between a request's consecutive tokens; 'buckets' = distinct graph batch sizes the "
           f"decode steps touched (whole run / most within {cfg.window} decode steps).\n\n"]
    out.append(md_table(["rate req/s", "requests", "prompt mean", "output mean", "output p99"],
                        [[r, t["requests"], t.get("prompt_mean", 0), t.get("output_mean", 0), t.get("output_p99", 0)]
                         for r, t in traces.items()]))
    for rate in dict.fromkeys(r.rate for r in runs):
        mine = [r for r in runs if r.rate == rate]
        base_b = next((r for r in mine if r.config == "b"), None)
        out.append(f"\n## {rate:g} requests/s\n\n")
        # NOTE: the config with the most decode steps ((b) on a tie): one that starves decode says nothing
        ref = max(mine, key=lambda r: (r.decode_steps, r.config == "b"))
        ws = ref.working_set
        over = "exceeds" if ws.max_window_buckets > 16 else "fits within"
        out.append(f"Working set under ({ref.config}) {ref.label} (the config with the most decode steps, "
                   f"{ref.decode_steps}): {ws.distinct_buckets} buckets touched, {ws.max_window_buckets} "
                   f"within {ws.window} decode steps, mean batch {ws.mean_batch:.1f}: {over} a pool of 16.\n\n")
        out.append(md_table(
            ["config", "start-up s", "start-up capture s", "tok/s", "ITL p50 ms", "ITL p99 ms", "ITL p99.9 ms",
             "ITL max ms", "TTFT p99 ms", "p99 ITL / (b)", "peak graph MiB", "driver delta MiB", "hit rate",
             "captures serving", "evictions", "buckets (window)", "mean batch", "finished/started/requests"],
            [[f"({r.config}) {r.label}", r.startup_s, r.startup_capture_s, r.tokens_per_s, r.latency.itl_p50_ms,
              r.latency.itl_p99_ms, r.latency.itl_p999_ms, r.latency.itl_max_ms, r.latency.ttft_p99_ms,
              ratio(r.latency.itl_p99_ms, base_b.latency.itl_p99_ms) if base_b else math.nan,
              r.peak_graph_mib, r.driver_delta_mib, r.hit_rate, r.captures_serving, r.evictions_serving,
              f"{r.working_set.distinct_buckets} ({r.working_set.max_window_buckets})", r.working_set.mean_batch,
              f"{r.latency.finished}/{r.latency.started}/{r.latency.requests}"] for r in mine],
        ))
    return "".join(out)


def run_trace_bench(cfg: TraceBenchConfig, out_dir: Path, argv: Sequence[str] | None = None) -> dict[str, Any]:
    device = common.resolve_device(cfg.device)
    env = common.collect_env(argv, device)
    print(env.header_markdown(), flush=True)
    probe = cfg.engine_config({})
    ladder = list(probe.pool_config().ladder().sizes)
    configs = [c for c in serving_configs(ladder, cfg.budget_mib * MIB) if c.key in cfg.configs]
    progress(f"trace bench on {env.gpu}: {len(cfg.rates)} loads x {len(configs)} configs x {cfg.duration_s:g} s")
    progress(f"process warm-up (untimed eager run): {warm_process(cfg):.1f} s")
    runs: list[RunResult] = []
    traces: dict[float, dict[str, float]] = {}
    results: dict[str, Any] = {}
    body = ""
    for rate in cfg.rates:
        traces[rate] = summarize_trace(generate_trace(cfg.trace_config(rate)), cfg.duration_s)
        mine = [run_one(cfg, sc, rate, ladder) for sc in configs]
        base = next((r for r in mine if r.config == "a"), None)
        for r in mine:
            r.driver_delta_mib = r.driver_end_mib - base.driver_end_mib if base else math.nan
        runs += mine
        # NOTE: rewritten after every load level, so a run cut short still leaves its numbers.
        results, body = _write(runs, traces, cfg, ladder, env, out_dir)
    print(body, flush=True)
    return results


def _write(runs: list[RunResult], traces: dict[float, dict[str, float]], cfg: TraceBenchConfig,
           ladder: list[int], env: common.EnvInfo, out_dir: Path) -> tuple[dict[str, Any], str]:
    from graphpool.bench.plots import plot_itl_cdfs

    rates = list(dict.fromkeys(r.rate for r in runs))
    per_load = {f"{rate:g} req/s": {f"({r.config}) {r.label}": r.itls_ms for r in runs if r.rate == rate}
                for rate in rates}
    png = plot_itl_cdfs(per_load, out_dir / "trace_itl_cdf.png")
    body = markdown(runs, traces, cfg) + f"\n![ITL CDFs]({png.name})\n"
    results = {"config": cfg, "ladder": ladder, "traces": traces,
               "runs": [{k: v for k, v in vars(r).items() if k != "itls_ms"} for r in runs]}
    common.write_report(out_dir, "trace", env, results, body, "Serving trace: graph policies side by side")
    return results, body


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="random:llama3.2-1b")
    p.add_argument("--rates", type=float, nargs="+", default=None, help="request rates (req/s), one run each")
    p.add_argument("--duration", type=float, default=None, help="seconds of trace per config x load")
    p.add_argument("--quick", action="store_true", help="~2.5 min: two loads (16 and 40 req/s), 5 s each")
    p.add_argument("--configs", default="abcdefg",
                   help="letters of the configurations: (a) no graphs, (b) capture all at start-up, (c) lazy "
                        "unbounded, (d) seed LRU 16, (e) graphpool, (f) graphpool + budget, (g) graphpool + "
                        "warm padding cover")
    p.add_argument("--budget-mib", type=int, default=256, help="graph memory budget of config (f)")
    p.add_argument("--kv-gib", type=float, default=8.0, help="KV cache size, the same for every config")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", type=Path, default=Path("results/trace"))


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    rates = args.rates or ([16.0, 40.0] if args.quick else [4.0, 16.0, 40.0])
    duration = args.duration or (5.0 if args.quick else 10.0)
    cfg = TraceBenchConfig(model=args.model, rates=tuple(rates), duration_s=duration, configs=tuple(args.configs),
                           budget_mib=args.budget_mib, kv_gib=args.kv_gib, seed=args.seed, device=args.device,
                           dtype=args.dtype)
    run_trace_bench(cfg, args.out, argv)
