"""`bench serve` results: one summary per (configuration, seed), median and min-max over seeds, the targets,
and the JSON / Markdown / ITL-CDF report."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from graphpool.bench import common
from graphpool.bench.common import MIB, md_table, median, percentile
from graphpool.bench.latency import all_itls_ms
from graphpool.bench.serve.attribution import split_client_stalled
from graphpool.bench.serve.configs import config_order

# serving-time deltas of the pool's counters (after the run minus right after start-up)
DELTA_KEYS = ("captures", "hits", "padded_hits", "misses", "evictions", "eager_steps", "fallbacks")
# the engine's counters over the run (graphpool's and vLLM's alike: serve/server.VLLM_COUNTERS)
ENGINE_KEYS = ("generation_tokens", "prompt_tokens", "preemptions", "requests_finished")


@dataclass(frozen=True)
class RunSummary:
    config: str  # the configuration's name (serve/configs.py)
    label: str
    seed: int
    model: str
    rate: float
    trace_s: float
    requests: int
    errors: int
    itl_gaps: int
    output_tokens: int
    output_tok_s: float
    ttft_ms: dict[str, float]  # p50 / p99 / p99.9
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    itl_max_ms: float
    startup_s: float  # process start to GET /health 200 (NaN for --url)
    startup_capture_s: float  # graphpool_graph_capture_seconds right after start-up (0 when graphs are off)
    startup_captures: float
    serving: dict[str, float]  # DELTA_KEYS: after the run minus after start-up
    resident_graphs: float
    resident_mib: float
    prompt_tokens_mean: float
    max_in_flight: int
    stop_s: float
    killed: bool
    errors_sample: list[str] = field(default_factory=list)
    # client-side gaps over 10 ms by cause, from the server's step timeline (serve/attribution.attribute)
    gap_causes: dict[str, Any] = field(default_factory=dict)
    client_loop_lag_ms: dict[str, float] = field(default_factory=dict)  # p50 / p99 / max lateness of a 10-ms timer
    client_cpu_share: float = math.nan  # client CPU time / wall time (1.0 = one core busy)
    client_processes: int = 1
    temperature: float = 0.0  # the workload's sampling temperature (0: greedy)
    server: str = "graphpool"  # or "vllm" (a foreign server)
    graphs: float = math.nan  # graphpool: resident after the run; vLLM: captured at start-up (its log)
    graph_mib: float = math.nan  # graphpool: resident bytes (arena included); vLLM: what its log says capture took
    arena_mib: float = math.nan  # graphpool: the resident graphs' shared arena (part of graph_mib)
    startup_phases: dict[str, float] = field(default_factory=dict)  # seconds by phase, where the server says
    engine: dict[str, float] = field(default_factory=dict)  # ENGINE_KEYS over the run, where published
    itl_first_ms: dict[str, float] = field(default_factory=dict)  # each request's first gap (the step after its prefill)
    # the TTFTs of requests whose wait overlapped no client loop stall of >= 10 ms, and how many did overlap one
    ttft_unstalled_ms: dict[str, float] = field(default_factory=dict)
    ttft_client_stalled: int = 0


def pcts(xs: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(xs, 50), "p99": percentile(xs, 99), "p99.9": percentile(xs, 99.9)}


def group_key(run: RunSummary) -> str:
    """A configuration under one workload: its name, with the temperature when it samples."""
    return run.config if run.temperature == 0 else f"{run.config}@T{run.temperature:g}"


def run_stem(config: str, seed: int, temperature: float) -> str:
    """A run's file name under <out>/runs (greedy runs keep the name they had before temperatures)."""
    return f"{config}-seed{seed}" if temperature == 0 else f"{config}-t{temperature:g}-seed{seed}"


