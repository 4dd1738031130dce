"""`graphpool bench kernels` on the CPU: both settings timed in alternating rounds, the engine's step too, the
switches put back, the reports written, bad names refused. (On the CPU the switches change nothing, so B's
outputs equal A's; the GPU test runs it where they do.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graphpool.bench.kernels_ab import KernelsABConfig, run_kernels_bench
from graphpool.kernels.staging import OFF_ENV, STAGED_ENV, switches
from graphpool.model.config import ModelConfig

TINY = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8)


def test_kernels_bench_cpu_path_runs_and_writes_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OFF_ENV, "pdl")  # the caller's own setting, put back after
    monkeypatch.delenv(STAGED_ENV, raising=False)
    cfg = KernelsABConfig(models=(TINY,), batch_sizes=(1, 3), engine_sizes=(1,), off=("gemv", "gemv_rope"),
                          on=("argmax",), context_len=20, rounds=2, reps=2, warmup=0, device="cpu")
    rows = run_kernels_bench(cfg, tmp_path, ["graphpool", "bench", "kernels"])["rows"]
    assert os.environ[OFF_ENV] == "pdl" and STAGED_ENV not in os.environ
    assert [r.batch_size for r in rows] == [1, 3]
    for r in rows:
        assert r.ms["A"] > 0 and r.ms["B"] > 0 and r.b_over_a > 0 and r.floor_ms > 0
        assert r.argmax_agree == 1.0 and r.logits_rel_err == 0.0  # the switches change nothing on the CPU
    assert rows[0].engine_ms["A"] > 0 and rows[0].engine_ms["B"] > 0 and not rows[1].engine_ms
    md = (tmp_path / "kernels.md").read_text()
    assert f"A: `{OFF_ENV}=gemv,gemv_rope`" in md and f"`{STAGED_ENV}=argmax`" in md and "A engine ms" in md
    assert len(json.loads((tmp_path / "kernels.json").read_text())["results"]["rows"]) == 2
    assert (tmp_path / "kernels.png").stat().st_size > 1000


def test_switches_set_and_restore_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OFF_ENV, "gemv")
    monkeypatch.delenv(STAGED_ENV, raising=False)
    with switches({OFF_ENV: "", STAGED_ENV: "argmax"}):
        assert os.environ[OFF_ENV] == "" and os.environ[STAGED_ENV] == "argmax"
    assert os.environ[OFF_ENV] == "gemv" and STAGED_ENV not in os.environ


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(off=("gemm",)), "--off gemm: not one of"),
    (dict(on=("gemv",)), "--on gemv: not one of"),
    (dict(off=(), on=()), "A and B are the same"),
    (dict(engine_sizes=(2,)), "engine sizes among them"),
    (dict(rounds=0), "rounds, reps"),
])  # fmt: skip
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KernelsABConfig(**kwargs)
