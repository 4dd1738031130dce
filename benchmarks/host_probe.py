"""The host's share of a decode step: one request decoded by the engine alone, then streamed through the server
(in-process; the client in a process of its own, as in serving), with the wall time between tokens and the CPU
time of the engine and event-loop threads per token; medians last.

    python benchmarks/host_probe.py [--model random:llama3.2-1b] [--tokens 600] [--reps 3] [--temperature 0.8]
                                    [--top-p 1.0] [--disable-kernels step_sample] [--parts] [--profile 25]
                                    [--against graph_sample_max_batch_size=0]
                                    [--served auto asyncio uvloop:0.5]

When the engine-alone gap sits above the step's GPU time (`bench step`'s graph ms), the host sets the pace; its
launch (a step's host work before it waits for the GPU) is what must fit under that time.
The engine thread's CPU time includes a CUDA sync's spin-wait; the event loop's is its cost per streamed token.
`--parts` also times, engine alone, the host's share of each part of a step (median us a call, one call a
step at one request): scheduling, the decode call (its inputs to the device, the pool's run, the LM head),
the pool's run and the LM head inside it (static copy-in and replay; the head's launch), the draw and the
kernel draw inside it (its parameters' copy and two launches), and the outputs (detokenizing, stop checks).
`--profile N` runs one more request engine alone under cProfile and lists the N functions with the most own
host time a step (cProfile's own cost inflates every call: read them as shares, not as times).
`--against FIELD=VALUE` builds a second engine with that EngineConfig field changed, and every measurement
alternates between the two engines request by request (the parts and the profile stay the first engine's).
`--served` streams through several server variants, alternating request by request in this one process (hosts
drift between processes more than such variants differ): uvicorn's event loop, and the interpreter's switch
interval, which bounds how long the engine thread waits for the lock while the event loop holds it (uvloop
writes to the socket without releasing it).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import cProfile
import dataclasses
import json
import pstats
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.server.main import serve_in_thread

PROMPT = list(range(10, 310))  # token ids: the same prompt for every model with a vocabulary past 310
SKIP = 20  # the first gaps (prefill, first steps) are not the steady state


def median_gap_ms(times: list[float]) -> float:
    gaps = [b - a for a, b in zip(times[SKIP:], times[SKIP + 1:], strict=False)]
    return statistics.median(gaps) * 1e3


PARTS = (("schedule", "scheduler", "schedule"), ("decode call", "runner", "decode"),
         ("pool run (in decode)", "pool", "run"), ("LM head (in decode)", "model", "compute_logits"),
         ("draw", "sampler", "sample_step"), ("kernel draw (in draw)", "sampler", "draw"),
         ("outputs", "engine", "_append"))


@contextlib.contextmanager
def timed_parts(engine: LLMEngine, parts: tuple[tuple[str, str, str], ...] = PARTS
                ) -> Iterator[dict[str, list[float]]]:
    """Each part's (name, owner, method) host seconds per call while the block runs (the methods wrapped on their
    instances; owners: scheduler, runner, pool, capturer, model, sampler, engine, and async, async scheduling's
    `AsyncDecode`: a part whose owner the engine lacks keeps no times)."""
    owners = {"scheduler": engine.scheduler, "runner": engine.runner, "pool": engine.runner.pool,
              "capturer": engine.runner.pool._capturer, "model": engine.model, "sampler": engine.sampler,
              "engine": engine, "async": engine._async}
    times: dict[str, list[float]] = {name: [] for name, _, _ in parts}
    parts = tuple(p for p in parts if owners[p[1]] is not None)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name].append(time.perf_counter() - start)

        return call

    # NOTE: an attribute the instance holds itself (the sampler's draw) is put back; a method's wrapper is deleted
    own = {(owner, method): vars(owners[owner]).get(method) for _, owner, method in parts}
    for name, owner, method in parts:
        if getattr(owners[owner], method) is not None:
            setattr(owners[owner], method, timed(name, getattr(owners[owner], method)))
    try:
        yield times
    finally:
        for _, owner, method in parts:
            if own[owner, method] is not None:
                setattr(owners[owner], method, own[owner, method])
            elif method in vars(owners[owner]):
                delattr(owners[owner], method)


def engine_alone(engine: LLMEngine, params: SamplingParams) -> tuple[float, float]:
    """(median gap ms, median launch ms): a step's launch runs from its start to the engine's `before_wait`
    hook, the host's work before it waits for the GPU (async scheduling: the next step already launched)."""
    engine.add_request(f"probe-{time.monotonic_ns()}", PROMPT, params)
    times, launches = [], []
    engine.before_wait = lambda: launches.append(time.perf_counter() - start)
    try:
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter())
    finally:
        engine.before_wait = None
    return median_gap_ms(times), statistics.median(launches[SKIP:] or launches) * 1e3


