"""The byte budget in the driver's view: an MLP step with two inputs, a tuple output and fresh
allocations inside, random batch sizes through capture-on-miss under a budget; device memory held since the
pool was created (``mem_get_info``) against the bytes the pool accounts.

    python benchmarks/budget_probe.py [--steps 200] [--budget-mib 96] [--keep-outputs] [--layout arena]

Uses only the pool's public API, so the same file measures an older checkout too:
``PYTHONPATH=<old checkout>/src python benchmarks/budget_probe.py``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from graphpool.pool import CapturedGraph, CudaGraphCapturer, GraphPool, InputSpec, PoolConfig

MiB = 2**20


def mlp_step(device: torch.device) -> tuple[Callable[..., Any], tuple[InputSpec, ...]]:
    g = torch.Generator(device=device).manual_seed(0)
    w1 = torch.randn(1024, 8192, device=device, dtype=torch.bfloat16, generator=g) * 0.02
    w2 = torch.randn(8192, 1024, device=device, dtype=torch.bfloat16, generator=g) * 0.02
    emb = torch.randn(4096, 1024, device=device, dtype=torch.bfloat16, generator=g)

    def step(s: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x = s["x"] + emb[s["ids"]]
        h = F.gelu(x @ w1)
        return h @ w2 + x, h.float().mean(-1)

    specs = (InputSpec("x", (1024,), torch.bfloat16, 0.0), InputSpec("ids", (), torch.int64, 0))
    return step, specs


class RecordingCapturer(CudaGraphCapturer):
    """Keeps each capture's measured footprint."""

    def __init__(self, device: torch.device, layout: str = "per_graph") -> None:
        super().__init__(device, layout)  # type: ignore[arg-type]
        self.footprints: list[int] = []

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        graph = super().capture(size, fn)
        self.footprints.append(graph.footprint + graph.arena_bytes)
        return graph


def _held(device: torch.device, base_free: int) -> int:
    torch.cuda.synchronize(device)
    return base_free - torch.cuda.mem_get_info(device)[0]


def run(steps: int = 200, budget_mib: float = 96, keep_outputs: bool = False, device: str = "cuda",
        layout: str = "per_graph") -> dict[str, int]:
    """Bytes: ``held`` (max over steps, driver view, since the pool was created), ``accounted`` (max resident
    bytes), ``overhead`` (the capture stream's fixed overhead if it was primed during this run, else 0, and
    the driver bytes the arena layout's captures took outside the arena: the executables' heap),
    ``footprint`` (largest graph alone, its arena's bytes included), ``arena`` (the largest arena),
    ``after_close`` (held once the pool is closed)."""
    dev = torch.device(device)
    step, specs = mlp_step(dev)
    budget = int(budget_mib * MiB)
    rng = random.Random(0)
    batches = [
        {"x": torch.randn(bs, 1024, device=dev, dtype=torch.bfloat16), "ids": torch.randint(0, 4096, (bs,), device=dev)}
        for bs in (rng.randint(1, 512) for _ in range(steps))
    ]
    for b in batches:  # the eager blocks any step of these sizes takes are cached before the baseline
        step(b)
    cap = RecordingCapturer(dev, layout)
    cfg = PoolConfig(miss_policy="capture", max_batch_size=512, graph_memory_budget=budget, max_graph_pool_size=64,
                     mempool=layout)  # type: ignore[arg-type]
    pool = GraphPool(step, specs, cfg, device=dev, capturer=cap)
    primed_before = getattr(cap, "fixed_overhead", None) is not None
    torch.cuda.synchronize(dev)
    base = torch.cuda.mem_get_info(dev)[0]
    held = accounted = arena = 0
    out: Any = None
    for b in batches:
        if not keep_outputs:
            out = None
        out = pool.run(b)
        st = pool.stats()
        if st.resident_bytes > budget:
            raise AssertionError(f"accounted {st.resident_bytes} bytes over the budget {budget}")
        accounted = max(accounted, st.resident_bytes)
        arena = max(arena, st.arena_bytes)
        held = max(held, _held(dev, base))
    st = pool.stats()
    del out
    pool.run(batches[0])  # a step with nothing referenced gives back what a kept output held
    pool.close()
    overhead = 0 if primed_before else (getattr(cap, "fixed_overhead", None) or 0)
    overhead += cap.process_overhead  # the arena layout's executables: the driver's heap
    return {"budget": budget, "held": held, "accounted": accounted, "overhead": overhead,
            "footprint": max(cap.footprints, default=0), "arena": arena, "after_close": _held(dev, base),
            "captures": st.captures, "evictions": st.evictions}


def describe(r: dict[str, int]) -> str:
    return (f"budget {r['budget'] / MiB:.0f} MiB: accounted max {r['accounted'] / MiB:.1f} MiB, held max "
            f"{r['held'] / MiB:.1f} MiB (driver view since the pool was created), fixed overhead "
            f"{r['overhead'] / MiB:.1f} MiB, largest graph {r['footprint'] / MiB:.1f} MiB (arena "
            f"{r['arena'] / MiB:.1f} MiB), after close "
            f"{r['after_close'] / MiB:.1f} MiB; {r['captures']} captures, {r['evictions']} evictions")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--budget-mib", type=int, default=96)
    p.add_argument("--keep-outputs", action="store_true", help="hold each step's outputs across the next step")
    p.add_argument("--layout", default="per_graph", choices=["arena", "per_graph"])
    a = p.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {a.layout}, {a.steps} steps, outputs "
          f"{'kept' if a.keep_outputs else 'dropped'}: "
          + describe(run(a.steps, a.budget_mib, a.keep_outputs, layout=a.layout)))


if __name__ == "__main__":
    main()
