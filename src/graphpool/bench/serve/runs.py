"""`bench serve`'s runs: one summary per (configuration, seed, workload), its names, saved and read back, and
the median and min-max over seeds."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from graphpool.bench import common
from graphpool.bench.common import MIB, median, percentile
from graphpool.bench.latency import all_itls_ms
from graphpool.bench.serve.attribution import split_client_stalled

# serving-time deltas of the pool's counters (after the run minus right after start-up)
DELTA_KEYS = ("captures", "hits", "padded_hits", "misses", "evictions", "eager_steps", "fallbacks")
# the engine's counters over the run (graphpool's and vLLM's alike: serve/server.VLLM_COUNTERS)
ENGINE_KEYS = ("generation_tokens", "prompt_tokens", "preemptions", "requests_finished")


@dataclass(frozen=True)
class RunSummary:
    config: str  # the configuration's name (serve/configs.py)
    label: str
    seed: int
    model: str
    rate: float
    trace_s: float
    requests: int
    errors: int
    itl_gaps: int
    output_tokens: int
    output_tok_s: float
    ttft_ms: dict[str, float]  # p50 / p99 / p99.9
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    itl_max_ms: float
    startup_s: float  # process start to GET /health 200 (NaN for --url)
    startup_capture_s: float  # graphpool_graph_capture_seconds right after start-up (0 when graphs are off)
    startup_captures: float
    serving: dict[str, float]  # DELTA_KEYS: after the run minus after start-up
    resident_graphs: float
    resident_mib: float
    prompt_tokens_mean: float
    max_in_flight: int
    stop_s: float
    killed: bool
    errors_sample: list[str] = field(default_factory=list)
    # client-side gaps over the threshold (10 ms unless --gap-threshold-ms) by cause, from the server's step
    # timeline (serve/attribution.attribute)
    gap_causes: dict[str, Any] = field(default_factory=dict)
    client_loop_lag_ms: dict[str, float] = field(default_factory=dict)  # p50 / p99 / max lateness of a 10-ms timer
    client_cpu_share: float = math.nan  # client CPU time / wall time (1.0 = one core busy)
    client_processes: int = 1
    temperature: float = 0.0  # the workload's sampling temperature (0: greedy)
    top_p: float = 1.0  # its requests' top_p (1: none sent)
    server: str = "graphpool"  # or "vllm" (a foreign server)
    graphs: float = math.nan  # graphpool: resident after the run; vLLM: captured at start-up (its log)
    graph_mib: float = math.nan  # graphpool: resident bytes (arena included); vLLM: what its log says capture took
    arena_mib: float = math.nan  # graphpool: the resident graphs' shared arena (part of graph_mib)
    startup_phases: dict[str, float] = field(default_factory=dict)  # seconds by phase, where the server says
    engine: dict[str, float] = field(default_factory=dict)  # ENGINE_KEYS over the run, where published
    itl_first_ms: dict[str, float] = field(default_factory=dict)  # each request's first gap (the step after its prefill)
    # the TTFTs of requests whose wait overlapped no client loop stall of >= 10 ms, and how many did overlap one
    ttft_unstalled_ms: dict[str, float] = field(default_factory=dict)
    ttft_client_stalled: int = 0
    concurrency: int | None = None  # most requests in flight (None: no cap)
    load: str = ""  # the load's tag (options.Load.tag) where the bench ran several, else ""
    # NOTE: the timed window on the wall clock (Unix s): the trace's time 0 to this summary (benchmarks/jit_probe.py)
    timed_from_unix: float = math.nan
    timed_to_unix: float = math.nan


def pcts(xs: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(xs, 50), "p99": percentile(xs, 99), "p99.9": percentile(xs, 99.9)}


def group_key(run: RunSummary) -> str:
    """A configuration under one workload: its name, with the temperature when it samples and the load where
    the bench ran several."""
    key = run.config if run.temperature == 0 else f"{run.config}@T{run.temperature:g}{_cut(run.top_p)}"
    return f"{key}@{run.load}" if run.load else key


def _cut(top_p: float) -> str:
    return f"p{top_p:g}" if top_p < 1 else ""


def run_stem(config: str, seed: int, temperature: float, load: str = "", top_p: float = 1.0) -> str:
    """A run's file name under <out>/runs (greedy runs of one load keep the name they had before temperatures
    and loads)."""
    stem = f"{config}-seed{seed}" if temperature == 0 else f"{config}-t{temperature:g}{_cut(top_p)}-seed{seed}"
    return f"{load}-{stem}" if load else stem


def stem_of(run: RunSummary) -> str:
    return run_stem(run.config, run.seed, run.temperature, run.load, run.top_p)


def load_order(run: RunSummary) -> tuple[bool, int, float]:
    """Uncapped loads first, then the higher caps; the higher rate first within each."""
    return run.concurrency is not None, -(run.concurrency or 0), -run.rate


def load_label(run: RunSummary) -> str:
    """The run's arrivals in words: '16 req/s', 'single stream, 2 req/s', '8 req/s, at most 4 in flight'."""
    if run.concurrency == 1:
        return f"single stream, {run.rate:g} req/s"
    cap = f", at most {run.concurrency} in flight" if run.concurrency is not None else ""
    return f"{run.rate:g} req/s{cap}"