def profiled(engine: LLMEngine, params: SamplingParams, top: int) -> list[tuple[str, float, float]]:
    """The `top` functions by own host time over one engine-alone request: (function, calls a step, own us a
    step), a step being one of the request's tokens."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        engine_alone(engine, params)
    finally:
        prof.disable()
    steps = params.max_tokens
    rows = [(f"{Path(file).name}:{line}({name})", calls / steps, own / steps * 1e6)
            for (file, line, name), (_, calls, own, _, _) in pstats.Stats(prof).stats.items()]  # type: ignore[attr-defined]
    return sorted(rows, key=lambda r: -r[2])[:top]


def thread_cpu(name: str) -> float:
    thread = next(t for t in threading.enumerate() if t.name == name)
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]


def stream_times(url: str, body: dict) -> list[float]:
    """The arrival time of each streamed chunk of one request (the client process's side)."""
    times = []
    with httpx.Client(timeout=120) as client, client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.perf_counter())
    return times


@dataclass(frozen=True)
class Served:
    """How the in-process server runs: uvicorn's event loop, and the interpreter's switch interval (how long a
    thread that wants the interpreter lock waits before the holder is made to drop it; Python's default 5 ms)."""

    loop: str = "auto"
    switch_ms: float = 5.0

    @classmethod
    def parse(cls, text: str) -> Served:
        loop, _, ms = text.partition(":")
        try:
            switch_ms = float(ms) if ms else 5.0
        except ValueError:
            switch_ms = 0.0
        if loop not in ("auto", "asyncio", "uvloop") or switch_ms <= 0:
            raise ValueError(f"a served variant is LOOP[:SWITCH_MS] (auto, asyncio or uvloop; ms > 0), got {text!r}")
        return cls(loop, switch_ms)

    def __str__(self) -> str:
        return f"{self.loop}, switch {self.switch_ms:g} ms"


def through_server(engine: LLMEngine, params: SamplingParams, reps: int,
                   served: Served = Served()) -> list[tuple[float, float, float]]:
    """(median gap ms, engine thread CPU us / token, event loop CPU us / token) of each streamed request."""
    body = {"model": engine.model_name, "prompt": PROMPT, "max_tokens": params.max_tokens, "stream": True,
            "temperature": params.temperature, "top_p": params.top_p, "ignore_eos": True}
    rows = []
    before_switch = sys.getswitchinterval()
    sys.setswitchinterval(served.switch_ms / 1e3)
    try:
        with serve_in_thread(engine, event_loop=served.loop) as (url, _):
            for _ in range(reps + 1):  # NOTE: the first request warms the server's paths; not counted
                before = {n: thread_cpu(n) for n in ("graphpool-engine", "graphpool-http")}
                # NOTE: the client in its own process: in this one it would take the interpreter lock from the server
                got = subprocess.run([sys.executable, __file__, "--client", url], input=json.dumps(body),
                                     capture_output=True, text=True, check=True)
                times = json.loads(got.stdout)
                cpu = {n: (thread_cpu(n) - before[n]) / len(times) * 1e6 for n in before}
                rows.append((median_gap_ms(times), cpu["graphpool-engine"], cpu["graphpool-http"]))
    finally:
        sys.setswitchinterval(before_switch)
    return rows[1:]


def served_rounds(engines: dict[str, LLMEngine], params: SamplingParams, reps: int,
                  variants: list[Served]) -> dict[tuple[str, Served], list[tuple[float, float, float]]]:
    """`through_server`'s rows of each engine under each variant, alternating request by request (a server
    started for each), so that a host's drift between processes or minutes falls on all of them alike."""
    rows: dict[tuple[str, Served], list[tuple[float, float, float]]] = {
        (name, v): [] for name in engines for v in variants}
    for _ in range(reps):
        for (name, v), got in rows.items():
            got += through_server(engines[name], params, 1, v)
    return rows


