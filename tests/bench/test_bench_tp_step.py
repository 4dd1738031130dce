"""`bench tp-step` on the CPU (one rank): every mode, microbatch overlap included, times decode steps of
exactly each batch size and writes its report."""

from __future__ import annotations

import json
from pathlib import Path

from graphpool.bench.tp_step import TPStepConfig, run_tp_step_bench


def test_tp_step_times_every_mode_on_the_cpu(tmp_path: Path) -> None:
    cfg = TPStepConfig(model="random:qwen2.5-0.5b?layers=2", tp_sizes=(1,), batch_sizes=(1, 3),
                       modes=("eager", "overlap"), prompt_len=8, decode_steps=8, skip=2, device="cpu",
                       dtype="float32")
    rows = run_tp_step_bench(cfg, tmp_path)
    assert sorted((r.mode, r.batch_size) for r in rows) == [("eager", 1), ("eager", 3), ("overlap", 1), ("overlap", 3)]
    assert all(r.timed_steps == 8 - 2 and r.forward_ms > 0 and r.step_ms >= r.forward_ms for r in rows)
    report = json.loads((tmp_path / "tp_step.json").read_text())
    assert len(report["results"]["rows"]) == 4 and "overlap" in (tmp_path / "tp_step.md").read_text()