def summarize_run(config: str, label: str, seed: int, model: str, rate: float, trace_s: float, client: Any,
                  before: Mapping[str, float], after: Mapping[str, float], startup_s: float, stop: tuple[float, bool],
                  gap_causes: Mapping[str, Any] | None = None, *, boot: Mapping[str, float] | None = None,
                  temperature: float = 0.0, top_p: float = 1.0, server: str = "graphpool", log_info: Any = None,
                  concurrency: int | None = None, load: str = "") -> tuple[RunSummary, list[float]]:
    """A run's summary and its ITLs in ms (``client``: serve_client.ClientRun; ``boot``: /metrics right after
    start-up, default ``before``; ``log_info``: a foreign server's foreign.VllmLogInfo)."""
    boot = before if boot is None else boot
    ok = [r for r in client.results if r.error is None]
    itls = all_itls_ms([r.timeline for r in ok])
    ttfts = [t * 1e3 for r in ok if (t := r.timeline.ttft()) is not None]
    t0_mono = getattr(client, "t0_monotonic", 0.0)
    unstalled, stalled = split_client_stalled(ok, getattr(client, "late_spans", []), t0_mono)
    tokens = sum(r.completion_tokens for r in client.results)
    now, now_mono = time.time(), time.monotonic()
    summary = RunSummary(
        config=config, label=label, seed=seed, model=model, rate=rate, trace_s=trace_s,
        requests=len(client.results), errors=len(client.results) - len(ok), itl_gaps=len(itls),
        output_tokens=tokens, output_tok_s=tokens / client.duration_s if client.duration_s > 0 else math.nan,
        ttft_ms=pcts(ttfts), itl_ms=pcts(itls), e2e_ms=pcts([r.e2e_s() * 1e3 for r in ok]),
        itl_max_ms=max(itls) if itls else math.nan, startup_s=startup_s,
        startup_capture_s=boot.get("capture_seconds", 0.0), startup_captures=boot.get("captures", math.nan),
        # NOTE: no pool series (graphs off): NaN, shown as "-", not a count of 0
        serving={k: after.get(k, math.nan) - before.get(k, 0.0) for k in DELTA_KEYS},
        resident_graphs=after.get("resident", math.nan), resident_mib=after.get("resident_bytes", math.nan) / MIB,
        prompt_tokens_mean=sum(r.prompt_tokens for r in ok) / len(ok) if ok else math.nan,
        max_in_flight=client.max_in_flight, stop_s=stop[0], killed=stop[1], errors_sample=client.errors_sample,
        gap_causes=dict(gap_causes or {}),
        client_loop_lag_ms={"p50": percentile(client.loop_lag_ms, 50), "p99": percentile(client.loop_lag_ms, 99),
                            "max": max(client.loop_lag_ms, default=math.nan)},
        client_cpu_share=client.cpu_share, client_processes=getattr(client, "processes", 1),
        temperature=temperature, top_p=top_p, server=server, **_graph_facts(after, boot, log_info),
        engine={k: after[k] - before.get(k, 0.0) for k in ENGINE_KEYS if k in after},
        itl_first_ms=pcts([g[0] * 1e3 for r in ok if (g := r.timeline.itls())]),
        ttft_unstalled_ms=pcts(unstalled), ttft_client_stalled=stalled, concurrency=concurrency, load=load,
        timed_from_unix=now - (now_mono - t0_mono) if t0_mono else math.nan, timed_to_unix=now,
    )
    return summary, itls


