"""The torch sampler's noise on the CPU: torch's `exponential_` against the sampler's -log(U) form
(`_exponential_`), and a whole sampled `Sampler.sample`, in ms a call (medians of `--reps`, the two noise forms
interleaved) for 1, 4 and 16 rows of the default model's vocabulary.

    .venv/bin/python benchmarks/sampler_draw.py [--vocab 49152] [--reps 51] [--threads 1]

`--threads` is torch's intra-op threads (the engine's default on a 2-core machine is 1).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch

from graphpool.engine.sampler import Sampler, _exponential_
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.sequence import Sequence


def timed_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def medians_ms(rows: int, vocab: int, reps: int, gen: torch.Generator) -> dict[str, float]:
    """Each form's median ms a call at `rows` rows, the forms interleaved round by round."""
    noise = torch.empty(rows, vocab)
    logits = torch.randn(rows, vocab, generator=gen)
    seqs = [Sequence(f"r{i}", [1], SamplingParams(temperature=0.8), frozenset(), None) for i in range(rows)]
    sampler = Sampler(torch.device("cpu"), 0)
    forms = {"exp": lambda: noise.exponential_(generator=gen), "log": lambda: _exponential_(noise, gen),
             "sample": lambda: sampler.sample(logits, seqs)}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(reps + 1):  # NOTE: the first round warms up and is dropped
        for name, fn in forms.items():
            times[name].append(timed_ms(fn))
    return {name: statistics.median(ts[1:]) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--reps", type=int, default=51)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"$ {' '.join(sys.argv)}\ntorch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, vocab {args.vocab}")
    gen = torch.Generator().manual_seed(0)
    print("| rows | exponential_ ms | -log(U) ms | ratio | Sampler.sample (T=0.8) ms |\n|---|---|---|---|---|")
    for rows in (1, 4, 16):
        med = medians_ms(rows, args.vocab, args.reps, gen)
        print(f"| {rows} | {med['exp']:.3f} | {med['log']:.3f} | {med['exp'] / med['log']:.2f}x | "
              f"{med['sample']:.3f} |")

if __name__ == "__main__":
    main()
