"""The client side of `bench serve`: a seeded Poisson trace sent as streaming completions (openai AsyncOpenAI)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphpool.bench.common import progress
from graphpool.bench.latency import RequestTimeline
from graphpool.bench.workload import TraceRequest, prompt_token_ids
from graphpool.pool.gc_control import heap_frozen

# NOTE: common words that are one token each (with their leading space) in Llama-style BPE vocabularies, so a
# text prompt of n words is about n tokens; the server's usage counts are what the report shows.
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her he she it they this which be are were "
    "had have has not but or an all one two new first time year people world city state school house water "
    "day life work part place case group number night point home room fact month lot right study book eye "
    "job word side kind head power hour game line end member law car name team minute idea body back parent "
    "face level office door health person art war history party result change morning reason research girl "
    "guy moment air teacher force education"
)
_WORDS = tuple(_WORD_TEXT.split())
_LAG_PROBE_S = 0.01


def text_prompt(req: TraceRequest, seed: int) -> str:
    rng = np.random.default_rng((seed, req.index, 1))
    return " ".join(rng.choice(_WORDS, size=req.prompt_len).tolist())


@dataclass
class RequestResult:
    index: int
    scheduled_s: float  # from the trace: seconds after the run's start
    prompt_len: int  # asked for (text prompts: words)
    output_len: int  # max_tokens asked for (ignore_eos, so the tokens expected)
    timeline: RequestTimeline  # arrival_s = when it was sent; token_times = chunks that carried tokens
    end_s: float = float("nan")
    prompt_tokens: int = 0  # the server's usage count
    completion_tokens: int = 0
    error: str | None = None
    worker: int = 0  # the client process that sent it

    def e2e_s(self) -> float | None:
        return self.end_s - self.timeline.arrival_s if self.error is None else None


@dataclass
class ClientRun:
    results: list[RequestResult]
    duration_s: float  # first send to last finish
    max_in_flight: int
    progress_lines: int = 0
    errors_sample: list[str] = field(default_factory=list)
    t0_monotonic: float = 0.0  # time.monotonic() at the trace's time 0 (to line up with a server timeline)
    loop_lag_ms: list[float] = field(default_factory=list)  # how late the client's 10-ms timer woke, each time
    cpu_share: float = float("nan")  # client processes' CPU time / wall time over the run (1.0 = one core)
    # per client process: (from, to) monotonic spans in which its event loop was over 1 ms late
    late_spans: list[list[tuple[float, float]]] = field(default_factory=list)
    processes: int = 1


async def _one(client: object, model: str, req: TraceRequest, prompt: str | list[int], res: RequestResult,
               t0: float, temperature: float, top_p: float = 1.0) -> None:
    tl = res.timeline
    tl.arrival_s = time.perf_counter() - t0
    try:
        stream = await client.completions.create(  # type: ignore[attr-defined]
            model=model, prompt=prompt, max_tokens=req.output_len, temperature=temperature, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, **top_p_field(top_p),
        )
        async for chunk in stream:
            now = time.perf_counter() - t0
            # NOTE: a chunk with text, or one before the final chunk (a server that streams tokens without
            # text, e.g. of a model without a tokenizer, sends those with text "" and no finish_reason)
            if chunk.choices and (chunk.choices[0].text or chunk.choices[0].finish_reason is None):
                tl.token_times.append(now)
            if chunk.usage is not None:
                res.prompt_tokens = chunk.usage.prompt_tokens
                res.completion_tokens = chunk.usage.completion_tokens
        res.end_s = time.perf_counter() - t0
        if res.completion_tokens != req.output_len:
            res.error = f"got {res.completion_tokens} of {req.output_len} tokens"
        elif not tl.token_times:
            res.error = ("no streamed chunk carried tokens (this server sends a chunk only when the text grows; "
                         "a model without a tokenizer has no text)")
        tl.finished = res.error is None
    except Exception as exc:  # NOTE: any failure (HTTP, stream, timeout) is this request's error, by type
        res.end_s = time.perf_counter() - t0
        res.error = f"{type(exc).__name__}: {exc}"[:300]


def top_p_field(top_p: float) -> dict[str, float]:
    """The request's top_p field where it cuts (1: sent as no field, as a client leaving it unset does)."""
    return {"top_p": top_p} if top_p < 1 else {}


async def _warm_up(client: object, model: str, prompt: str | list[int], temperature: float,
                   top_p: float = 1.0) -> str | None:
    """One untimed streamed request shaped as the trace's: the client's first call imports and builds its
    response types (30-80 ms of this process's event loop on a 2-core VM, more where Python compiles them from
    source), which would otherwise stall the first timed requests. Its error, if any, for the run's sample."""
    try:
        stream = await client.completions.create(  # type: ignore[attr-defined]
            model=model, prompt=prompt[:8], max_tokens=1, temperature=temperature, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, **top_p_field(top_p),
        )
        async for _ in stream:
            pass
    except Exception as exc:  # NOTE: reported with the run's errors, not swallowed
        return f"warm-up request: {type(exc).__name__}: {exc}"[:300]
    return None