def _graph_facts(after: Mapping[str, float], boot: Mapping[str, float], log_info: Any) -> dict[str, Any]:
    """Graph count, graph memory and start-up phases: from the server's log (foreign) or its /metrics."""
    from graphpool.bench.serve.server import PHASE_PREFIX

    if log_info is not None:
        return {"graphs": log_info.graphs, "graph_mib": log_info.graph_gib * 1024,
                "startup_phases": dict(log_info.phases)}
    return {"graphs": after.get("resident", math.nan), "graph_mib": after.get("resident_bytes", math.nan) / MIB,
            "arena_mib": after.get("arena_bytes", math.nan) / MIB,
            "startup_phases": {k.removeprefix(PHASE_PREFIX): v for k, v in boot.items() if k.startswith(PHASE_PREFIX)}}


def _restore_nan(v: Any) -> Any:
    """JSON holds NaN as null (common._jsonable); a run read back has its NaNs again."""
    if isinstance(v, dict):
        return {k: _restore_nan(x) for k, x in v.items()}
    return math.nan if v is None else v


# NOTE: the fields whose null is a value of theirs (concurrency's: no cap), not a NaN JSON could not hold
_OPTIONAL = frozenset(f.name for f in fields(RunSummary) if "None" in str(f.type))


def load_runs(runs_dir: Path) -> list[RunSummary]:
    runs = [RunSummary(**{k: v if k in _OPTIONAL else _restore_nan(v) for k, v in json.loads(p.read_text()).items()})
            for p in sorted(runs_dir.glob("*.json"))]
    shapes = {(r.model, r.trace_s) for r in runs}
    loads = {(r.load, r.rate, r.concurrency) for r in runs}
    if len(shapes) > 1 or len(loads) > len({load for load, _, _ in loads}):
        raise ValueError(f"{runs_dir} holds runs of different models/durations {sorted(shapes)} or loads "
                         f"{sorted(loads, key=str)}: give each its own --out")
    return runs


def save_run(runs_dir: Path, run: RunSummary, itls_ms: Sequence[float]) -> Path:
    import numpy as np

    runs_dir.mkdir(parents=True, exist_ok=True)
    stem = stem_of(run)
    np.save(runs_dir / f"{stem}.itl.npy", np.asarray(itls_ms, dtype=np.float32))
    path = runs_dir / f"{stem}.json"
    path.write_text(json.dumps(common._jsonable(asdict(run)), indent=1) + "\n")
    return path


def _get(run: RunSummary, key: str) -> float:
    """A number of a run by dotted key: 'itl_ms.p99.9' style for the dicts (split on the first dot)."""
    head, _, rest = key.partition(".")
    v = getattr(run, head)
    return float(v.get(rest, math.nan) if rest else v)


def spread(runs: Sequence[RunSummary], key: str) -> tuple[float, float, float]:
    """(median, min, max) over seeds, NaNs left out."""
    xs = [x for r in runs if not math.isnan(x := _get(r, key))]
    return (median(xs), min(xs), max(xs)) if xs else (math.nan, math.nan, math.nan)
