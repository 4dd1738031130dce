"""`graphpool bench memory`: where a captured decode graph's device bytes go (driver view), per size and per
mempool layout (the arena against one pool per graph): the step's outputs, its activations, the graph
executable, first-use costs; what a whole resident set holds (the start-up cover, 16 graphs, the ladder);
what evicting gives back; the replay time of each layout; and a byte budget under random batch sizes."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from graphpool.bench import common
from graphpool.bench.common import MIB, progress
from graphpool.bench.decode import DecodeSetup, build_random_model, setup_input_specs
from graphpool.bench.memory_results import BudgetResult, LayoutResult, MemoryBenchConfig, SizeMemory, markdown
from graphpool.pool import CapturedGraph, Capturer, CudaGraphCapturer, GraphPool, PoolConfig, cuda_state

# NOTE: the arena first: the driver keeps the executables' heap the first layout grows, and the second reuses it
LAYOUTS = ("arena", "per_graph")


class Recorder:
    """A capturer that keeps every graph it captured (their footprints and byte breakdowns)."""

    def __init__(self, inner: Capturer) -> None:
        self.inner = inner
        self.graphs: dict[int, CapturedGraph] = {}

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        graph = self.inner.capture(size, fn)
        self.graphs[size] = graph
        return graph

    def replay(self, graph: CapturedGraph) -> None:
        self.inner.replay(graph)

    def release(self, graph: CapturedGraph) -> None:
        self.inner.release(graph)

    def drain(self) -> None:
        self.inner.drain()


def _held(device: torch.device, base: int) -> float:
    return (common.driver_used_bytes(device) - base) / MIB


def _pool_config(cfg: MemoryBenchConfig, layout: str, budget: int | None = None, pool_size: int | None = None) -> PoolConfig:
    kwargs: dict[str, Any] = dict(max_batch_size=cfg.max_batch_size, split_batch_size=cfg.split_batch_size,
                                  grow_step=cfg.grow_step, max_len_in_batch=cfg.context_len, miss_policy="capture",
                                  graph_memory_budget=budget, mempool=layout)
    ladder = PoolConfig(**kwargs).ladder()
    return PoolConfig(**kwargs, max_graph_pool_size=pool_size or len(ladder))


def capture_order(config: PoolConfig, resident: int) -> list[list[int]]:
    """The ladder in three groups, each captured largest first: the start-up cover, the sizes of a tighter
    cover that fill the pool to ``resident`` graphs, then the rest."""
    ladder = config.ladder()
    cover = ladder.padding_cover(config.max_padding_ratio)[:resident]
    fill = [s for s in ladder.padding_cover(config.max_padding_ratio / 2) if s not in cover]
    fill += [s for s in reversed(ladder.sizes) if s not in cover and s not in fill]
    fill = fill[: max(0, resident - len(cover))]
    rest = [s for s in reversed(ladder.sizes) if s not in cover and s not in fill]
    return [g for g in (sorted(cover, reverse=True), sorted(fill, reverse=True), rest) if g]


def _size_memory(g: CapturedGraph) -> SizeMemory:
    m = g.memory
    return SizeMemory(g.size, (m.outputs if m else 0) / MIB, (m.pool_growth if m else 0) / MIB,
                      (m.graph if m else 0) / MIB, (m.first_use if m else 0) / MIB, g.footprint / MIB, g.seconds)


def bench_layout(setup: DecodeSetup, cfg: MemoryBenchConfig, layout: str, capturer: Capturer | None = None) -> LayoutResult:
    device = setup.model.device
    base = common.driver_used_bytes(device)
    rec = Recorder(capturer if capturer is not None else CudaGraphCapturer(device, layout))  # type: ignore[arg-type]
    pool = GraphPool(setup.engine_step_fn(), setup_input_specs(setup), _pool_config(cfg, layout), device, rec)
    res = LayoutResult(layout, len(pool.ladder), 0.0, _held(device, base), 0.0)
    order: list[int] = []
    for group in capture_order(pool.config, cfg.resident):
        t0 = time.perf_counter()
        pool.warmup(group)
        res.capture_seconds += time.perf_counter() - t0
        order += group
        st = pool.stats()
        res.points.append((st.resident_graphs, _held(device, base), st.resident_bytes / MIB))
        res.point_arenas.append(st.arena_bytes / MIB)
        res.point_seconds.append(res.capture_seconds)
        progress(f"  {layout}: {st.resident_graphs} graphs hold {res.points[-1][1]:.0f} MiB (driver view), "
                 f"{st.arena_bytes / MIB:.0f} MiB of it the arena")
    st = pool.stats()
    res.accounted_mib_all, res.arena_mib = st.resident_bytes / MIB, st.arena_bytes / MIB
    res.sizes = [_size_memory(rec.graphs[s]) for s in sorted(rec.graphs)]
    res.executables_mib = sum(s.graph_mib for s in res.sizes)
    for n in sorted(cfg.evict_to, reverse=True):
        victims = [s for s in reversed(order) if s in pool.resident_sizes()][: max(0, pool.stats().resident_graphs - n)]
        if not victims:
            continue
        before, held = pool.stats().resident_bytes, _held(device, base)
        for s in victims:
            pool.evict(s)
        st = pool.stats()
        res.points.append((st.resident_graphs, _held(device, base), st.resident_bytes / MIB))
        res.point_arenas.append(st.arena_bytes / MIB)
        res.evictions.append((len(victims), (before - st.resident_bytes) / MIB, held - res.points[-1][1]))
        progress(f"  {layout}: evicted to {st.resident_graphs} graphs: {res.points[-1][1]:.0f} MiB held")
    pool.close()
    del pool, rec
    res.held_after_close_mib = _held(device, base)
    return res


def bench_replay(setup: DecodeSetup, cfg: MemoryBenchConfig) -> dict[str, dict[int, float]]:
    """Median ms of the engine's step (a replay through `GraphPool.run`, then the LM head) per layout and size,
    the layouts' rounds interleaved."""
    device = setup.model.device
    sizes = [s for s in cfg.replay_sizes if s <= cfg.max_batch_size]
    pools = {lay: GraphPool(setup.engine_step_fn(), setup_input_specs(setup), _pool_config(cfg, lay), device)
             for lay in LAYOUTS}
    for pool in pools.values():
        pool.warmup(sizes)
    batches = {s: setup.batch(s) for s in sizes}
    times: dict[str, dict[int, list[float]]] = {lay: {s: [] for s in sizes} for lay in LAYOUTS}
    for _ in range(cfg.replay_rounds):
        for lay, pool in pools.items():
            for s in sizes:
                times[lay][s] += common.time_ms(lambda p=pool, b=batches[s]: setup.head(p.run(b)), device, 2, cfg.replay_reps)
    for pool in pools.values():
        pool.close()
    return {lay: {s: common.median(ts) for s, ts in by.items()} for lay, by in times.items()}


