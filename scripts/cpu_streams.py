"""Decode throughput of N concurrent streams on the CPU (default model), through LLMEngine.

    .venv/bin/python scripts/cpu_streams.py --max-model-len 2048 --new-tokens 64 --streams 1,16 [--no-int4-weights]
                                            [--temperature 0.8 [--top-p 0.95]]

The engine's CPU defaults (4-bit linear weights, bfloat16) unless `--no-int4-weights` or `--dtype` say otherwise.
Every stream gets the same 15-token prompt and `--new-tokens` tokens (ignore_eos), greedy unless `--temperature` is
above 0 (unseeded; `--top-p` below 1 adds a top-p cut). "decode" is the decode
tokens over the wall time of the decode steps alone (`engine.last_step.seconds`); "end-to-end" includes the
prefill. Run against another tree with PYTHONPATH=<tree>/src.
"""

from __future__ import annotations

import argparse
import resource
import time

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model import loader

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--streams", default="1,16", help="comma-separated stream counts, run one after another")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--int4-weights", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--keep-freed-heap", action="store_true",
                        help="skip the loader's heap release (to measure what it saves)")
    args = parser.parse_args()
    if args.keep_freed_heap:
        loader.release_freed_heap = lambda: None
    engine = LLMEngine(EngineConfig(device="cpu", dtype=args.dtype, int4_weights=args.int4_weights,
                                    max_model_len=args.max_model_len))
    print(f"dtype {engine.dtype}, int4 weights {engine.config.int4_weights}, {engine.cpu_threads} threads", flush=True)
    prompt = engine.encode(PROMPT)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.new_tokens, ignore_eos=True)
    for n in (int(s) for s in args.streams.split(",")):
        for i in range(n):
            engine.add_request(f"n{n}-{i}", list(prompt), params)
        decode_s, decode_tokens, steps, start = 0.0, 0, 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            if engine.last_step is not None and engine.last_step.kind == "decode":
                decode_s += engine.last_step.seconds
                decode_tokens += engine.last_step.batch_size
                steps += 1
        wall = time.perf_counter() - start
        print(f"max_model_len={args.max_model_len} T={args.temperature} top_p={args.top_p} streams={n} prompt={len(prompt)} new={args.new_tokens}: "
              f"decode {decode_tokens / decode_s:.1f} tok/s ({1000 * decode_s / steps:.1f} ms/step), "
              f"end-to-end {n * args.new_tokens / wall:.1f} tok/s", flush=True)
    print(f"peak resident set: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")


if __name__ == "__main__":
    main()
