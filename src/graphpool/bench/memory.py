"""`graphpool bench memory`: device memory held by a whole ladder of captured decode graphs (driver view),
with the shared and the per_graph mempool layouts, after evicting down to N graphs, and under a byte budget."""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graphpool.bench import common
from graphpool.bench.common import MIB, md_table, progress
from graphpool.bench.decode import DecodeSetup, build_random_model, setup_input_specs
from graphpool.pool import Capturer, GraphPool, PoolConfig


@dataclass(frozen=True)
class MemoryBenchConfig:
    model: str = "llama3.2-1b"
    context_len: int = 1024
    max_batch_size: int = 256
    split_batch_size: int = 32
    grow_step: int = 16
    evict_to: tuple[int, ...] = (32, 16, 8, 1, 0)
    budget_mib: float | None = None  # None: a quarter of what the per_graph layout holds for the whole ladder
    sweep_steps: int = 92  # random batch sizes run through the budgeted pool
    device: str = "auto"
    dtype: str = "auto"
    attn_backend: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if any(n < 0 for n in self.evict_to):
            raise ValueError(f"memory bench: evict_to counts must be >= 0, got {self.evict_to}")
        if self.budget_mib is not None and not self.budget_mib > 0:
            raise ValueError(f"memory bench: budget_mib must be > 0, got {self.budget_mib}")
        if self.context_len < 1 or self.sweep_steps < 0:
            raise ValueError("memory bench: context_len must be >= 1 and sweep_steps >= 0")


@dataclass
class LayoutResult:
    layout: str
    ladder_size: int
    capture_seconds: float
    static_mib: float  # the pool's static input buffers
    accounted_mib_all: float  # sum of per-graph footprints the pool measured at capture
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (resident graphs, held MiB, accounted MiB)
    held_after_close_mib: float = math.nan


@dataclass
class BudgetResult:
    budget_mib: float
    warmup_captured: int
    max_accounted_mib: float  # highest resident bytes seen by the pool (after every capture and run)
    max_held_mib: float  # highest driver-view memory held by the pool over the run
    final_resident_graphs: int
    captures: int
    evictions: int
    over_budget_events: int  # accounted bytes above the budget: must be 0


def _held(device: torch.device, base: int) -> float:
    return (common.driver_used_bytes(device) - base) / MIB


def _pool_config(cfg: MemoryBenchConfig, layout: str, budget: int | None = None) -> PoolConfig:
    ladder = PoolConfig(max_batch_size=cfg.max_batch_size, split_batch_size=cfg.split_batch_size,
                        grow_step=cfg.grow_step).ladder()
    return PoolConfig(
        max_batch_size=cfg.max_batch_size,
        split_batch_size=cfg.split_batch_size,
        grow_step=cfg.grow_step,
        max_graph_pool_size=len(ladder),
        graph_memory_budget=budget,
        max_len_in_batch=cfg.context_len,
        mempool=layout,  # type: ignore[arg-type]
        miss_policy="capture",
    )


def _bar(label: str) -> Callable[[int, int, int], None]:
    def cb(done: int, total: int, size: int) -> None:
        if done == total or done % 10 == 0:
            progress(f"  {label}: captured {done}/{total} (bs={size})")

    return cb


def bench_layout(setup: DecodeSetup, cfg: MemoryBenchConfig, layout: str, capturer: Capturer | None = None) -> LayoutResult:
    device = setup.model.device
    base = common.driver_used_bytes(device)
    pool = GraphPool(setup.step_fn(), setup_input_specs(setup), _pool_config(cfg, layout), device, capturer)
    static = _held(device, base)
    sizes = list(pool.ladder.sizes)
    t0 = time.perf_counter()
    pool.warmup(sizes, _bar(layout))
    common.sync(device)
    st = pool.stats()
    res = LayoutResult(layout, len(sizes), time.perf_counter() - t0, static, st.resident_bytes / MIB)
    res.points.append((st.resident_graphs, _held(device, base), st.resident_bytes / MIB))
    progress(f"  {layout}: {st.resident_graphs} graphs hold {res.points[-1][1]:.0f} MiB (driver view)")
    for n in sorted(cfg.evict_to, reverse=True):
        # NOTE: evict the largest sizes first, keeping the n smallest (what LightLLM's LRU ends up keeping).
        for s in sorted(pool.resident_sizes(), reverse=True)[: max(0, pool.stats().resident_graphs - n)]:
            pool.evict(s)
        st = pool.stats()
        res.points.append((st.resident_graphs, _held(device, base), st.resident_bytes / MIB))
        progress(f"  {layout}: evicted to {st.resident_graphs} graphs: {res.points[-1][1]:.0f} MiB held")
    pool.close()
    del pool
    res.held_after_close_mib = _held(device, base)
    return res


