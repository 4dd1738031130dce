"""Headline table and target check from the benches' JSON results (`python -m graphpool.bench.summary DIR`).

Targets (issue 5) are reported as met or missed with the numbers; they are never asserted.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from graphpool.bench.common import md_table


def _load(results_dir: Path, bench: str) -> dict[str, Any] | None:
    path = results_dir / bench / f"{bench}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _num(x: Any) -> float:
    return math.nan if x is None else float(x)


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "MISSED")


def step_summary(data: dict[str, Any], targets: list[list[str]]) -> str:
    rows = data["results"]["rows"]
    table = md_table(
        ["model", "bs", "eager ms", "graph ms", "speed-up", "floor ms", "graph/floor", "compile ms", "compile s"],
        [[r["model"], r["batch_size"], _num(r["eager_ms"]), _num(r["graph_ms"]), _num(r["speedup"]),
          _num(r["floor_ms"]), _num(r["graph_over_floor"]), _num(r["compile_ms"]), _num(r["compile_s"])]
         for r in rows],
    )
    small = [r for r in rows if r["model"] in ("llama3.2-1b", "qwen2.5-0.5b", "smollm2-135m") and r["batch_size"] <= 32]
    sp = [_num(r["speedup"]) for r in small if r["speedup"] is not None]
    targets.append(["graph >= 5x eager at bs <= 32 (models <= 1B)", f"min {min(sp):.2f}x" if sp else "-",
                    _verdict(min(sp) >= 5.0 if sp else None)])
    big = [_num(r["graph_over_floor"]) for r in rows
           if r["model"] == "llama3-8b" and r["batch_size"] <= 64 and r["graph_over_floor"] is not None]
    targets.append(["8B graph within 1.3x of HBM floor at bs 1-64", f"max {max(big):.2f}x" if big else "-",
                    _verdict(max(big) <= 1.3 if big else None)])
    return table


def memory_summary(data: dict[str, Any], targets: list[list[str]]) -> str:
    res = data["results"]
    rows = []
    for lay in res["layouts"]:
        pts = {p[0]: p[1] for p in lay["points"]}
        rows.append([lay["layout"], lay["ladder_size"], _num(pts.get(lay["ladder_size"])), _num(pts.get(16)),
                     _num(pts.get(0)), _num(lay["capture_seconds"])])
    table = md_table(["layout", "graphs", "held MiB (all)", "held MiB (16 left)", "held MiB (0 left)", "capture s"],
                     rows)
    b = res["budget"]
    targets.append(["memory bench: resident bytes never above the budget",
                    f"max {b['max_accounted_mib']:.0f} of {b['budget_mib']:.0f} MiB",
                    _verdict(b["over_budget_events"] == 0 and b["max_accounted_mib"] <= b["budget_mib"])])
    return table


def _busiest_load(runs: list[dict[str, Any]]) -> float:
    """The load level whose decode steps touched the most buckets (the over-capacity trace)."""
    return max(runs, key=lambda r: r["working_set"]["max_window_buckets"])["rate"]


def working_set_reference(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The run whose batch-size working set describes a load: the one with the most decode steps ((b) on a
    tie). A config that starves decode (no graphs) would say the load touches almost no buckets."""
    return max(runs.values(), key=lambda r: (r["decode_steps"], r["config"] == "b"))


def trace_summary(data: dict[str, Any], targets: list[list[str]]) -> str:
    runs = data["results"]["runs"]
    rate = _busiest_load(runs)
    mine = {r["config"]: r for r in runs if r["rate"] == rate}
    ref = working_set_reference(mine)
    ws = ref["working_set"]
    lat = {k: r["latency"] for k, r in mine.items()}
    head = (f"Load {rate:g} req/s, working set under ({ref['config']}) {ref['label']} (the config with the most "
            f"decode steps, {ref['decode_steps']}): {ws['distinct_buckets']} buckets touched "
            f"({ws['max_window_buckets']} within {ws['window']} decode steps), mean batch {ws['mean_batch']:.1f}\n\n")
    table = md_table(
        ["config", "tok/s", "ITL p50", "ITL p99", "ITL p99.9", "ITL max", "TTFT p99", "start-up capture s",
         "captures serving", "peak graph MiB"],
        [[f"({k}) {r['label']}", _num(r["tokens_per_s"]), _num(lat[k]["itl_p50_ms"]), _num(lat[k]["itl_p99_ms"]),
          _num(lat[k]["itl_p999_ms"]), _num(lat[k]["itl_max_ms"]), _num(lat[k]["ttft_p99_ms"]),
          _num(r["startup_capture_s"]), r["captures_serving"], _num(r["peak_graph_mib"])] for k, r in mine.items()],
    )
    b, e, d, f = mine.get("b"), mine.get("e"), mine.get("d"), mine.get("f")
    if b and e:
        q = _num(lat["e"]["itl_p99_ms"]) / _num(lat["b"]["itl_p99_ms"])
        targets.append(["graphpool p99 ITL within 1.1x of capture-all", f"{q:.2f}x", _verdict(q <= 1.1)])
        s = _num(e["startup_capture_s"]) / max(_num(b["startup_capture_s"]), 1e-9)
        targets.append(["graphpool start-up capture <= 10% of capture-all",
                        f"{e['startup_capture_s']:.2f} s vs {b['startup_capture_s']:.2f} s", _verdict(s <= 0.1)])
    if e and d:
        targets.append(["graphpool captures while serving < seed LRU-16's",
                        f"{e['captures_serving']} vs {d['captures_serving']}",
                        _verdict(e["captures_serving"] < d["captures_serving"])])
    if f:
        budget = data["results"]["config"]["budget_mib"]
        targets.append([f"graphpool + budget: peak graph memory <= {budget} MiB",
                        f"{f['peak_graph_mib']:.0f} MiB", _verdict(f["peak_graph_mib"] <= budget)])
    return head + table


def summarize(results_dir: Path) -> str:
    out: list[str] = []
    targets: list[list[str]] = []
    for bench, fn in (("step", step_summary), ("memory", memory_summary), ("trace", trace_summary)):
        data = _load(results_dir, bench)
        if data is None:
            out.append(f"## {bench}: no results\n")
            continue
        env = data["env"]
        out.append(f"## {bench} ({env['gpu']}, torch {env['torch_version']}, {env['date']})\n\n{fn(data, targets)}")
    out.append("\n## targets (issue 5)\n\n" + md_table(["target", "measured", "verdict"], targets))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(summarize(Path(args[0] if args else "results")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
