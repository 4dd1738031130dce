"""`bench serve` results: the targets, and the JSON / Markdown / ITL-CDF report over the saved runs
(serve/runs.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graphpool.bench import common
from graphpool.bench.common import md_table
from graphpool.bench.serve.configs import config_order
from graphpool.bench.serve.runs import (
    RunSummary,
    group_key,
    load_label,
    load_order,
    load_runs,
    spread,
    stem_of,
)


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
    tagged = {r.load: load_label(r) for rs in by_config.values() for r in rs if r.load}
    arrivals = ("Poisson arrivals at each workload's load (" + "; ".join(f"`@{t}`: {w}" for t, w in tagged.items())
                + ")" if tagged else f"Poisson {first.rate:g} req/s")
    body = (f"Model `{first.model}`, {arrivals} for {first.trace_s:g} s per run; each cell is the "
            "median over seeds [min-max]. Latencies are client-side (openai AsyncOpenAI, streamed completions); "
            "ITL = gaps between streamed chunks that carry tokens; captures and the other pool counters are "
            "/metrics after the run minus /metrics right before it (after start-up, the warm-up graphs a server "
            "captures while idle after ready, one warm-up completion and each client process's untimed request); "
            "a TTFT over a client stall is a request whose wait for its first token overlapped 10 ms or more of "
            "its client process's event loop waking late; `@T0.8`: the workload sampled at temperature 0.8 "
            "(`@T0.8p0.95`: and top-p 0.95).\n\n")
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
    from graphpool.bench.serve.attribution import cause_table, merge, step_table, ttft_table

    causes = {f"({k}) {rs[0].label}": merge([r.gap_causes for r in rs if r.gap_causes])
              for k, rs in by_config.items() if any(r.gap_causes for r in rs)}
    if not causes:
        return ""
    steps = {f"({k}) {rs[0].label}, seed {r.seed}": r.gap_causes["steps"]
             for k, rs in by_config.items() for r in [r for r in rs if r.gap_causes][:1]}
    tails = {label: att["ttft_tail"] for label, att in causes.items() if "ttft_tail" in att}
    tail_text = ("\nWhere the slowest TTFTs waited (each run's TTFTs at or over its p90, from the send to the first "
                 "token, split as a gap is; each counted under its largest part, in brackets each cause's share of "
                 "their time):\n\n" + ttft_table(tails)) if tails else ""
    return ("\nWhere the client's inter-token gaps over the threshold come from (every seed with a server step timeline; "
            "each gap counted under its largest part, in brackets each cause's share of those gaps' time; "
            "bench/serve/attribution.py says how):\n\n" + cause_table(causes) + tail_text
            + "\nThe server's steps (GET /debug/steps; chained = launched by async scheduling on the device tokens "
            "of the step before; host ms = the engine thread's wall time of a step, device ms = its forward's GPU "
            "time):\n\n" + step_table(steps))


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
    for r in sorted(runs, key=lambda r: (load_order(r), r.temperature, config_order(r.config), r.seed)):
        by_config.setdefault(group_key(r), []).append(r)
    targets = evaluate_targets(by_config)
    png = None
    if plot:
        from graphpool.bench.plots import plot_itl_cdfs

        # NOTE: a run saved without its gaps (e.g. rebuilt from a report) is left out of the plot only
        panels: dict[str, dict[str, list[float]]] = {}
        for k, rs in by_config.items():
            files = [f for r in rs if (f := out_dir / "runs" / f"{stem_of(r)}.itl.npy").exists()]
            if files:  # one panel per load; a configuration keeps its colour across them
                name = k.removesuffix(f"@{rs[0].load}") if rs[0].load else k
                panels.setdefault(f"{rs[0].model} @ {load_label(rs[0])}", {})[f"({name}) {rs[0].label}"] = [
                    float(x) for f in files for x in np.load(f)]
        png = plot_itl_cdfs(panels or {f"{runs[0].model} @ {load_label(runs[0])}": {}},
                            out_dir / "serve_itl_cdf.png").name
    body = markdown(by_config, targets, png)
    more_md, more_json = section([r for rs in by_config.values() for r in rs], out_dir, plot) if section else ("", {})
    body += more_md
    aggregate = {k: {key: spread(rs, key) for _, key in COLUMNS if key is not None} for k, rs in by_config.items()}
    results = {**extra, **more_json, "runs": runs, "aggregate_median_min_max": aggregate,
               "targets": [asdict(t) for t in targets]}
    common.write_report(out_dir, "serve", env, results, body, "Serving benchmark: a live server, client-side latencies")
    return results, body, targets
