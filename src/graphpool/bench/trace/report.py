"""The trace bench's results: one RunResult per (configuration, load), its Markdown tables, JSON and plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphpool.bench import common
from graphpool.bench.common import MIB, md_table, ratio
from graphpool.bench.latency import LatencySummary, WorkingSet, all_itls_ms, summarize_latency, working_set
from graphpool.bench.trace.config import config_order
from graphpool.bench.trace.replay import ReplayResult

if TYPE_CHECKING:
    from graphpool.bench.trace.config import ServingConfig, TraceBenchConfig


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
    driver_delta_mib: float  # device memory in use at the end minus no-graphs' at the same load
    driver_start_mib: float
    driver_end_mib: float
    graph_steps: int
    decode_steps: int
    aborted: int
    prefill_steps: int = 0  # NOTE: with decode_steps, shows a config whose scheduling starved decode
    run_order: int = 0  # position among its load's runs (the order rotates by load)
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
        prefill_steps=rr.prefill_steps, stats_end=s1, itls_ms=all_itls_ms(rr.timelines),
    )


def working_set_reference(runs: Sequence[RunResult]) -> RunResult:
    """The run whose batch-size working set describes its load: the most decode steps (capture-all on a tie). A
    config that starves decode (no graphs) would say the load touches almost no buckets."""
    return max(runs, key=lambda r: (r.decode_steps, r.config == "capture-all"))


def markdown(runs: Sequence[RunResult], traces: dict[float, dict[str, float]], cfg: TraceBenchConfig) -> str:
    out = [f"Model {cfg.model}, {cfg.duration_s:g} s of Poisson arrivals per run (requests still running at the "
           f"end are aborted), lognormal prompt (mean {cfg.prompt_mean:g}, cap {cfg.prompt_cap}) and output "
           f"(mean {cfg.output_mean:g}, cap {cfg.output_cap}) lengths, seed {cfg.seed}, greedy, ignore_eos. "
           "ITL = time between a request's consecutive tokens; 'buckets' = distinct graph batch sizes the "
           f"decode steps touched (whole run / most within {cfg.window} decode steps); 'decode / prefill' = "
           "engine steps of each kind (prefill runs first, so a slow decode path shows as few decode steps).\n\n"]
    out.append(md_table(["rate req/s", "requests", "prompt mean", "output mean", "output p99"],
                        [[r, t["requests"], t.get("prompt_mean", 0), t.get("output_mean", 0), t.get("output_p99", 0)]
                         for r, t in traces.items()]))
    for rate in dict.fromkeys(r.rate for r in runs):
        mine = sorted((r for r in runs if r.rate == rate), key=lambda r: config_order(r.config))
        base_b = next((r for r in mine if r.config == "capture-all"), None)
        out.append(f"\n## {rate:g} requests/s\n\n")
        ref = working_set_reference(mine)
        ws = ref.working_set
        over = "exceeds" if ws.max_window_buckets > 16 else "fits within"
        out.append(f"Working set under ({ref.config}) {ref.label} (the config with the most decode steps, "
                   f"{ref.decode_steps}): {ws.distinct_buckets} buckets touched, {ws.max_window_buckets} "
                   f"within {ws.window} decode steps, mean batch {ws.mean_batch:.1f}: {over} a pool of 16.\n\n")
        out.append(md_table(
            ["config", "start-up s", "start-up capture s", "tok/s", "ITL p50 ms", "ITL p99 ms", "ITL p99.9 ms",
             "ITL max ms", "TTFT p99 ms", "p99 ITL / capture-all", "peak graph MiB", "driver delta MiB", "hit rate",
             "captures serving", "evictions", "decode / prefill steps", "buckets (window)", "mean batch",
             "finished/started/requests"],
            [[f"({r.config}) {r.label}", r.startup_s, r.startup_capture_s, r.tokens_per_s, r.latency.itl_p50_ms,
              r.latency.itl_p99_ms, r.latency.itl_p999_ms, r.latency.itl_max_ms, r.latency.ttft_p99_ms,
              ratio(r.latency.itl_p99_ms, base_b.latency.itl_p99_ms) if base_b else math.nan,
              r.peak_graph_mib, r.driver_delta_mib, r.hit_rate, r.captures_serving, r.evictions_serving,
              f"{r.decode_steps} / {r.prefill_steps}",
              f"{r.working_set.distinct_buckets} ({r.working_set.max_window_buckets})", r.working_set.mean_batch,
              f"{r.latency.finished}/{r.latency.started}/{r.latency.requests}"] for r in mine],
        ))
    return "".join(out)


def write_trace_report(runs: list[RunResult], traces: dict[float, dict[str, float]], cfg: TraceBenchConfig,
                       ladder: list[int], env: common.EnvInfo, out_dir: Path,
                       warmup: dict[str, Any] | None = None, plot: bool = True) -> tuple[dict[str, Any], str]:
    """Writes trace.json and trace.md (and, with `plot`, the ITL CDF plot); returns (results, Markdown)."""
    from graphpool.bench.plots import plot_itl_cdfs

    png = out_dir / "trace_itl_cdf.png"
    if plot:
        rates = list(dict.fromkeys(r.rate for r in runs))
        per_load = {f"{rate:g} req/s": {f"({r.config}) {r.label}": r.itls_ms
                                        for r in sorted(runs, key=lambda r: config_order(r.config)) if r.rate == rate}
                    for rate in rates}
        png = plot_itl_cdfs(per_load, png)
    body = markdown(runs, traces, cfg) + f"\n![ITL CDFs]({png.name})\n"
    if warmup:
        body += (f"\nBefore any timed run, an untimed process warm-up (graphs off) ran {warmup['decode_steps']} "
                 f"eager decode steps at {len(warmup['contexts'])} context lengths up to {max(warmup['contexts'])}: "
                 f"slowest step {warmup['first_pass_max_ms']:.0f} ms on the first pass (Triton JIT compiles), "
                 f"{warmup['second_pass_max_ms']:.0f} ms on the second.\n")
    results = {"config": cfg, "ladder": ladder, "traces": traces, "process_warmup": warmup,
               "runs": [{k: v for k, v in vars(r).items() if k != "itls_ms"} for r in runs]}
    common.write_report(out_dir, "trace", env, results, body, "Serving trace: graph policies side by side")
    return results, body
