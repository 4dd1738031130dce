from __future__ import annotations

from pathlib import Path

import pytest
from test_bench_report import _run

from graphpool.bench import common
from graphpool.bench.latency import WorkingSet
from graphpool.bench.memory_results import BudgetResult, LayoutResult
from graphpool.bench.step import StepBenchConfig, StepRow
from graphpool.bench.trace.run import TraceBenchConfig
from summary import BEGIN, END, main, summarize


def _write(tmp: Path, bench: str, results: dict) -> None:
    common.write_report(tmp / bench, bench, common.collect_env(["x"]), results, "", bench)


def _results(tmp_path: Path) -> None:
    _write(tmp_path, "step", {"config": StepBenchConfig(), "bandwidth_bytes_per_s": 4.2e12, "rows": [
        StepRow("llama3.2-1b", 1, eager_ms=14.0, graph_ms=2.0, speedup=7.0, floor_ms=0.6, graph_over_floor=3.3),
        StepRow("llama3.2-1b", 32, eager_ms=19.0, graph_ms=4.0, speedup=4.75, compile_ms=5.0, compile_s=31.0,
                torch_ops_eager_ms=25.0),
        StepRow("llama3-8b", 64, eager_ms=40.0, graph_ms=7.0, speedup=5.7, floor_ms=5.6, graph_over_floor=1.25,
                compile_error="InductorError: boom"),
    ]})
    layouts = [LayoutResult("shared", 46, 1.0, 0.1, 90.0, points=[(46, 98.0, 90.0), (16, 98.0, 40.0), (0, 0.0, 0.0)]),
               LayoutResult("per_graph", 46, 1.5, 0.1, 2000.0, points=[(46, 2100.0, 2000.0), (0, 1.0, 0.0)])]
    _write(tmp_path, "memory", {"layouts": layouts, "budget": BudgetResult(512.0, 9, 500.0, 505.0, 9, 60, 51, 0)})
    runs = [_run("no-graphs", 90.0), _run("capture-all", 4.0), _run("lru16-capture-on-miss", 9.0),
            _run("no-warmup", 4.2), _run("budget", 4.3), _run("warm-cover", 3.0), _run("capture-all", 3.0, rate=4.0)]
    runs[0].decode_steps, runs[0].working_set = 3, WorkingSet(3, 1, 1, 1000, 60.0, {})  # no graphs: starved
    runs[3].decode_steps = 150
    runs[2].captures_serving, runs[3].captures_serving, runs[5].captures_serving = 40, 2, 50
    runs[3].startup_capture_s = 0.0
    runs[4].peak_graph_mib = 300.0
    runs[6].working_set = WorkingSet(10, 3, 3, 1000, 2.0, {})
    runs = runs[3:] + runs[:3]  # run order rotated: the tables still list the configs in their order
    trace = {"config": TraceBenchConfig(rates=(4.0, 16.0)), "runs": [
        {k: v for k, v in vars(r).items() if k != "itls_ms"} for r in runs]}
    del trace["runs"][0]["prefill_steps"]  # results written before the field existed still summarize
    _write(tmp_path, "trace", trace)


def _lines(text: str) -> dict[str, str]:
    return {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ") and "|" in ln[2:]}


def test_summary_reports_targets_met_and_missed(tmp_path: Path) -> None:
    _results(tmp_path)
    text = summarize(tmp_path)
    lines = _lines(text)
    assert "MISSED" in lines["graph >= 5x eager at bs <= 32 (models <= 1B)"]  # 4.75x at bs 32
    assert "met" in lines["8B graph within 1.3x of HBM floor at bs 1-64"]
    assert "met" in lines["memory bench: resident bytes never above the budget"]
    assert "1.05x" in lines["graphpool admit, no warm-up: p99 ITL within 1.1x of capture-all"]
    assert "met" in lines["graphpool admit, no warm-up: captures while serving < LightLLM LRU-16's"]
    assert "MISSED" in lines["graphpool default (admit + warm cover): captures while serving < LightLLM LRU-16's"]  # 50 vs 40
    assert "0.75x" in lines["graphpool default (admit + warm cover): p99 ITL within 1.1x of capture-all"]
    assert "MISSED" in lines["graphpool + budget: peak graph memory <= 256 MiB"]
    # the step tables: compile beside its plain-ops eager baseline, and compile failures spelled out
    assert "| 32 | 19 | 4 | 4.75 | - | - | - | 5 | 25 | 31 |" in text
    assert "torch.compile failed: bs 64: InductorError: boom" in text
    # the trace: one table per load, the configs in their order whatever order they ran in
    assert text.index("**4 requests/s.**") < text.index("**16 requests/s.**")  # loads in ascending order
    sixteen = text.split("**16 requests/s.**")[1].split("### Targets")[0]
    assert [ln[3:ln.index(")")] for ln in sixteen.splitlines() if ln.startswith("| (")] == [
        "no-graphs", "capture-all", "lru16-capture-on-miss", "no-warmup", "budget", "warm-cover"]
    # the working-set line comes from the config with the most decode steps, not from the starved no-graphs
    assert "under (no-warmup) cfg no-warmup (the config with the most decode steps, 150): 24 buckets" in sixteen
    assert "| 150 / - |" in sixteen  # no-warmup's results predate prefill_steps
    assert "| 3 / 7 |" in sixteen  # no-graphs: decode / prefill steps
    headline = text.split("### Headline")[1]
    assert "At 16 req/s" in headline and "(no-graphs)" not in headline  # the load with the most buckets
    assert "| (lru16-capture-on-miss) cfg lru16-capture-on-miss | 9 | 2.25 | 1 |" in headline


def test_summary_without_results_says_so(tmp_path: Path) -> None:
    assert "Decode step: no results" in summarize(tmp_path)


def test_write_doc_replaces_only_the_generated_block(tmp_path: Path) -> None:
    _results(tmp_path / "results" / "run1")
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    doc.write_text(f"# Benchmarks\n\nprose before\n\n{BEGIN}\nold tables\n{END}\n\nprose after\n")
    (tmp_path / "results" / "run1" / "step" / "step.png").write_bytes(b"png")
    assert main([str(tmp_path / "results" / "run1"), "--write-doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nprose before\n\n" + BEGIN) and text.endswith(END + "\n\nprose after\n")
    assert "old tables" not in text and "### Targets" in text
    assert "](../results/run1/step/step.png)" in text  # plots linked relative to the doc
    assert main([str(tmp_path / "results" / "run1"), "--write-doc", str(doc)]) == 0
    assert doc.read_text() == text  # idempotent
    doc.write_text(text.replace(BEGIN, "<!-- BEGIN generated by `another command` -->"))
    assert main([str(tmp_path / "results" / "run1"), "--write-doc", str(doc)]) == 0
    assert doc.read_text() == text  # a block whose BEGIN line names another command is found and renamed
    doc.write_text("no markers\n")
    with pytest.raises(ValueError):
        main([str(tmp_path / "results" / "run1"), "--write-doc", str(doc)])