def bench_budget(setup: DecodeSetup, cfg: MemoryBenchConfig, budget: int, capturer: Capturer | None = None,
                 layout: str = "arena") -> BudgetResult:
    device = setup.model.device
    base = common.driver_used_bytes(device)
    pool = GraphPool(setup.engine_step_fn(), setup_input_specs(setup), _pool_config(cfg, layout, budget), device,
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
        pool.run(setup.batch(rng.randint(1, cfg.max_batch_size)), max_len_in_batch=cfg.context_len)
        check()
    st = pool.stats()
    pool.close()
    return BudgetResult(budget / MIB, len(captured), max_acc / MIB, max_held, st.resident_graphs, st.captures,
                        st.evictions, over, layout)


def default_budget(layout: LayoutResult) -> float:
    """Half the arena of the whole ladder plus what the graphs hold alone (MiB): a budget that binds, since
    the largest sizes' activations do not fit it (they run eagerly) and the arena of the rest does."""
    return max(1.0, (layout.arena_mib + sum(s.own_mib for s in layout.sizes)) / 2)


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
    cuda_state.side_stream(device)  # NOTE: its workspaces once, before every baseline
    step = setup.engine_step_fn()
    for bs in sorted({1, *cfg.replay_sizes, cfg.max_batch_size}):  # the eager kernels' modules, before the baselines
        if bs <= cfg.max_batch_size:
            setup.head(step(setup.batch(bs)))
    layouts = [bench_layout(setup, cfg, layout) for layout in LAYOUTS]
    replay = bench_replay(setup, cfg)
    arena = next(r for r in layouts if r.layout == "arena")
    budget_mib = cfg.budget_mib if cfg.budget_mib is not None else default_budget(arena)
    budget = bench_budget(setup, cfg, int(budget_mib * MIB))
    results = {"config": cfg, "layouts": layouts, "budget": budget, "replay": replay}
    ups = len(capture_order(_pool_config(cfg, "arena"), cfg.resident))
    body = markdown(layouts, budget, cfg, ups, replay, (cuda_state.capture_stream_overhead(device) or 0) / MIB)
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
    p.add_argument("--resident", type=int, default=16, help="graphs of the fully populated pool (16)")
    p.add_argument("--evict-to", type=int, nargs="+", default=[32, 16, 8, 1, 0])
    p.add_argument("--budget-mib", type=float, default=None,
                   help="byte budget of the budget run (default: half of what the arena layout holds for the ladder)")
    p.add_argument("--sweep-steps", type=int, default=92)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attn-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--out", type=Path, default=Path("results/memory"))


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    cfg = MemoryBenchConfig(model=args.model, context_len=args.context_len, resident=args.resident,
                            evict_to=tuple(args.evict_to), budget_mib=args.budget_mib, sweep_steps=args.sweep_steps,
                            device=args.device, dtype=args.dtype, attn_backend=args.attn_backend)
    run_memory_bench(cfg, args.out, argv)