def config_change(text: str) -> dict[str, Any]:
    """`FIELD=VALUE` -> {FIELD: VALUE}, the value as a Python literal where it reads as one (else a string)."""
    field, sep, value = text.partition("=")
    if not sep or field not in {f.name for f in dataclasses.fields(EngineConfig)}:
        raise ValueError(f"--against takes FIELD=VALUE with FIELD an EngineConfig field, got {text!r}")
    try:
        return {field: ast.literal_eval(value)}
    except (ValueError, SyntaxError):
        return {field: value}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:llama3.2-1b")
    p.add_argument("--tokens", type=int, default=600, help="tokens each request decodes")
    p.add_argument("--reps", type=int, default=3, help="requests per measurement")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (1: no cut)")
    p.add_argument("--device", default=None, help="default: the engine's (cuda when there is one)")
    p.add_argument("--disable-kernels", default="", help="kernel switches off (EngineConfig.disabled_kernels)")
    p.add_argument("--parts", action="store_true", help="also time each part of a step's host work, engine alone")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also list the N functions with the most own host time a step (cProfile, engine alone)")
    p.add_argument("--served", nargs="+", default=["auto"], metavar="LOOP[:SWITCH_MS]",
                   help="the server's variants, alternating request by request: uvicorn's event loop (auto, asyncio, "
                        "uvloop) and the interpreter's switch interval in ms (5: Python's default)")
    p.add_argument("--against", metavar="FIELD=VALUE",
                   help="a second engine with this EngineConfig field changed, alternating with the first")
    p.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # the client process: body on stdin
    args = p.parse_args()
    if args.client:
        print(json.dumps(stream_times(args.client, json.loads(sys.stdin.read()))))
        return
    if args.tokens <= SKIP + 2 or args.reps < 1:
        p.error(f"--tokens must be > {SKIP + 2} and --reps >= 1")
    try:
        variants = list(dict.fromkeys(Served.parse(v) for v in args.served))
        changes = config_change(args.against) if args.against else None
    except ValueError as e:
        p.error(str(e))
    base = {"model": args.model, "disabled_kernels": args.disable_kernels,
            **({"device": args.device} if args.device else {})}
    engine = LLMEngine(EngineConfig(**base))
    engines = {"": engine}
    if changes is not None:
        engines[args.against] = LLMEngine(EngineConfig(**base | changes))
    params = SamplingParams(max_tokens=args.tokens, temperature=args.temperature, top_p=args.top_p, ignore_eos=True)
    for e in engines.values():
        engine_alone(e, params)  # NOTE: warms the graphs and kernels this request's sizes need
    alone: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for _ in range(args.reps):
        for name, e in engines.items():
            alone[name].append(engine_alone(e, params))
    parts: dict[str, list[float]] = {}
    if args.parts:
        with timed_parts(engine) as times:
            engine_alone(engine, params)
        parts = {name: [v * 1e6 for v in values[SKIP:]] for name, values in times.items() if values[SKIP:]}
    hot = profiled(engine, params, args.profile) if args.profile > 0 else []
    served = served_rounds(engines, params, args.reps, variants)
    device = torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu"
    print(f"$ {' '.join(sys.argv)}")
    off = f", kernels off: {args.disable_kernels}" if args.disable_kernels else ""
    print(f"{device}, torch {torch.__version__}, {args.model}, T={args.temperature}, top-p {args.top_p}, "
          f"{args.tokens} tokens, {args.reps} requests each{off}")
    print("| measure | median | runs |\n|---|---|---|")
    measures = []
    for label, rows_alone in alone.items():
        tag = f" [{label}]" if label else ""
        measures += [(f"engine alone{tag}: gap ms", [a[0] for a in rows_alone]),
                     (f"engine alone{tag}: launch ms / step", [a[1] for a in rows_alone])]
    for (label, v), rows in served.items():
        name = "server" if len(variants) == 1 else f"server ({v})"
        name += f" [{label}]" if label else ""
        measures += [(f"{name}: gap ms", [r[0] for r in rows]),
                     (f"{name}: engine thread CPU us / token", [r[1] for r in rows]),
                     (f"{name}: event loop CPU us / token", [r[2] for r in rows])]
    for name, values in measures:
        print(f"| {name} | {statistics.median(values):.3g} | {', '.join(f'{v:.3g}' for v in values)} |")
    for name, values in parts.items():
        print(f"| engine alone: {name} us (host) | {statistics.median(values):.3g} | {len(values)} calls |")
    if hot:
        print("\n| function (cProfile, engine alone) | calls / step | own us / step |\n|---|---|---|")
        for name, calls, own in hot:
            print(f"| {name} | {calls:.2g} | {own:.3g} |")


if __name__ == "__main__":
    main()
