"""The torch sampler's draw on the CPU: ms a `Sampler.sample` call (medians of `--reps`) at 1, 4 and 16 rows
for plain temperature rows, top-p, top-k and seeded rows, and Qwen2.5-Instruct's recommended settings (with a
repetition penalty over a 300-token prompt and 100 tokens of output); then a greedy step's argmax. The rows
are the default model's own logits (recorded while it samples eight prompts at T=0.8, CPU defaults); `--flat`
adds rows of N(0, 1) logits, whose top-p cut lies past any short list of candidates. Compare trees by running
it with `PYTHONPATH` at each one's `src`.

    .venv/bin/python benchmarks/sampler_draw.py [--tokens 32] [--reps 51] [--threads 1]

`--threads` is torch's intra-op threads (the engine's default on a 2-core machine is 1). `--device cuda` times
the draw on the GPU instead: the engine's Sampler with the Triton draw (`kernels/sample.py`, top-k / top-p /
min-p rows by rejection) against the torch draw (`engine/draw.py`), interleaved, on rows of N(0, 9) logits of
`--vocab` entries: the host's ms until `sample` returns, and the wall ms with the GPU's work done.

    python benchmarks/sampler_draw.py --device cuda [--vocab 128256] [--reps 51]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.sequence import Sequence
from graphpool.kernels.argmax import argmax_rows
from head_agreement import recorded_rows  # NOTE: run by path, benchmarks/ is on sys.path

KINDS = {"T=0.8": {"temperature": 0.8}, "T=0.8 top-p 0.95": {"temperature": 0.8, "top_p": 0.95},
         "T=0.8 top-k 50": {"temperature": 0.8, "top_k": 50}, "T=0.8 seeded": {"temperature": 0.8, "seed": 1},
         # Qwen2.5-Instruct's generation_config.json
         "Qwen's defaults": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}}


def median_ms(pool: torch.Tensor, rows: int, reps: int, fields: dict) -> float:
    """`reps` calls, each on the next `rows` rows of `pool` (cycling)."""
    params = SamplingParams(**fields)
    ids = torch.randint(pool.shape[1], (rows, 400), generator=torch.Generator().manual_seed(rows)).tolist()
    seqs = [Sequence(f"r{i}", ids[i][:300], params, frozenset(),  # a 300-token prompt and 100 tokens out
                     None if params.seed is None else torch.Generator().manual_seed(params.seed + i))
            for i in range(rows)]
    for s, more in zip(seqs, ids, strict=True):
        s.token_ids.extend(more[300:])
    sampler = Sampler(torch.device("cpu"), 0)
    times = []
    for rep in range(reps + 1):  # NOTE: the first call warms up and is dropped
        start_row = rep * rows % (pool.shape[0] - rows)
        logits = pool[start_row : start_row + rows].contiguous()
        start = time.perf_counter()
        sampler.sample(logits, seqs)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def argmax_ms(x: torch.Tensor, reps: int) -> tuple[float, float]:
    """Median ms of `argmax_rows` (a greedy step's token on the CPU) and of torch.argmax, interleaved."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps + 1):
        for fn, ts in ((argmax_rows, times[0]), (lambda t: t.argmax(dim=-1), times[1])):
            start = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - start)
    return statistics.median(times[0][1:]) * 1e3, statistics.median(times[1][1:]) * 1e3


def gpu_ms(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence], reps: int) -> tuple[float, float]:
    """Median (host ms until `sample` returns, wall ms to the GPU's end) of `reps` calls after one dropped."""
    host, wall = [], []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        sampler.sample(logits, seqs)
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - start)
    return statistics.median(host[1:]) * 1e3, statistics.median(wall[1:]) * 1e3


def main_gpu(args: argparse.Namespace) -> None:
    from graphpool.kernels.sample import sample_rows

    device = torch.device("cuda")
    print(f"$ {' '.join(sys.argv)}\ntorch {torch.__version__}, {torch.cuda.get_device_name()}, vocab {args.vocab}, "
          f"N(0, 9) logits, graphpool at {sys.modules['graphpool'].__path__[0]}")
    kinds = {**KINDS, "T=0.8 min-p 0.05": {"temperature": 0.8, "min_p": 0.05}}
    print("host ms / wall ms a `Sampler.sample` call, medians; kernel: the Triton draw, torch: engine/draw.py\n"
          "| kind | rows | kernel host | kernel wall | torch host | torch wall |\n|---|---|---|---|---|---|")
    for name, fields in kinds.items():
        for rows in (1, 8, 64):
            logits = torch.randn(rows, args.vocab, device=device, generator=None) * 3
            params = SamplingParams(**{k: v for k, v in fields.items() if k != "repetition_penalty"})
            seqs = [Sequence(f"r{i}", [1, 2, 3], params, frozenset(),
                             None if params.seed is None else torch.Generator(device).manual_seed(params.seed + i))
                    for i in range(rows)]
            kernel = gpu_ms(Sampler(device, 0, draw=sample_rows), logits, seqs, args.reps)
            plain = gpu_ms(Sampler(device, 0), logits, seqs, args.reps)
            print(f"| {name} | {rows} | " + " | ".join(f"{t:.3f}" for t in (*kernel, *plain)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="tokens sampled per prompt for the logits")
    parser.add_argument("--reps", type=int, default=51)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flat", action="store_true", help="also rows of N(0, 1) logits")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--vocab", type=int, default=128_256, help="with --device cuda: the rows' width")
    args = parser.parse_args()
    if args.device == "cuda":
        main_gpu(args)
        return
    pools = {"model": recorded_rows(args.tokens)[1]}
    if args.flat:
        pools["flat"] = torch.randn(256, pools["model"].shape[1], generator=torch.Generator().manual_seed(0))
    torch.set_num_threads(args.threads)
    print(f"$ {' '.join(sys.argv)}\ntorch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, graphpool at {sys.modules['graphpool'].__path__[0]}, "
          f"{pools['model'].shape[0]} rows of the model's logits, vocab {pools['model'].shape[1]}")
    mass = torch.softmax(pools["model"] / 0.8, -1).sort(-1, descending=True).values.cumsum(-1)
    sizes = ((mass < 0.95).sum(-1) + 1).float()
    print(f"top-p 0.95 nucleus of the model's rows at T=0.8: median {sizes.median():.0f} tokens, "
          f"p90 {sizes.quantile(0.9):.0f}, {(sizes > 256).float().mean():.1%} over 256")
    print("| logits | rows | " + " | ".join(f"{k} ms" for k in KINDS) + " |\n|---|---|" + "---|" * len(KINDS))
    for name, pool in pools.items():
        for rows in (1, 4, 16):
            times = [median_ms(pool, rows, args.reps, fields) for fields in KINDS.values()]
            print(f"| {name} | {rows} | " + " | ".join(f"{t:.3f}" for t in times) + " |")
    print("\ngreedy: ms a call\n| dtype | rows | argmax_rows | torch.argmax |\n|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (1, 4, 16):
            ours, theirs = argmax_ms(pools["model"][:rows].to(dtype), args.reps)
            print(f"| {str(dtype).removeprefix('torch.')} | {rows} | {ours:.3f} | {theirs:.3f} |")


if __name__ == "__main__":
    main()
