"""Prometheus metrics of the server, the engine and the graph pool (own CollectorRegistry).

NOTE: the pool's and the engine's counters are owned by them; a custom collector reports the values read
from ``engine.graph_stats()`` / ``engine.stats()`` (nothing is counted twice). The engine thread reads them
after each step and publishes the snapshot (``ServerMetrics.publish``); a scrape renders the latest one and
never waits for a step. Only what the engine does not keep (step latency and batch size histograms,
finished requests by reason, request latencies) is observed here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from graphpool.kernels.switches import KERNEL_SWITCHES

if TYPE_CHECKING:
    from graphpool.engine.startup import StartupTimes

logger = logging.getLogger("graphpool.server")

PREFIX = "graphpool"
STEP_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512)
REQUEST_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class EngineSnapshot:
    """What the collector reports: read on the engine thread, between two steps, and swapped in whole."""

    stats: Any  # graphpool.engine EngineStats
    graph: Any | None  # graphpool.pool.PoolStats; None when graphs are off


def read_snapshot(engine: Any) -> EngineSnapshot:
    return EngineSnapshot(stats=engine.stats(), graph=engine.graph_stats())


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class EngineCollector(Collector):
    """Reports the last snapshot the engine thread published (None before the loop starts: no series)."""

    def __init__(self) -> None:
        self.snapshot: EngineSnapshot | None = None

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        yield from self._engine(snap.stats)
        yield _gauge(
            "graph_enabled", "1 when decode steps may run through CUDA graphs", snap.graph is not None
        )
        if snap.graph is not None:
            yield from self._pool(snap.graph)

    @staticmethod
    def _engine(s: Any) -> Iterator[Metric]:
        yield _gauge("requests_running", "Requests in the running batch", s.running)
        yield _gauge("requests_waiting", "Requests waiting to be scheduled", s.waiting)
        yield _gauge("kv_blocks_free", "Free KV cache blocks", s.num_free_kv_blocks)
        yield _gauge("kv_blocks_total", "KV cache blocks in all", s.num_kv_blocks)
        yield _counter("prompt_tokens", "Prompt tokens prefilled", s.prompt_tokens_total)
        yield _counter("generation_tokens", "Tokens generated", s.generation_tokens_total)
        yield _counter("preemptions", "Requests preempted to free KV blocks", s.preemptions_total)
        yield _counter("prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache",
                       s.prefix_cache_queries_tokens_total)
        yield _counter("prefix_cache_hits_tokens", "Prompt tokens found in the prefix cache (not prefilled)",
                       s.prefix_cache_hits_tokens_total)
        yield _gauge("prefix_cache_blocks", "KV blocks holding a cached prefix", s.prefix_cache_blocks)
        yield _counter("async_chained_steps", "Steps launched before the previous step's tokens reached the "
                       "host (--async-scheduling)", s.async_chained_steps_total)
        yield _gauge("graph_warmup_pending", "Warm-up graphs the server captures while idle after ready, not "
                     "captured yet", s.graph_warmup_pending)

    @staticmethod
    def _pool(g: Any) -> Iterator[Metric]:
        yield _counter("graph_steps", "Decode steps run through the pool (graph or eager)", g.steps)
        yield _counter("graph_hits", "Decode steps replayed from a graph of their own size", g.hits)
        yield _counter(
            "graph_padded_hits", "Decode steps replayed from a larger resident graph", g.padded_hits
        )
        yield _counter("graph_misses", "Decode steps whose bucket had no resident graph", g.misses)
        yield _counter("graph_captures", "Graphs captured", g.captures)
        yield _counter("graph_capture_failures", "Graph captures that failed", g.capture_failures)
        by_kind = CounterMetricFamily(
            f"{PREFIX}_graph_capture_failures_by_kind",
            "Graph captures that failed by kind (oom|capture_invalidated|error); each size that failed runs eagerly",
            labels=["kind"],
        )
        for kind, count in sorted(g.capture_failures_by_kind.items()):
            by_kind.add_metric([kind], count)
        yield by_kind
        yield _counter("graph_evictions", "Graphs evicted from the pool", g.evictions)
        yield _counter("graph_eager_steps", "Decode steps run eagerly", g.eager_steps)
        fallbacks = CounterMetricFamily(
            f"{PREFIX}_graph_fallbacks", "Eager decode steps by reason", labels=["reason"]
        )
        for reason, count in sorted(g.fallbacks.items(), key=lambda kv: str(kv[0])):
            fallbacks.add_metric([str(getattr(reason, "value", reason))], count)
        yield fallbacks
        yield _gauge("graph_resident", "Graphs resident in the pool", g.resident_graphs)
        yield _gauge("graph_resident_bytes", "Device memory held by resident graphs, their shared arena included",
                     g.resident_bytes)
        yield _gauge("graph_arena_bytes", "Device memory of the arena the resident graphs share (in resident_bytes)",
                     g.arena_bytes)
        yield _counter("graph_capture_seconds", "Time spent capturing graphs", g.capture_seconds_total)
        yield _gauge("graph_capture_seconds_max", "Longest single graph capture", g.capture_seconds_max)


class ServerMetrics:
    """All metrics of one server; also the engine loop's step observer."""

    def __init__(self, log_interval_s: float = 10.0, disabled_kernels: Sequence[str] = (),
                 startup: StartupTimes | None = None) -> None:
        """`disabled_kernels`: the engine config's kernel switches turned off (a gauge per switch); `startup`: the
        engine's start-up phases (a gauge per phase, and phase="total")."""
        self.log_interval_s = log_interval_s
        self._last_log = (time.monotonic(), 0)  # (when, generation tokens then)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.collector = EngineCollector()
        r.register(self.collector)
        self.step_seconds = Histogram(
            f"{PREFIX}_step_seconds",
            "Engine step latency by kind (prefill|mixed|decode) and mode (graph|eager)",
            ["kind", "mode"],
            buckets=STEP_SECONDS_BUCKETS,
            registry=r,
        )
        self.step_batch_size = Histogram(
            f"{PREFIX}_step_batch_size",
            "Sequences per engine step by kind",
            ["kind"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.requests_finished = Counter(
            f"{PREFIX}_requests_finished", "Requests finished by reason", ["reason"], registry=r
        )
        self.requests_refused = Counter(
            f"{PREFIX}_requests_refused", "Requests refused with an error status", ["status"], registry=r
        )
        self.time_to_first_token = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "From request arrival to its first generated token",
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            f"{PREFIX}_request_seconds",
            "From request arrival to its last token",
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=r,
        )
        self.kernel_enabled = Gauge(
            f"{PREFIX}_kernel_enabled", "1 when a default-on kernel is on, 0 when --disable-kernels turned it off",
            ["kernel"], registry=r,
        )  # fmt: skip
        for name in KERNEL_SWITCHES:
            self.kernel_enabled.labels(name).set(name not in disabled_kernels)
        if startup is not None:
            self.startup_seconds = Gauge(
                f"{PREFIX}_startup_seconds", "Seconds of the engine's start-up by phase; phase=\"total\" is process "
                "start to ready and holds what no phase names", ["phase"], registry=r,
            )  # fmt: skip
            for phase, seconds in {**startup.phases(), "total": startup.total}.items():
                self.startup_seconds.labels(phase).set(seconds)
        self._last_step: object | None = None

    # ---- StepObserver (engine thread) ----
    def on_step(self, engine: Any, outputs: list[Any]) -> None:
        info = engine.last_step
        if info is not None and info is not self._last_step:
            self._last_step = info
            mode = "graph" if info.graph else "eager"
            self.step_seconds.labels(info.kind, mode).observe(info.seconds)
            self.step_batch_size.labels(info.kind).observe(info.batch_size)
        for out in outputs:
            if out.finished:
                self.requests_finished.labels(out.finish_reason or "unknown").inc()
        now = time.monotonic()
        if self.log_interval_s > 0 and now - self._last_log[0] >= self.log_interval_s:
            self._log_progress(engine, now)

    def _log_progress(self, engine: Any, now: float) -> None:
        """One line per interval while serving: load, KV, throughput and the pool's work."""
        s = engine.stats()
        then, tokens_then = self._last_log
        self._last_log = (now, s.generation_tokens_total)
        rate = (s.generation_tokens_total - tokens_then) / max(now - then, 1e-9)
        line = (
            f"running {s.running}, waiting {s.waiting}, KV blocks free {s.num_free_kv_blocks}/{s.num_kv_blocks}, "
            f"generation {rate:.1f} tok/s, preemptions {s.preemptions_total}"
        )
        g = engine.graph_stats()
        if g is not None:
            line += f"; graphs: {g.describe()}"
        logger.info(line)

    def on_abort(self, request_id: str) -> None:
        self.requests_finished.labels("abort").inc()

    def publish(self, engine: Any) -> None:
        """On the engine thread, between steps: the engine's and the pool's counters for the next scrapes."""
        self.collector.snapshot = read_snapshot(engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)
