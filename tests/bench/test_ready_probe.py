"""benchmarks/ready_probe.py against the real server on the CPU: one start, timed to /health 200, with the
start-up phases the server logged."""

from __future__ import annotations

from pathlib import Path

import pytest

import ready_probe
from graphpool.bench.serve.server import free_port


def test_one_run_times_a_real_start_and_reads_its_phases() -> None:
    ready, phases = ready_probe.one_run(free_port(), ["--max-model-len", "256"], timeout_s=300)
    m = ready_probe.PHASES.search(phases)
    assert m is not None, phases
    logged = float(m.group(1))
    # the server's own total is inside the probe's spawn-to-ready time (interpreter start and /health on top)
    assert 0 < logged <= ready
    assert "imports" in m.group(2) and "load" in m.group(2)


def test_a_tree_comes_first_on_the_servers_path(tmp_path: Path) -> None:
    """--trees: the server is started from the given source folder, ahead of the environment's graphpool."""
    fake = tmp_path / "graphpool"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(RuntimeError, match=r"the server exited \(3\)"):
        ready_probe.one_run(free_port(), [], timeout_s=60, tree=str(tmp_path))