def summarize_run(config: str, label: str, seed: int, model: str, rate: float, trace_s: float, client: Any,
                  before: Mapping[str, float], after: Mapping[str, float], startup_s: float, stop: tuple[float, bool],
                  gap_causes: Mapping[str, Any] | None = None, *, boot: Mapping[str, float] | None = None,
                  temperature: float = 0.0, server: str = "graphpool", log_info: Any = None
                  ) -> tuple[RunSummary, list[float]]:
    """A run's summary and its ITLs in ms (``client``: serve_client.ClientRun; ``boot``: /metrics right after
    start-up, default ``before``; ``log_info``: a foreign server's foreign.VllmLogInfo)."""
    boot = before if boot is None else boot
    ok = [r for r in client.results if r.error is None]
    itls = all_itls_ms([r.timeline for r in ok])
    ttfts = [t * 1e3 for r in ok if (t := r.timeline.ttft()) is not None]
    unstalled, stalled = split_client_stalled(ok, getattr(client, "late_spans", []),
                                              getattr(client, "t0_monotonic", 0.0))
    tokens = sum(r.completion_tokens for r in client.results)
    summary = RunSummary(
        config=config, label=label, seed=seed, model=model, rate=rate, trace_s=trace_s,
        requests=len(client.results), errors=len(client.results) - len(ok), itl_gaps=len(itls),
        output_tokens=tokens, output_tok_s=tokens / client.duration_s if client.duration_s > 0 else math.nan,
        ttft_ms=pcts(ttfts), itl_ms=pcts(itls), e2e_ms=pcts([r.e2e_s() * 1e3 for r in ok]),
        itl_max_ms=max(itls) if itls else math.nan, startup_s=startup_s,
        startup_capture_s=boot.get("capture_seconds", 0.0), startup_captures=boot.get("captures", math.nan),
        # NOTE: no pool series (graphs off): NaN, shown as "-", not a count of 0
        serving={k: after.get(k, math.nan) - before.get(k, 0.0) for k in DELTA_KEYS},
        resident_graphs=after.get("resident", math.nan), resident_mib=after.get("resident_bytes", math.nan) / MIB,
        prompt_tokens_mean=sum(r.prompt_tokens for r in ok) / len(ok) if ok else math.nan,
        max_in_flight=client.max_in_flight, stop_s=stop[0], killed=stop[1], errors_sample=client.errors_sample,
        gap_causes=dict(gap_causes or {}),
        client_loop_lag_ms={"p50": percentile(client.loop_lag_ms, 50), "p99": percentile(client.loop_lag_ms, 99),
                            "max": max(client.loop_lag_ms, default=math.nan)},
        client_cpu_share=client.cpu_share, client_processes=getattr(client, "processes", 1),
        temperature=temperature, server=server, **_graph_facts(after, boot, log_info),
        engine={k: after[k] - before.get(k, 0.0) for k in ENGINE_KEYS if k in after},
        itl_first_ms=pcts([g[0] * 1e3 for r in ok if (g := r.timeline.itls())]),
        ttft_unstalled_ms=pcts(unstalled), ttft_client_stalled=stalled,
    )
    return summary, itls


def _graph_facts(after: Mapping[str, float], boot: Mapping[str, float], log_info: Any) -> dict[str, Any]:
    """Graph count, graph memory and start-up phases: from the server's log (foreign) or its /metrics."""
    from graphpool.bench.serve.server import PHASE_PREFIX

    if log_info is not None:
        return {"graphs": log_info.graphs, "graph_mib": log_info.graph_gib * 1024,
                "startup_phases": dict(log_info.phases)}
    return {"graphs": after.get("resident", math.nan), "graph_mib": after.get("resident_bytes", math.nan) / MIB,
            "arena_mib": after.get("arena_bytes", math.nan) / MIB,
            "startup_phases": {k.removeprefix(PHASE_PREFIX): v for k, v in boot.items() if k.startswith(PHASE_PREFIX)}}


def _restore_nan(v: Any) -> Any:
    """JSON holds NaN as null (common._jsonable); a run read back has its NaNs again."""
    if isinstance(v, dict):
        return {k: _restore_nan(x) for k, x in v.items()}
    return math.nan if v is None else v


def load_runs(runs_dir: Path) -> list[RunSummary]:
    runs = [RunSummary(**{k: _restore_nan(v) for k, v in json.loads(p.read_text()).items()})
            for p in sorted(runs_dir.glob("*.json"))]
    shapes = {(r.model, r.rate, r.trace_s) for r in runs}
    if len(shapes) > 1:
        raise ValueError(f"{runs_dir} holds runs of different models/rates/durations {sorted(shapes)}: "
                         "give each its own --out")
    return runs


def save_run(runs_dir: Path, run: RunSummary, itls_ms: Sequence[float]) -> Path:
    import numpy as np

    runs_dir.mkdir(parents=True, exist_ok=True)
    stem = run_stem(run.config, run.seed, run.temperature)
    np.save(runs_dir / f"{stem}.itl.npy", np.asarray(itls_ms, dtype=np.float32))
    path = runs_dir / f"{stem}.json"
    path.write_text(json.dumps(common._jsonable(asdict(run)), indent=1) + "\n")
    return path


def _get(run: RunSummary, key: str) -> float:
    """A number of a run by dotted key: 'itl_ms.p99.9' style for the dicts (split on the first dot)."""
    head, _, rest = key.partition(".")
    v = getattr(run, head)
    return float(v.get(rest, math.nan) if rest else v)


