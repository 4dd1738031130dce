"""`bench serve` side by side: per workload (load and temperature) one row per configuration, graphpool's and
vLLM's, with each number's ratio to vLLM's; the start-up phases each server reports; the verdicts on graphpool's
targets against vLLM; one bar chart."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from graphpool.bench.common import md_table, ratio
from graphpool.bench.serve.report import Target
from graphpool.bench.serve.runs import RunSummary, load_label, spread

REFERENCE = "vllm"  # the configuration the ratios are to
COLUMNS = (
    ("start-up s", "startup_s"), ("graphs", "graphs"), ("graph MiB", "graph_mib"),
    ("TTFT p50 ms", "ttft_ms.p50"), ("TTFT p99", "ttft_ms.p99"), ("ITL p50 ms", "itl_ms.p50"),
    ("ITL p99", "itl_ms.p99"), ("first ITL p50", "itl_first_ms.p50"), ("E2E p50 ms", "e2e_ms.p50"),
    ("E2E p99", "e2e_ms.p99"),
    ("output tok/s", "output_tok_s"), ("errors", "errors"),
)
_NO_RATIO = {"graphs", "errors"}  # counts: the ratio says nothing a reader cannot see
# graphpool's targets against vLLM, as ratios of its medians to vLLM's in one run
ITL_P50_SINGLE = 0.5  # ITL median, one request in flight
ITL_P50_LOAD = 0.8  # ITL median, any other load
ITL_P99 = 0.5
STARTUP = 0.1  # process start to ready, against vLLM's restarted start-up (its first start where it has no restart)
_PLOTTED = ("ttft_ms.p50", "ttft_ms.p99", "itl_ms.p50", "itl_ms.p99", "e2e_ms.p50")


def workload_label(run: RunSummary) -> str:
    """'greedy' or 'sampled, temperature 0.8', after the load where the bench ran several."""
    drawn = "greedy" if run.temperature == 0 else f"sampled, temperature {run.temperature:g}"
    if run.top_p < 1:  # NOTE: only sampled runs carry one
        drawn += f", top-p {run.top_p:g}"
    return f"{load_label(run)}, {drawn}" if run.load else drawn


def by_workload(runs: Sequence[RunSummary]) -> dict[str, dict[str, list[RunSummary]]]:
    """{workload label: {config: its runs}}, in the order the runs come (the report's order)."""
    out: dict[str, dict[str, list[RunSummary]]] = {}
    for r in runs:
        out.setdefault(workload_label(r), {}).setdefault(r.config, []).append(r)
    return out


def comparison(runs: Sequence[RunSummary]) -> dict[str, dict[str, dict[str, Any]]]:
    """{workload: {config: {column key: median over seeds, "ratio." + key: median / vLLM's median}}}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for load, configs in by_workload(runs).items():
        ref = configs.get(REFERENCE)
        rows: dict[str, dict[str, Any]] = {}
        for key, rs in configs.items():
            row: dict[str, Any] = {"label": rs[0].label, "server": rs[0].server, "seeds": len(rs)}
            for _, col in COLUMNS:
                row[col] = spread(rs, col)[0]
                if ref is not None and col not in _NO_RATIO:
                    row[f"ratio.{col}"] = ratio(row[col], spread(ref, col)[0])
            rows[key] = row
        out[load] = rows
    return out


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def compare_markdown(runs: Sequence[RunSummary], png: str | None) -> str:
    table = comparison(runs)
    body = ("\n### Side by side\n\nMedians over seeds; in brackets the ratio to vLLM's (below 1: lower than "
            "vLLM's). Start-up = process start to ready (GET /health, or /v1/models, 200). Graphs and graph MiB: "
            "graphpool's resident graphs and their bytes (shared arena included) after the run, from /metrics; "
            "vLLM's graphs captured at start-up and the memory its log says capture took.\n")
    for load, rows in table.items():
        cells = [[f"({k}) {row['label']}", *(_with_ratio(row, col, k == REFERENCE) for _, col in COLUMNS)]
                 for k, row in rows.items()]
        body += f"\n{load}:\n\n" + md_table(["configuration", *(c for c, _ in COLUMNS)], cells)
    body += _phases_markdown(runs) + _restarts_markdown(runs)
    targets = vllm_targets(runs)
    if targets:
        body += "\nTargets against vLLM (medians over seeds):\n\n" + "\n".join(t.line() for t in targets) + "\n"
    if png:
        body += f"\n![side by side]({png})\n"
    return body


def _with_ratio(row: Mapping[str, Any], col: str, reference: bool) -> str:
    text = _fmt(row[col])
    r = row.get(f"ratio.{col}")
    return text if reference or r is None or math.isnan(r) else f"{text} ({r:.2f}x)"


def vllm_targets(runs: Sequence[RunSummary]) -> list[Target]:
    """Each graphpool configuration's ratios to vLLM's against the targets above, per workload where vLLM ran."""
    table = comparison(runs)
    again = restarts(runs)
    single = {workload_label(r) for r in runs if r.concurrency == 1}
    out: list[Target] = []
    for load, rows in table.items():
        if REFERENCE not in rows:
            continue
        p50 = ITL_P50_SINGLE if load in single else ITL_P50_LOAD
        for key, row in rows.items():
            if key == REFERENCE:
                continue
            for col, bound, name in (("itl_ms.p50", p50, "ITL p50"), ("itl_ms.p99", ITL_P99, "ITL p99")):
                r = row[f"ratio.{col}"]
                out.append(Target(f"({key}) {load}: {name} <= {bound:g}x vLLM's", _within(r, bound),
                                  f"{_fmt(row[col])} vs {_fmt(rows[REFERENCE][col])} ms: {_fmt(r)}x"))
    ours = {k for rows in table.values() if REFERENCE in rows for k in rows if k != REFERENCE}
    ref_start = again[REFERENCE][1] if REFERENCE in again else spread([r for r in runs if r.config == REFERENCE],
                                                                        "startup_s")[0]
    which = "restarted" if REFERENCE in again else "first start"
    for key in sorted(ours):
        s = spread([r for r in runs if r.config == key], "startup_s")[0]
        r = ratio(s, ref_start)
        out.append(Target(f"({key}) start-up <= {STARTUP:g}x vLLM's ({which})", _within(r, STARTUP),
                          f"{_fmt(s)} vs {_fmt(ref_start)} s: {_fmt(r)}x"))
    return out


def _within(r: float, bound: float) -> bool | None:
    """A ratio's verdict against its bound; None where there is no ratio."""
    return None if math.isnan(r) else r <= bound


def _phases_markdown(runs: Sequence[RunSummary]) -> str:
    """Start-up by phase, where the server says (graphpool: graphpool_startup_seconds; vLLM: its log)."""
    per: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        for phase, s in r.startup_phases.items():
            per.setdefault(f"({r.config}) {r.label}", {}).setdefault(phase, []).append(s)
    if not per:
        return ""
    phases = list(dict.fromkeys(p for d in per.values() for p in d))
    rows = [[k, *(_fmt(sorted(d[p])[len(d[p]) // 2]) if p in d else "-" for p in phases)] for k, d in per.items()]
    return ("\nStart-up by phase, seconds (graphpool: its graphpool_startup_seconds gauge; vLLM: its log's "
            "model loading, torch.compile, graph capturing and engine init lines):\n\n"
            + md_table(["configuration", *phases], rows))


def restarts(runs: Sequence[RunSummary]) -> dict[str, tuple[float, float]]:
    """{config: (start-up of its first seed, median of its later seeds' start-ups)}: every seed starts the
    server anew, so the later ones find the compile caches (Triton's, vLLM's torch.compile) the first left."""
    per: dict[str, dict[int, float]] = {}
    for r in runs:
        per.setdefault(r.config, {}).setdefault(r.seed, r.startup_s)
    out = {}
    for key, by_seed in per.items():
        seeds = sorted(by_seed)
        if len(seeds) > 1:
            later = sorted(by_seed[s] for s in seeds[1:])
            out[key] = (by_seed[seeds[0]], later[len(later) // 2])
    return out


def _restarts_markdown(runs: Sequence[RunSummary]) -> str:
    table = restarts(runs)
    if not table:
        return ""
    ref = table.get(REFERENCE)
    rows = [[k, _fmt(first), _fmt(again), "-" if ref is None or k == REFERENCE else f"{ratio(again, ref[1]):.2f}x"]
            for k, (first, again) in table.items()]
    return ("\nStart-up, first start against restarts (process start to ready, s; the first seed's server starts "
            "with cold compile caches, the later seeds' find them warm):\n\n"
            + md_table(["configuration", "first start", "restarted (median)", "restarted / vLLM's restarted"], rows))


def section(runs: Sequence[RunSummary], out_dir: Path, plot: bool) -> tuple[str, dict[str, Any]]:
    """The report's side-by-side part (Markdown, JSON), with serve_compare.png when ``plot``: where a run is
    vLLM's or sampled (a graphpool-only greedy report stays as it was)."""
    if all(r.server == "graphpool" and r.temperature == 0 for r in runs):
        return "", {}
    png = plot_compare(runs, out_dir / "serve_compare.png").name if plot else None
    targets = [asdict(t) for t in vllm_targets(runs)]
    return compare_markdown(runs, png), {"side_by_side": comparison(runs), "side_by_side_targets": targets}


def plot_compare(runs: Sequence[RunSummary], path: Path) -> Path:
    """One panel per workload: grouped bars (log y) of TTFT, ITL and E2E percentiles, one colour a config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = comparison(runs)
    fig, axes = plt.subplots(1, len(table), figsize=(7 * len(table), 4.5), squeeze=False)
    for ax, (load, rows) in zip(axes[0], table.items(), strict=True):
        width = 0.8 / max(len(rows), 1)
        for i, (key, row) in enumerate(rows.items()):
            xs = [j + i * width for j in range(len(_PLOTTED))]
            ys = [row[c] if row[c] > 0 else math.nan for c in _PLOTTED]
            ax.bar(xs, ys, width=width, label=f"({key}) {row['label']}")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(_PLOTTED))],
                      [c.replace("_ms.", " ").upper() for c in _PLOTTED])
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(load)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
