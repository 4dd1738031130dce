"""PNG plots of the three benchmarks (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphpool.bench.latency import cdf_points

if TYPE_CHECKING:
    from graphpool.bench.step_config import StepRow


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _finite(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and not math.isnan(y)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_step(rows: Sequence[StepRow], path: Path) -> Path:
    """Step time against batch size, one panel per model: eager, graph, pool.run, compile, HBM floor."""
    plt = _pyplot()
    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    series = [("eager_ms", "eager", "o-"), ("graph_ms", "graph replay", "s-"), ("pool_ms", "GraphPool.run", "^--"),
              ("compile_ms", "torch.compile reduce-overhead", "D"), ("floor_ms", "HBM floor", "k:")]
    for ax, model in zip(axes[0], models, strict=True):
        mine = [r for r in rows if r.model == model]
        bs = [r.batch_size for r in mine]
        for attr, label, style in series:
            xs, ys = _finite(bs, [getattr(r, attr) for r in mine])
            if xs:
                ax.plot(xs, ys, style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("ms per decode step")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_memory(curves: Mapping[str, Sequence[tuple[int, float]]], path: Path, title: str,
                budget_point: tuple[int, float, float] | None = None) -> Path:
    """Held device memory (MiB) against resident graphs, one line per mempool layout.

    budget_point: (resident graphs, held MiB, budget MiB) of the run with a byte budget.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, pts in curves.items():
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    if budget_point is not None:
        n, held, budget = budget_point
        ax.plot([n], [held], "r*", markersize=14, label=f"with budget {budget:.0f} MiB")
        ax.axhline(budget, color="r", linestyle=":", linewidth=1)
    ax.set_xlabel("resident graphs")
    ax.set_ylabel("device memory held by graphs, MiB (driver view)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_itl_cdfs(per_load: Mapping[str, Mapping[str, Sequence[float]]], path: Path) -> Path:
    """Inter-token latency CDFs (log x), one column per load level, one line per configuration; the lower
    row shows the tail (1 - CDF, log y), where capture stalls show up.

    per_load: {load label: {config label: ITLs in ms}}.
    """
    plt = _pyplot()
    loads = list(per_load)
    # NOTE: one colour per configuration across every panel, even where a panel lacks some configurations
    labels = list(dict.fromkeys(label for load in loads for label in per_load[load]))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}
    fig, axes = plt.subplots(2, len(loads), figsize=(6 * len(loads), 8), squeeze=False)
    for col, load in enumerate(loads):
        top, bottom = axes[0][col], axes[1][col]
        for label, itls in per_load[load].items():
            xs, cdf = cdf_points([x for x in itls if x > 0])
            if not xs:
                continue
            n = len(xs)
            style = {"label": label, "linewidth": 1.2, "color": colour[label]}
            top.plot(xs, cdf, **style)
            bottom.plot(xs, [max(1.0 - i / n, 1.0 / n) for i in range(n)], **style)
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.set_xlabel("inter-token latency, ms (log)")
            ax.grid(True, which="both", alpha=0.3)
        top.set_ylabel("fraction of tokens (CDF)")
        top.set_title(load)
        if top.get_lines():
            top.legend(fontsize=7, loc="lower right")
        bottom.set_yscale("log")
        bottom.set_ylabel("fraction of tokens slower (1 - CDF)")
    return _save(plt, fig, path)


def plot_gemm_chain(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """`bench gemm_kernel`: each mode's chain time (us) as a bar, one panel per model, the weights' floor dashed.

    rows: {"model", "mode", "step_us", "floor_us"} each.
    """
    plt = _pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [r for r in rows if r["model"] == model]
        ax.bar([r["mode"] for r in mine], [r["step_us"] for r in mine], color="tab:blue")
        ax.axhline(mine[0]["floor_us"], color="k", linestyle="--", linewidth=1, label="weights at copy bandwidth")
        ax.set_ylabel("us per chain (one graph replay)")
        ax.set_title(model)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)