async def run_trace(url: str, model: str, trace: Sequence[TraceRequest], seed: int, token_ids: bool,
                    concurrency: int | None, label: str, request_timeout_s: float = 600.0,
                    progress_every_s: float = 5.0, start_monotonic: float | None = None,
                    done: Any = None, ready: Callable[[], float] | None = None,
                    temperature: float = 0.0, top_p: float = 1.0) -> ClientRun:
    """Sends each request at its scheduled time (waiting for a slot under ``concurrency``), streams it, and
    returns once every request has finished or failed. ``start_monotonic``: the trace's time 0 (default: now);
    ``done``: a shared counter of finished requests (a worker of `run_trace_processes`); ``ready``: called
    once the client is set up, returns the start time (the processes' rendezvous); no progress lines when
    ``progress_every_s`` is 0; ``temperature`` and ``top_p``: every request's (0: greedy; 1: no cut)."""
    import httpx
    import openai

    limits = httpx.Limits(max_connections=max(len(trace), 1) + 8, max_keepalive_connections=256)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=request_timeout_s,
                                http_client=httpx.AsyncClient(limits=limits, timeout=request_timeout_s))
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    results = [RequestResult(r.index, r.arrival_s, r.prompt_len, r.output_len, RequestTimeline(r.arrival_s, r.output_len))
               for r in trace]
    prompts = [prompt_token_ids(r, seed) if token_ids else text_prompt(r, seed) for r in trace]
    state = {"sent": 0, "done": 0, "in_flight": 0, "max_in_flight": 0, "lines": 0}

    async def send(req: TraceRequest, res: RequestResult, prompt: str | list[int], t0: float) -> None:
        if sem is not None:
            await sem.acquire()
        state["sent"] += 1
        state["in_flight"] += 1
        state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        try:
            await _one(client, model, req, prompt, res, t0, temperature, top_p)
        finally:
            state["in_flight"] -= 1
            state["done"] += 1
            if done is not None:
                with done.get_lock():
                    done.value += 1
            if sem is not None:
                sem.release()

    def report(t0: float) -> None:
        errors = sum(r.error is not None for r in results)
        progress(f"  {label}: {state['done']}/{state['sent']} requests done/sent of {len(trace)}, "
                 f"{state['in_flight']} in flight, {errors} errors, {time.perf_counter() - t0:.1f} s elapsed")
        state["lines"] += 1

    async def ticker(t0: float) -> None:
        while True:
            await asyncio.sleep(progress_every_s)
            report(t0)

    lags: list[float] = []
    late: list[tuple[float, float]] = []

    async def lag_probe() -> None:
        # NOTE: a busy client would deliver chunks late and inflate every gap: its event loop's lateness is
        # part of the report, so that a tail can be told apart from a client that could not keep up.
        while True:
            t = time.monotonic()
            await asyncio.sleep(_LAG_PROBE_S)
            woke = time.monotonic()
            lags.append((woke - t - _LAG_PROBE_S) * 1e3)
            if lags[-1] > 1.0:
                late.append((t + _LAG_PROBE_S, woke))

    warm_error = await _warm_up(client, model, prompts[0], temperature, top_p) if trace else None
    # NOTE: the client's start-up objects (openai's, httpx's, the prompts) frozen for the trace: no collection
    # pauses this loop to walk them (a generation-1 pass took ~1.5 ms mid-stream on a 2-core VM)
    with heap_frozen():
        if ready is not None:
            start_monotonic = ready()  # NOTE: blocks the loop on purpose: nothing runs on it yet
        if start_monotonic is not None:
            await asyncio.sleep(max(0.0, start_monotonic - time.monotonic()))
        # NOTE: time 0 is the start asked for, however late this process woke: the schedule stays the common one
        t0 = time.perf_counter() - (time.monotonic() - start_monotonic if start_monotonic is not None else 0.0)
        t0_mono = time.monotonic() - (time.perf_counter() - t0)
        cpu0 = time.process_time()
        tick = asyncio.create_task(ticker(t0)) if progress_every_s > 0 else None
        probe = asyncio.create_task(lag_probe())
        tasks = []
        try:
            for req, res, prompt in zip(trace, results, prompts, strict=True):
                delay = req.arrival_s - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(send(req, res, prompt, t0)))
            await asyncio.gather(*tasks)
        finally:
            if tick is not None:
                tick.cancel()
            probe.cancel()
            await client.close()
    wall = time.perf_counter() - t0
    cpu_share = (time.process_time() - cpu0) / wall if wall > 0 else float("nan")
    if progress_every_s > 0:
        report(t0)
    sent = [r.timeline.arrival_s for r in results]
    ends = [r.end_s for r in results]
    duration = (max(ends) - min(sent)) if results else 0.0
    errors = [r.error for r in results if r.error is not None] + ([warm_error] if warm_error else [])
    return ClientRun(results=results, duration_s=duration, max_in_flight=state["max_in_flight"],
                     progress_lines=state["lines"], errors_sample=list(dict.fromkeys(errors))[:5],
                     t0_monotonic=t0_mono, loop_lag_ms=lags, cpu_share=cpu_share, late_spans=[late])
