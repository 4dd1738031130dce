"""benchmarks/replay_probe.py on the CPU: it needs CUDA and says so (its GPU run: test_bench_profile_gpu.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "replay_probe.py"


def test_without_cuda_the_probe_exits_with_its_reason() -> None:
    got = subprocess.run([sys.executable, str(PROBE), "--rounds", "1"], capture_output=True, text=True,
                         timeout=300)
    assert got.returncode != 0
    assert "replay_probe needs CUDA" in got.stderr
