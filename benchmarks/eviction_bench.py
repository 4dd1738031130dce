"""Eviction cost on a GPU: the eviction call itself, and the eager step right after it, with a process-wide
release (reset the graph, then ``torch.cuda.empty_cache()``) and the pool's own (the evicted graph's own
MemPool only), side by side in one run, trials interleaved, medians.

    python benchmarks/eviction_bench.py [--trials 30] [--rows 4096] [--graph-size 256]

The eager step stands for the engine's prefill: a toy step of ``--rows`` rows whose blocks are cached when
the eviction comes. After a process-wide flush it pays cudaMalloc for them again.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from graphpool.pool.capture import CapturedGraph, CudaGraphCapturer
from graphpool.pool.config import PoolConfig
from graphpool.pool.pool import GraphPool
from toy import TOY_SPECS, ToyDecode


class FlushingCapturer(CudaGraphCapturer):
    """A process-wide release: give the graph back, then empty the whole caching allocator."""

    def release(self, graph: CapturedGraph) -> None:
        super().release(graph)
        with torch.cuda.device(self.device):
            torch.cuda.empty_cache()


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def run(trials: int = 30, rows: int = 4096, graph_size: int = 256, device: str = "cuda") -> dict[str, dict[str, float]]:
    dev = torch.device(device)
    step = ToyDecode(vocab=32000, hidden=2048, layers=2, slots=rows + graph_size + 1, dtype=torch.bfloat16, device=dev)
    eager_batch = step.inputs(rows, seed=0)
    cfg = PoolConfig(miss_policy="capture", batch_sizes=(graph_size,))
    pools = {
        "flush: graph + process-wide empty_cache()": GraphPool(step, TOY_SPECS, cfg, dev, FlushingCapturer(dev)),
        "pool: the graph's MemPool only": GraphPool(step, TOY_SPECS, cfg, dev, CudaGraphCapturer(dev)),
    }
    times: dict[str, dict[str, list[float]]] = {k: {"evict": [], "after": [], "plain": []} for k in pools}
    with torch.inference_mode():
        for trial in range(trials + 1):  # trial 0 warms every path up
            for name, pool in pools.items():
                pool.warmup([graph_size])
                step(eager_batch)  # its blocks are cached now, as the engine's prefill blocks are
                plain = _timed(lambda: step(eager_batch), dev)
                evict = _timed(lambda p=pool: p.evict(graph_size), dev)  # type: ignore[misc]
                after = _timed(lambda: step(eager_batch), dev)
                if trial:
                    times[name]["plain"].append(plain)
                    times[name]["evict"].append(evict)
                    times[name]["after"].append(after)
    for pool in pools.values():
        pool.close()
    return {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--rows", type=int, default=4096, help="rows of the eager step timed after the eviction")
    p.add_argument("--graph-size", type=int, default=256, help="batch size of the graph evicted")
    a = p.parse_args()
    res = run(a.trials, a.rows, a.graph_size)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {a.trials} trials, medians (ms); eager step of "
          f"{a.rows} rows, graph of bs={a.graph_size}")
    print(f"{'release':<42} {'evict()':>9} {'eager step after':>17} {'eager step, no eviction':>24}")
    for name, r in res.items():
        print(f"{name:<42} {r['evict']:>9.2f} {r['after']:>17.2f} {r['plain']:>24.2f}")


if __name__ == "__main__":
    main()
