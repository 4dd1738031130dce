from __future__ import annotations

from pathlib import Path

from graphpool.bench import common
from graphpool.bench.latency import WorkingSet
from graphpool.bench.memory import BudgetResult, LayoutResult
from graphpool.bench.step import StepRow
from graphpool.bench.summary import summarize
from test_bench_report import _run


def _write(tmp: Path, bench: str, results: dict) -> None:
    common.write_report(tmp / bench, bench, common.collect_env(["x"]), results, "", bench)


def test_summary_reports_targets_met_and_missed(tmp_path: Path) -> None:
    _write(tmp_path, "step", {"rows": [
        StepRow("llama3.2-1b", 1, eager_ms=14.0, graph_ms=2.0, speedup=7.0, floor_ms=0.6, graph_over_floor=3.3),
        StepRow("llama3.2-1b", 32, eager_ms=19.0, graph_ms=4.0, speedup=4.75),
        StepRow("llama3-8b", 64, eager_ms=40.0, graph_ms=7.0, speedup=5.7, floor_ms=5.6, graph_over_floor=1.25),
    ]})
    layouts = [LayoutResult("shared", 46, 1.0, 0.1, 90.0, points=[(46, 98.0, 90.0), (16, 98.0, 40.0), (0, 0.0, 0.0)]),
               LayoutResult("per_graph", 46, 1.5, 0.1, 2000.0, points=[(46, 2100.0, 2000.0), (0, 1.0, 0.0)])]
    _write(tmp_path, "memory", {"layouts": layouts, "budget": BudgetResult(512.0, 9, 500.0, 505.0, 9, 60, 51, 0)})
    runs = [_run("a", 90.0), _run("b", 4.0), _run("d", 9.0), _run("e", 4.2), _run("f", 4.3), _run("b", 3.0, rate=4.0)]
    runs[0].decode_steps, runs[0].working_set = 3, WorkingSet(3, 1, 1, 1000, 60.0, {})  # no graphs: starved
    runs[3].decode_steps = 150
    runs = runs[1:] + runs[:1]  # the starved config not first
    runs[1].captures_serving, runs[2].captures_serving = 40, 2
    runs[2].startup_capture_s = 0.0
    runs[3].peak_graph_mib = 300.0
    runs[4].working_set = type(runs[4].working_set)(10, 3, 3, 1000, 2.0, {})
    _write(tmp_path, "trace", {"config": {"budget_mib": 256},
                               "runs": [{k: v for k, v in vars(r).items() if k != "itls_ms"} for r in runs]})
    text = summarize(tmp_path)
    lines = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ") and "|" in ln[2:]}
    assert "MISSED" in lines["graph >= 5x eager at bs <= 32 (models <= 1B)"]  # 4.75x at bs 32
    assert "met" in lines["8B graph within 1.3x of HBM floor at bs 1-64"]
    assert "met" in lines["memory bench: resident bytes never above the budget"]
    assert "1.05x" in lines["graphpool p99 ITL within 1.1x of capture-all"]
    assert "met" in lines["graphpool captures while serving < seed LRU-16's"]
    assert "MISSED" in lines["graphpool + budget: peak graph memory <= 256 MiB"]
    assert "Load 16 req/s" in text  # the load with the most buckets is the one summarized
    # the working-set line comes from the config with the most decode steps, not from the starved (a)
    assert "working set under (e) cfg e (the config with the most decode steps, 150): 24 buckets" in text


def test_summary_without_results_says_so(tmp_path: Path) -> None:
    assert "step: no results" in summarize(tmp_path)
