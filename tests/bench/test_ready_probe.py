"""benchmarks/ready_probe.py against the real server on the CPU: one start, timed to /health 200, with the
start-up phases the server logged."""

from __future__ import annotations

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
