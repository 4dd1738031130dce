"""The client of `bench serve` over several processes: one Python event loop parsing every streamed chunk of
a busy server falls behind (seen on the H200: the loop woke up to 0.7 s late at 3,500 chunks/s, and tokens
arrived in bursts), and then the benchmark measures its own client. Each process streams every P-th request
of the trace with its own openai client; all start at one monotonic instant, so their times share one axis.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from graphpool.bench.common import progress
from graphpool.bench.serve.client import ClientRun, run_trace
from graphpool.bench.workload import TraceRequest

_START_S = 0.3  # from the moment every process is ready to the trace's time 0


def default_processes() -> int:
    """One client process per 4 cores, at most 4 (1 on a 2-core machine)."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def _worker(index: int, args: tuple[Any, ...], ready: Any, start: Any, done: Any, out: Any) -> None:
    url, model, shard, seed, token_ids, concurrency, label, timeout_s, temperature, top_p = args

    def rendezvous() -> float:
        ready.wait()
        ready.wait()  # the parent has set the start time in between
        return float(start.value)

    # NOTE: the client and the prompts are set up before the rendezvous: no process starts late
    run = asyncio.run(run_trace(url, model, shard, seed, token_ids, concurrency, label, timeout_s,
                                progress_every_s=0, done=done, ready=rendezvous, temperature=temperature,
                                top_p=top_p))
    for r in run.results:
        r.worker = index
    out.put((index, run))


def process_caps(concurrency: int | None, processes: int) -> list[int | None]:
    """Each client process's in-flight cap: ``concurrency`` split over at most that many processes (their caps
    sum to it), or no cap."""
    if not concurrency:
        return [None] * processes
    n = min(processes, concurrency)
    return [concurrency // n + (i < concurrency % n) for i in range(n)]


def run_trace_processes(url: str, model: str, trace: Sequence[TraceRequest], seed: int, token_ids: bool,
                        concurrency: int | None, label: str, processes: int, request_timeout_s: float = 600.0,
                        progress_every_s: float = 5.0, temperature: float = 0.0, top_p: float = 1.0,
                        on_ready: Callable[[], None] | None = None) -> ClientRun:
    """`run_trace` with the requests dealt round-robin to ``processes`` client processes (1: in this one); a
    ``concurrency`` cap is dealt out too, so that never more than it are in flight in all. ``on_ready``: called
    once every client is set up (its untimed warm-up request done), before the trace's time 0."""
    if processes < 1:
        raise ValueError(f"serve bench: --client-processes must be >= 1, got {processes}")
    caps = process_caps(concurrency, processes)
    processes = len(caps)
    if processes == 1:
        def ready_here() -> float:
            if on_ready is not None:
                on_ready()
            return time.monotonic()

        return asyncio.run(run_trace(url, model, trace, seed, token_ids, concurrency, label, request_timeout_s,
                                     progress_every_s, ready=ready_here, temperature=temperature, top_p=top_p))
    ctx = mp.get_context("spawn")
    ready, start, done, out = ctx.Barrier(processes + 1), ctx.Value("d", 0.0), ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=_worker, daemon=True, args=(
        i, (url, model, list(trace[i::processes]), seed, token_ids, caps[i], label, request_timeout_s, temperature,
            top_p),
        ready, start, done, out)) for i in range(processes)]
    for p in procs:
        p.start()
    ready.wait(timeout=120)
    if on_ready is not None:
        on_ready()
    start.value = time.monotonic() + _START_S
    ready.wait(timeout=120)
    runs: dict[int, ClientRun] = {}
    last = time.monotonic()
    while len(runs) < processes:
        try:
            i, run = out.get(timeout=1.0)
            runs[i] = run
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a client process exited with status {dead[0]}") from None
        if progress_every_s > 0 and time.monotonic() - last >= progress_every_s:
            last = time.monotonic()
            progress(f"  {label}: {done.value}/{len(trace)} requests done, {processes} client processes, "
                     f"{last - start.value:.1f} s elapsed")
    for p in procs:
        p.join(timeout=30)
    return merge_runs([runs[i] for i in range(processes)], start.value)


def merge_runs(runs: Sequence[ClientRun], t0_monotonic: float) -> ClientRun:
    """One run from the processes' runs, every time moved onto the axis that starts at ``t0_monotonic``."""
    results = []
    for run in runs:
        shift = run.t0_monotonic - t0_monotonic
        for r in run.results:
            tl = r.timeline
            tl.arrival_s += shift
            tl.token_times = [t + shift for t in tl.token_times]
            r.end_s += shift
            results.append(r)
    results.sort(key=lambda r: r.index)
    sent = [r.timeline.arrival_s for r in results]
    ends = [r.end_s for r in results]
    errors = [e for run in runs for e in run.errors_sample]
    return ClientRun(
        results=results, duration_s=(max(ends) - min(sent)) if results else 0.0,
        max_in_flight=sum(run.max_in_flight for run in runs), progress_lines=sum(r.progress_lines for r in runs),
        errors_sample=list(dict.fromkeys(errors))[:5], t0_monotonic=t0_monotonic,
        loop_lag_ms=[x for run in runs for x in run.loop_lag_ms], cpu_share=sum(run.cpu_share for run in runs),
        late_spans=[span for run in runs for span in run.late_spans], processes=len(runs),
    )