def spread(runs: Sequence[RunSummary], key: str) -> tuple[float, float, float]:
    """(median, min, max) over seeds, NaNs left out."""
    xs = [x for r in runs if not math.isnan(x := _get(r, key))]
    return (median(xs), min(xs), max(xs)) if xs else (math.nan, math.nan, math.nan)


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _cell(runs: Sequence[RunSummary], key: str) -> str:
    m, lo, hi = spread(runs, key)
    if math.isnan(m):
        return "-"
    return _num(m) if len(runs) == 1 or lo == hi else f"{_num(m)} [{_num(lo)}-{_num(hi)}]"


@dataclass(frozen=True)
class Target:
    name: str
    met: bool | None  # None: cannot be judged from these runs
    detail: str

    def line(self) -> str:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[self.met]
        return f"- {verdict}: {self.name} ({self.detail})"


def evaluate_targets(by_config: Mapping[str, Sequence[RunSummary]]) -> list[Target]:
    """The targets on medians over seeds: capture-all, LightLLM's LRU pool (lru16-capture-on-miss) and graphpool's
    default."""
    errors = sum(r.errors for rs in by_config.values() for r in rs)
    runs = sum(len(rs) for rs in by_config.values())
    out = [Target("0 errors", errors == 0 if runs else None, f"{errors} errors in {runs} runs")]
    b, c, d = (by_config.get(k, ()) for k in ("capture-all", "lru16-capture-on-miss", "default"))

    def med(rs: Sequence[RunSummary], key: str) -> float:
        return spread(rs, key)[0]

    if b and d:
        pb, pd = med(b, "itl_ms.p99.9"), med(d, "itl_ms.p99.9")
        ok = None if math.isnan(pb) or math.isnan(pd) else pd <= 1.1 * pb
        out.append(Target("default ITL p99.9 <= 1.1x capture-all's", ok,
                          f"{pd:.2f} ms vs {pb:.2f} ms: {common.ratio(pd, pb):.2f}x"))
        sb, sd = med(b, "startup_capture_s"), med(d, "startup_capture_s")
        ok = None if math.isnan(sb) or math.isnan(sd) or sb <= 0 else sd <= 0.1 * sb
        out.append(Target("default start-up capture time <= 10% of capture-all's", ok,
                          f"{sd:.2f} s vs {sb:.2f} s (graphpool_graph_capture_seconds after start-up): "
                          f"{100 * common.ratio(sd, sb):.1f}%"))
    else:
        out.append(Target("default vs capture-all (ITL p99.9, start-up capture)", None, "needs configs capture-all and default"))
    if c and d:
        cc, cd = med(c, "serving.captures"), med(d, "serving.captures")
        ok = None if cc == 0 or math.isnan(cc) or math.isnan(cd) else cc >= 5 * cd
        out.append(Target(">= 5x fewer captures while serving than LightLLM's LRU", ok,
                          f"default {cd:.0f} vs LightLLM {cc:.0f}" + (f": {cc / cd:.1f}x fewer" if cd else "")))
    else:
        out.append(Target(">= 5x fewer captures while serving than LightLLM's LRU", None, "needs configs lru16-capture-on-miss and default"))
    return out


COLUMNS = [
    ("seeds", None), ("errors", "errors"), ("start-up s", "startup_s"), ("start-up capture s", "startup_capture_s"),
    ("TTFT p50 ms", "ttft_ms.p50"), ("TTFT p99", "ttft_ms.p99"), ("TTFT p99.9", "ttft_ms.p99.9"),
    ("TTFTs over a client stall", "ttft_client_stalled"), ("TTFT p99 without them", "ttft_unstalled_ms.p99"),
    ("ITL p50 ms", "itl_ms.p50"), ("ITL p99", "itl_ms.p99"), ("ITL p99.9", "itl_ms.p99.9"),
    ("ITL max", "itl_max_ms"), ("first ITL p50", "itl_first_ms.p50"), ("E2E p50 ms", "e2e_ms.p50"), ("E2E p99", "e2e_ms.p99"),
    ("E2E p99.9", "e2e_ms.p99.9"), ("output tok/s", "output_tok_s"), ("ITL gaps", "itl_gaps"),
    ("captures serving", "serving.captures"), ("hits", "serving.hits"), ("padded hits", "serving.padded_hits"),
    ("misses", "serving.misses"), ("evictions", "serving.evictions"), ("eager steps", "serving.eager_steps"),
    ("resident graphs", "resident_graphs"), ("resident MiB", "resident_mib"),
    ("client processes", "client_processes"), ("client loop lag p99 ms", "client_loop_lag_ms.p99"),
    ("client CPU", "client_cpu_share"),
]


