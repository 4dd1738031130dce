"""Where a 4-bit layer's bfloat16 copy should take over from torch's int4 kernel: the default model's prefill on
the CPU, median ms by prompt length, with the copy used past each row count given; `--float32` adds a row
for the float32 weights (`int4_weights=False`).

    .venv/bin/python benchmarks/int4_rows.py [--max-rows 4 16 1000000] [--lens 2 8 12 16 24 64] [--reps 5]
                                             [--float32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import graphpool.model.int4 as int4
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=int, nargs="+", default=[4, 16, 1_000_000])
    parser.add_argument("--lens", type=int, nargs="+", default=[2, 8, 12, 16, 24, 64])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--float32", action="store_true", help="also the float32 weights")
    args = parser.parse_args()
    params = SamplingParams(max_tokens=1, temperature=0)

    def prefill_ms(engine: LLMEngine, n: int) -> float:
        times = []
        for i in range(args.reps):
            engine.add_request(f"p{time.monotonic_ns()}", [(i * 7 + j) % 40000 + 100 for j in range(n)], params)
            start = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    def row(label: str, engine: LLMEngine) -> None:
        print(f"| {label} | " + " | ".join(f"{prefill_ms(engine, n):.0f}" for n in args.lens) + " |", flush=True)

    # NOTE: no prefix cache: every prompt is prefilled whole
    engine = LLMEngine(EngineConfig(device="cpu", max_model_len=1024, enable_prefix_caching=False))
    prefill_ms(engine, 8)  # NOTE: warms the paths
    print(f"prefill median ms ({args.reps} prompts each), torch threads {engine.cpu_threads}")
    print("| copy past rows | " + " | ".join(f"{n} tokens" for n in args.lens) + " |")
    print("|---" * (len(args.lens) + 1) + "|")
    for rows in args.max_rows:
        int4.INT4_MAX_ROWS = rows
        row(str(rows), engine)
    if args.float32:
        del engine
        engine = LLMEngine(EngineConfig(device="cpu", max_model_len=1024, enable_prefix_caching=False,
                                        int4_weights=False))
        prefill_ms(engine, 8)
        row("float32 weights", engine)


if __name__ == "__main__":
    main()
