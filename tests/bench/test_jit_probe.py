"""benchmarks/jit_probe.py on the CPU: it needs CUDA and says so; its sitecustomize hooks Triton's JIT in every
process started with it; a compile's record and what two variants differ in (its GPU run: docs/kernels.md)."""

from __future__ import annotations

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
