"""The graph pool on a small decode step of our own.

    python examples/pool_example.py [--steps N] [--budget-mib 512] [--policy admit|capture]

On a GPU the step replays through CUDA graphs; on a CPU every step runs eagerly (reason "no_cuda").
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from pathlib import Path

import torch

from graphpool.pool import GraphPool, PoolConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the toy step is a benchmark script
from toy import TOY_SPECS, ToyDecode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="decode steps (default: 300 on GPU, 30 on CPU)")
    ap.add_argument("--budget-mib", type=int, default=512, help="graph memory budget (GPU only)")
    ap.add_argument("--policy", choices=("admit", "capture"), default=None, help="miss policy (default: config's)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    steps = args.steps if args.steps is not None else (300 if cuda else 30)
    if not cuda:
        print("No CUDA device: the pool runs every step eagerly (fallback reason no_cuda).")
    step = ToyDecode(vocab=8192, hidden=512, layers=4, dtype=torch.bfloat16 if cuda else torch.float32, device=device)
    extra = {"miss_policy": args.policy} if args.policy else {}
    cfg = PoolConfig(
        max_graph_pool_size=12,
        graph_memory_budget=args.budget_mib << 20 if cuda else None,
        **extra,  # type: ignore[arg-type]
    )
    pool = GraphPool(step, TOY_SPECS, cfg, device=device)

    t0 = time.perf_counter()
    warmed = pool.warmup(progress=lambda done, total, size: print(f"  warm-up {done}/{total}: bs={size}"))
    print(f"warm-up captured {warmed} in {time.perf_counter() - t0:.2f} s")

    # A decode loop whose batch size drifts like a continuous-batching server's.
    rng = random.Random(0)
    bs = 8
    t0 = time.perf_counter()
    for i in range(steps):
        bs = max(1, min(96, bs + rng.choice((-2, -1, 0, 0, 1, 2))))
        logits = pool.run(step.inputs(bs, seed=i), max_len_in_batch=1)
        assert logits.shape == (bs, 8192)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(f"{steps} steps in {elapsed:.2f} s ({1e3 * elapsed / steps:.2f} ms/step) on {device}")
    for key, value in pool.stats().as_dict().items():
        print(f"  {key}: {value}")
    pool.close()


if __name__ == "__main__":
    main()