def bench_budget(
    setup: DecodeSetup, cfg: MemoryBenchConfig, budget: int, capturer: Capturer | None = None
) -> BudgetResult:
    device = setup.model.device
    base = common.driver_used_bytes(device)
    pool = GraphPool(setup.step_fn(), setup_input_specs(setup), _pool_config(cfg, "per_graph", budget), device,
                     capturer)
    max_acc, max_held, over = 0, 0.0, 0

    def check(*_: int) -> None:
        nonlocal max_acc, max_held, over
        acc = pool.stats().resident_bytes
        max_acc = max(max_acc, acc)
        over += acc > budget
        max_held = max(max_held, _held(device, base))

    captured = pool.warmup(list(pool.ladder.sizes), check)
    progress(f"  budget {budget / MIB:.0f} MiB: warm-up kept {len(captured)} graphs; sweeping random sizes")
    rng = random.Random(cfg.seed)
    for _ in range(cfg.sweep_steps):
        bs = rng.randint(1, cfg.max_batch_size)
        pool.run(setup.batch(bs), max_len_in_batch=cfg.context_len)
        check()
    st = pool.stats()
    pool.close()
    return BudgetResult(budget / MIB, len(captured), max_acc / MIB, max_held, st.resident_graphs, st.captures,
                        st.evictions, over)


def markdown(layouts: Sequence[LayoutResult], budget: BudgetResult, cfg: MemoryBenchConfig) -> str:
    out = [f"Model {cfg.model} (random weights), decode step at context {cfg.context_len}, ladder of "
           f"{layouts[0].ladder_size} sizes up to {cfg.max_batch_size}. Held = device memory in use (driver view, "
           "after synchronize + empty_cache) minus the same before the pool was built. Eviction removes the "
           "largest sizes first.\n\n"]
    out.append(md_table(
        ["layout", "capture all, s", "accounted MiB (sum of footprints)", "static MiB", "held after close MiB"],
        [[r.layout, r.capture_seconds, r.accounted_mib_all, r.static_mib, r.held_after_close_mib] for r in layouts],
    ))
    out.append("\nHeld memory (MiB) after evicting down to N resident graphs:\n\n")
    counts = [p[0] for p in layouts[0].points]
    out.append(md_table(
        ["resident graphs", *[f"{r.layout} held" for r in layouts], *[f"{r.layout} accounted" for r in layouts]],
        [[n, *[r.points[i][1] for r in layouts], *[r.points[i][2] for r in layouts]] for i, n in enumerate(counts)],
    ))
    out.append("\nWith a byte budget (per_graph layout, capture-on-miss, then random batch sizes through `run`):\n\n")
    out.append(md_table(
        ["budget MiB", "warm-up kept", "max accounted MiB", "max held MiB", "final graphs", "captures",
         "evictions", "accounted > budget"],
        [[budget.budget_mib, budget.warmup_captured, budget.max_accounted_mib, budget.max_held_mib,
          budget.final_resident_graphs, budget.captures, budget.evictions, budget.over_budget_events]],
    ))
    return "".join(out)


@torch.inference_mode()
def run_memory_bench(cfg: MemoryBenchConfig, out_dir: Path, argv: Sequence[str] | None = None) -> dict[str, object]:
    device, dtype = common.device_and_dtype(cfg.device, cfg.dtype)
    if device.type != "cuda":
        raise ValueError("the memory bench measures CUDA graph memory: it needs a CUDA device")
    env = common.collect_env(argv, device)
    print(env.header_markdown(), flush=True)
    progress(f"memory bench: {cfg.model} on {env.gpu}")
    model = build_random_model(cfg.model, device, dtype, cfg.attn_backend, max_positions=cfg.context_len + 16)
    setup = DecodeSetup.create(model, cfg.max_batch_size, cfg.context_len)
    layouts = [bench_layout(setup, cfg, layout) for layout in ("shared", "per_graph")]
    per_graph_all = layouts[1].points[0][1]
    budget_mib = cfg.budget_mib if cfg.budget_mib is not None else max(1.0, round(per_graph_all / 4))
    budget = bench_budget(setup, cfg, int(budget_mib * MIB))
    results = {"config": cfg, "layouts": layouts, "budget": budget}
    body = markdown(layouts, budget, cfg)
    from graphpool.bench.plots import plot_memory

    budget_pt = (budget.final_resident_graphs, budget.max_held_mib, budget.budget_mib)
    png = plot_memory({r.layout: [(p[0], p[1]) for p in r.points] for r in layouts}, out_dir / "memory.png",
                      f"{cfg.model}: graph memory held vs resident graphs", budget_pt)
    body += f"\n![held memory vs resident graphs]({png.name})\n"
    common.write_report(out_dir, "memory", env, results, body, "Graph memory: layouts, eviction, budget")
    print(body)
    del setup, model
    common.free_device_memory(device)
    return results


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama3.2-1b")
    p.add_argument("--context-len", type=int, default=1024)
    p.add_argument("--evict-to", type=int, nargs="+", default=[32, 16, 8, 1, 0])
    p.add_argument("--budget-mib", type=float, default=None,
                   help="byte budget of the budget run (default: a quarter of the per_graph full-ladder memory)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attn-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--out", type=Path, default=Path("results/memory"))


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    cfg = MemoryBenchConfig(model=args.model, context_len=args.context_len, evict_to=tuple(args.evict_to),
                            budget_mib=args.budget_mib, device=args.device, dtype=args.dtype,
                            attn_backend=args.attn_backend)
    run_memory_bench(cfg, args.out, argv)
