"""benchmarks/jit_probe.py on the CPU: it needs CUDA and says so; its sitecustomize hooks Triton's JIT in every
process started with it; a compile's record and what two variants differ in (its GPU run: docs/kernels.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import jit_probe  # noqa: E402


def test_without_cuda_the_probe_exits_with_its_reason(tmp_path: Path) -> None:
    got = subprocess.run([sys.executable, str(BENCH / "jit_probe.py"), "trace", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 2 and "jit_probe needs CUDA" in got.stderr


def test_the_sitecustomize_hooks_triton_in_a_new_process(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    (tmp_path / "sitecustomize.py").write_text(jit_probe.SITECUSTOMIZE)
    env = {**os.environ, jit_probe.LOG_ENV: str(tmp_path / "log.jsonl"), "PYTHONPATH": str(tmp_path)}
    code = "from triton import knobs; print(knobs.runtime.jit_cache_hook is not None, knobs.runtime.jit_post_compile_hook is not None)"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.stdout.split() == ["True", "True"], got.stderr


def test_a_record_names_the_kernel_and_what_two_variants_differ_in() -> None:
    def fake(aligned: bool, stages: int) -> dict:
        fn = SimpleNamespace(name="_k", jit_function=SimpleNamespace(arg_names=["x_ptr", "lens_ptr", "n"]))
        attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]] if aligned else []}
        return {"fn": fn, "compile": {"configs": [attrs], "constants": {(3,): stages}}}

    a, b = jit_probe.record(fake(True, 2), 0.0, "warm-up"), jit_probe.record(fake(False, 2), 0.0, "timed")
    assert a["kernel"] == "_k" and a["phase"] == "warm-up" and a["pid"] == os.getpid() and a["ms"] > 0
    assert jit_probe.differs(b, a) == {"attrs:lens_ptr": ("[]", "[['tt.divisibility', 16]]")}
    assert jit_probe.differs(jit_probe.record(fake(True, 3), 0.0, ""), a) == {"constexprs:(3,)": ("3", "2")}


def test_bench_serves_own_options_after_the_double_dash_stay_its_own(tmp_path: Path, capsys) -> None:
    """`--out` and `--model` after `--` are bench serve's: the probe parses only what comes before."""
    # NOTE: --keep-cache: no TRITON_CACHE_DIR set in this test process
    code = jit_probe.main(["serve", "--keep-cache", "--out", str(tmp_path / "probe"), "--", "--model", "m", "--out",
                           str(tmp_path)])
    assert code == 2 and "jit_probe needs CUDA" in capsys.readouterr().err  # parsed, then refused on the CPU


def test_the_timed_windows_come_from_the_saved_runs(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "16rps-default-seed0.json").write_text(json.dumps({"timed_from_unix": 100.0, "timed_to_unix": 110.5}))
    (tmp_path / "runs" / "old-run.json").write_text(json.dumps({"timed_from_unix": None, "timed_to_unix": None}))
    assert jit_probe.timed_windows(tmp_path) == [("16rps-default-seed0", 100.0, 110.5)]


def test_the_bench_out_is_read_as_bench_serve_reads_it() -> None:
    assert jit_probe.bench_out(["--model", "m", "--out=/tmp/x"]) == Path("/tmp/x")
    assert jit_probe.bench_out(["--out", "/tmp/y", "--duration", "3"]) == Path("/tmp/y")
    assert jit_probe.bench_out(["--model", "m"]) == Path("results/serve")  # bench serve's default
