"""The engine's start-up phases on /metrics: `graphpool_startup_seconds{phase=...}`, what `bench serve` reads."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from graphpool.engine.startup import StartupTimes
from graphpool.server.metrics import ServerMetrics


def _startup_gauge(metrics: ServerMetrics) -> dict[str, float]:
    return {s.labels["phase"]: s.value
            for family in text_string_to_metric_families(metrics.render().decode())
            if family.name == "graphpool_startup_seconds" for s in family.samples}


def test_every_phase_and_the_total_are_a_gauge() -> None:
    times = StartupTimes(imports=1.25, load=2.5, kv_cache=0.125, prefill_warmup=0.5, graph_capture=1.5, total=6.0)
    assert _startup_gauge(ServerMetrics(startup=times)) == {**times.phases(), "total": 6.0}


def test_no_startup_times_no_series() -> None:
    assert _startup_gauge(ServerMetrics()) == {}
