from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from graphpool.bench import common
from graphpool.bench.latency import LatencySummary, WorkingSet
from graphpool.bench.step import StepBenchConfig, StepRow
from graphpool.bench.step import markdown as step_markdown
from graphpool.bench.trace.report import RunResult
from graphpool.bench.trace.report import markdown as trace_markdown
from graphpool.bench.trace.run import TraceBenchConfig


def test_md_table_formats_numbers_and_missing_values() -> None:
    text = common.md_table(["a", "b", "c"], [[1, 2.34567, math.nan], ["x", 1234.5, 0.001234]])
    lines = text.strip().splitlines()
    assert lines[0] == "| a | b | c |" and lines[1] == "|---|---|---|"
    assert lines[2] == "| 1 | 2.35 | - |"
    assert lines[3] == "| x | 1234 | 0.00123 |"


def test_write_report_writes_env_results_and_markdown(tmp_path: Path) -> None:
    env = common.collect_env(["graphpool", "bench", "step", "--out", "x y"])
    assert env.command == "graphpool bench step --out 'x y'"
    row = StepRow(model="m", batch_size=4, eager_ms=2.0)
    jp, mp = common.write_report(tmp_path / "out", "step", env, {"rows": [row], "bw": math.inf}, "body\n", "T")
    data = json.loads(jp.read_text())
    assert data["env"]["torch_version"] == env.torch_version and data["env"]["gpu"].startswith("none")
    assert data["results"]["rows"][0]["batch_size"] == 4
    assert data["results"]["rows"][0]["graph_ms"] is None  # NaN is written as null, keeping the JSON valid
    assert data["results"]["bw"] is None
    md = mp.read_text()
    assert md.startswith("# T\n") and "graphpool bench step" in md and md.endswith("body\n")


def test_step_markdown_shows_ratios_per_model() -> None:
    rows = [StepRow(model="m1", batch_size=1, eager_ms=10.0, graph_ms=2.0, floor_ms=1.0, speedup=5.0,
                    graph_over_floor=2.0),
            StepRow(model="m2", batch_size=8, eager_ms=12.0, graph_ms=3.0, compile_s=25.0, compile_ms=4.0,
                    compile_error=None, compile_cudagraph_skips=1, torch_ops_eager_ms=30.0, compile_rel_err=0.001)]
    text = step_markdown(rows, 4.0e12, StepBenchConfig())
    assert "4.00 TB/s" in text and "## m1" in text and "## m2" in text
    assert "| 1 | 10 | 2 | - | - | 1 | 5 | 2 |" in text
    # the compile table of m2: compiled vs the plain-ops eager step it was compiled from, and the Triton graph
    assert "| 8 | 25 | 4 | 30 | 3 | 0.001 | 1 |  |" in text
    assert "plain PyTorch ops" in text.split("## m2")[1]


def _run(config: str, p99: float, rate: float = 16.0) -> RunResult:
    lat = LatencySummary(requests=10, started=9, finished=8, output_tokens=500, itl_p50_ms=3.0, itl_p99_ms=p99,
                         itl_p999_ms=2 * p99, itl_max_ms=4 * p99, ttft_p50_ms=20.0, ttft_p99_ms=50.0)
    ws = WorkingSet(decode_steps=100, distinct_buckets=24, max_window_buckets=20, window=1000, mean_batch=14.5,
                    histogram={})
    return RunResult(config=config, label=f"cfg {config}", rate=rate, startup_s=2.0, startup_capture_s=0.5,
                     tokens_per_s=1000.0, latency=lat, working_set=ws, hit_rate=0.9, captures_serving=3,
                     evictions_serving=1, peak_graph_mib=100.0, driver_delta_mib=120.0, driver_start_mib=0.0,
                     driver_end_mib=0.0, graph_steps=90, decode_steps=100, aborted=1, prefill_steps=7)


def test_trace_markdown_has_one_table_per_load_and_p99_ratio_to_capture_all() -> None:
    runs = [_run("no-graphs", 20.0), _run("capture-all", 4.0), _run("no-warmup", 4.4),
            _run("capture-all", 5.0, rate=40.0)]
    runs[0].decode_steps, runs[0].working_set = 2, WorkingSet(2, 1, 1, 1000, 70.0, {})  # starved: not the reference
    text = trace_markdown(runs, {16.0: {"requests": 10}, 40.0: {"requests": 30}}, TraceBenchConfig())
    assert "## 16 requests/s" in text and "## 40 requests/s" in text
    rows16 = text.split("## 16 requests/s")[1].split("## 40")[0]
    line_a = next(ln for ln in rows16.splitlines() if ln.startswith("| (no-graphs)"))
    line_e = next(ln for ln in rows16.splitlines() if ln.startswith("| (no-warmup)"))
    assert "| 5 |" in line_a  # no-graphs' p99 20 ms / capture-all's 4 ms
    assert "| 1.1 |" in line_e  # 4.4 / 4.0
    assert "24 (20)" in line_e and "8/9/10" in line_e
    assert "| 2 / 7 |" in line_a and "| 100 / 7 |" in line_e  # decode / prefill steps: no-graphs starved
    # capture-all wins the tie
    assert "Working set under (capture-all) cfg capture-all (the config with the most decode steps, 100)" in rows16
    assert "20 within 1000 decode steps, mean batch 14.5: exceeds a pool of 16" in rows16


def test_trace_bench_config_validation() -> None:
    with pytest.raises(ValueError):
        TraceBenchConfig(rates=())
    with pytest.raises(ValueError):
        TraceBenchConfig(configs=("z",))
    with pytest.raises(ValueError):
        TraceBenchConfig(prompt_cap=2000, output_cap=1024, max_model_len=2048)
