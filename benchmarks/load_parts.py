"""Where the engine thread's time goes under load: the engine alone, Poisson arrivals (`bench serve`'s trace of
token-id prompts, at the lengths `scripts/bench_vllm.sh` asks for), each `step()` call split into parts, grouped
by the kind of the step it finished and of the step it launched ahead (async scheduling).

    python benchmarks/load_parts.py [--model random:llama3-8b] [--rate 16] [--duration 6] [--out results/load_parts]

Parts (host ms a call): `launch` (async scheduling's chained launch: the scheduling, the forward's host work and
the draw of the step after the one in flight), inside it `forward` (the runner's decode or mixed step) and
`sample`; `wait` (for the tokens of the step in flight) and `process` (what is left: outputs, stop checks,
KV commits). Under async scheduling a launch should take well under the step in flight's GPU time, and the
wait the rest: a launch that takes about two steps, followed by a wait of ~0, held the host until its own
step had run on the GPU (so the GPU idled while the host then processed, and the tokens of two steps reached
the clients together). The slowest launches are listed, and every call is written to `calls.json`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from graphpool.bench.common import median, percentile
from graphpool.bench.workload import TraceConfig, generate_trace, prompt_token_ids
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.pool.gc_control import collect_and_freeze
from host_probe import config_change, timed_parts

# (part, owner, method): timed_parts' owners
PARTS = (("launch", "async", "chain"), ("wait", "async", "collect"), ("forward", "runner", "decode"),
         ("forward", "runner", "mixed"), ("forward", "runner", "prefill"), ("sample", "sampler", "sample_step"))
SLOW_MS = 5.0  # a launch over this is listed (a decode step's host launch is well under 1 ms on a GPU host)


def load(rate: float, duration: float, seed: int) -> list[tuple[float, list[int], SamplingParams]]:
    """(arrival s, prompt ids, params): `bench serve`'s trace at `scripts/bench_vllm.sh`'s lengths (prompts ~300
    tokens, at most 1024; outputs ~128, at most 384), sampled at T=0.8."""
    trace = generate_trace(TraceConfig(rate=rate, duration_s=duration, output_mean=128, output_cap=384, seed=seed))
    return [(r.arrival_s, prompt_token_ids(r, seed),
             SamplingParams(temperature=0.8, max_tokens=r.output_len, ignore_eos=True)) for r in trace]


def run(engine: LLMEngine, load: list[tuple[float, list[int], SamplingParams]]) -> list[dict[str, Any]]:
    """Serves `load` in real time with the engine alone -> one record a `step()` call (ms)."""
    calls: list[dict[str, Any]] = []
    t0, nxt = time.perf_counter(), 0
    with timed_parts(engine, PARTS) as times:
        while nxt < len(load) or engine.has_unfinished_requests():
            now = time.perf_counter() - t0
            while nxt < len(load) and load[nxt][0] <= now:
                engine.add_request(f"r{nxt}", load[nxt][1], load[nxt][2])
                nxt += 1
            if not engine.has_unfinished_requests():
                time.sleep(0.0005)
                continue
            for t in times.values():
                t.clear()
            start = time.perf_counter()
            engine.step()
            total = time.perf_counter() - start
            done = engine.last_step
            ahead = engine._async
            launched = ahead.inflight.kind if ahead is not None and ahead.inflight is not None else None
            record = {"at_s": start - t0, "done": done.kind if done else None, "launched": launched,
                      "total": total * 1e3, **{k: sum(t) * 1e3 for k, t in times.items()}}
            # NOTE: without a chained launch the forward and the draw were the finished step's own
            record["process"] = record["total"] - record.get("launch", 0.0) - record.get("wait", 0.0)
            calls.append(record)
    return calls


def table(calls: list[dict[str, Any]]) -> str:
    keys = ("total", "launch", "forward", "sample", "wait", "process")
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for c in calls:
        groups[(c["done"], c["launched"])].append(c)
    lines = ["| step finished | step launched | calls | " + " | ".join(f"{k} p50 / p90 ms" for k in keys)
             + f" | launches over {SLOW_MS:g} ms |", "|---" * (len(keys) + 4) + "|"]
    for (done, launched), cs in sorted(groups.items(), key=lambda g: -len(g[1])):
        cells = []
        for k in keys:
            v = [c.get(k, 0.0) for c in cs]
            cells.append(f"{median(v):.2f} / {percentile(v, 90):.2f}")
        slow = sum(c.get("launch", 0.0) > SLOW_MS for c in cs)
        lines.append(f"| {done} | {launched} | {len(cs)} | " + " | ".join(cells) + f" | {slow} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:llama3-8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup-s", type=float, default=1.0, help="seconds of untimed load first (8 req/s)")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="FIELD=VALUE",
                    help="an EngineConfig field changed (host_probe.config_change: enable_mixed_steps=True)")
    ap.add_argument("--out", type=Path, default=Path("results/load_parts"))
    args = ap.parse_args(argv)
    extra = {k: v for a in args.engine_arg for k, v in config_change(a).items()}
    engine = LLMEngine(EngineConfig(model=args.model, device=args.device, **extra))
    if engine.device.type == "cuda":
        engine.runner.capture_graphs("cover")  # as the server does while idle after ready
    if args.warmup_s > 0:
        run(engine, load(8.0, args.warmup_s, args.seed + 1))  # untimed: first launches and captures
    collect_and_freeze()  # as the server does after start-up
    calls = run(engine, load(args.rate, args.duration, args.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calls.json").write_text(json.dumps(calls))
    report = table(calls)
    slow = sorted((c for c in calls if c.get("launch", 0.0) > SLOW_MS), key=lambda c: -c["launch"])[:10]
    print(f"{args.model} on {engine.device}, {args.rate:g} req/s for {args.duration:g} s: {len(calls)} calls")
    print(report)
    for c in slow:
        print("slow launch:", {k: round(v, 2) if isinstance(v, float) else v for k, v in c.items()})
    return {"calls": calls, "table": report}


if __name__ == "__main__":
    main()