def markdown(by_config: Mapping[str, Sequence[RunSummary]], targets: Sequence[Target], png: str | None) -> str:
    first = next(r for rs in by_config.values() for r in rs)
    rows = [[f"({k}) {rs[0].label}", len(rs), *(_cell(rs, key) for _, key in COLUMNS[1:])]
            for k, rs in by_config.items()]
    body = (f"Model `{first.model}`, Poisson {first.rate:g} req/s for {first.trace_s:g} s per run; each cell is the "
            "median over seeds [min-max]. Latencies are client-side (openai AsyncOpenAI, streamed completions); "
            "ITL = gaps between streamed chunks that carry tokens; captures and the other pool counters are "
            "/metrics after the run minus /metrics right before it (after start-up, the warm-up graphs a server "
            "captures while idle after ready, one warm-up completion and each client process's untimed request); "
            "a TTFT over a client stall is a request whose wait for its first token overlapped 10 ms or more of "
            "its client process's event loop waking late; `@T0.8`: the workload sampled at temperature 0.8.\n\n")
    body += md_table(["configuration", *(c for c, _ in COLUMNS)], rows)
    body += "\nTargets (medians over seeds):\n\n" + "\n".join(t.line() for t in targets) + "\n"
    samples = [f"({r.config}) seed {r.seed}: {e}" for rs in by_config.values() for r in rs for e in r.errors_sample]
    if samples:
        body += "\nErrors (first of each kind):\n\n" + "\n".join(f"- {s}" for s in samples[:20]) + "\n"
    body += _attribution_section(by_config)
    if png:
        body += f"\n![ITL CDFs]({png})\n"
    return body


def _attribution_section(by_config: Mapping[str, Sequence[RunSummary]]) -> str:
    from graphpool.bench.serve.attribution import cause_table, merge, step_table

    causes = {f"({k}) {rs[0].label}": merge([r.gap_causes for r in rs if r.gap_causes])
              for k, rs in by_config.items() if any(r.gap_causes for r in rs)}
    if not causes:
        return ""
    steps = {f"({k}) {rs[0].label}, seed {r.seed}": r.gap_causes["steps"]
             for k, rs in by_config.items() for r in [r for r in rs if r.gap_causes][:1]}
    return ("\nWhere the client's inter-token gaps over 10 ms come from (every seed with a server step timeline; "
            "each gap counted under its largest part, in brackets each cause's share of those gaps' time; "
            "bench/serve/attribution.py says how):\n\n" + cause_table(causes)
            + "\nThe server's steps (GET /debug/steps; host ms = the engine thread's wall time of a step, device "
            "ms = its forward's GPU time):\n\n" + step_table(steps))


Section = Callable[[Sequence[RunSummary], Path, bool], tuple[str, dict[str, Any]]]


def write_serve_report(out_dir: Path, env: common.EnvInfo, extra: Mapping[str, Any], plot: bool = True,
                       section: Section | None = None) -> tuple[dict[str, Any], str, list[Target]]:
    """Reads every run under <out>/runs, writes serve.json, serve.md and serve_itl_cdf.png; ``section``: one
    more part of the report (Markdown after the table, JSON keys) from the runs (serve/compare.section)."""
    import numpy as np

    runs = load_runs(out_dir / "runs")
    if not runs:
        raise ValueError(f"no runs under {out_dir / 'runs'}")
    by_config: dict[str, list[RunSummary]] = {}
    for r in sorted(runs, key=lambda r: (r.temperature, config_order(r.config), r.seed)):
        by_config.setdefault(group_key(r), []).append(r)
    targets = evaluate_targets(by_config)
    png = None
    if plot:
        from graphpool.bench.plots import plot_itl_cdfs

        # NOTE: a run saved without its gaps (e.g. rebuilt from a report) is left out of the plot only
        files = {k: [f for r in rs if (f := out_dir / "runs" / f"{run_stem(r.config, r.seed, r.temperature)}.itl.npy"
                                          ).exists()]
                 for k, rs in by_config.items()}
        itls = {f"({k}) {rs[0].label}": [float(x) for f in files[k] for x in np.load(f)]
                for k, rs in by_config.items() if files[k]}
        png = plot_itl_cdfs({f"{runs[0].model} @ {runs[0].rate:g} req/s": itls}, out_dir / "serve_itl_cdf.png").name
    body = markdown(by_config, targets, png)
    more_md, more_json = section([r for rs in by_config.values() for r in rs], out_dir, plot) if section else ("", {})
    body += more_md
    aggregate = {k: {key: spread(rs, key) for _, key in COLUMNS if key is not None} for k, rs in by_config.items()}
    results = {**extra, **more_json, "runs": runs, "aggregate_median_min_max": aggregate,
               "targets": [asdict(t) for t in targets]}
    common.write_report(out_dir, "serve", env, results, body, "Serving benchmark: a live server, client-side latencies")
    return results, body, targets
