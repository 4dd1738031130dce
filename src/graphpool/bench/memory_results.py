"""`bench memory`'s configuration, its results and their Markdown report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphpool.bench import common
from graphpool.bench.common import md_table


@dataclass(frozen=True)
class MemoryBenchConfig:
    model: str = "llama3.2-1b"
    context_len: int = 1024
    max_batch_size: int = 256
    split_batch_size: int = 32
    grow_step: int = 16
    resident: int = 16  # the default pool, fully populated
    evict_to: tuple[int, ...] = (32, 16, 8, 1, 0)  # after the whole ladder: evict the latest captured down to N
    budget_mib: float | None = None  # None: `default_budget`, half the arena layout's whole ladder
    sweep_steps: int = 92  # random batch sizes run through the budgeted pool
    replay_sizes: tuple[int, ...] = (1, 8, 64, 128)
    replay_rounds: int = 7  # rounds of each layout, interleaved
    replay_reps: int = 20  # timed replays a round
    device: str = "auto"
    dtype: str = "auto"
    attn_backend: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if any(n < 0 for n in self.evict_to):
            raise ValueError(f"memory bench: evict_to counts must be >= 0, got {self.evict_to}")
        if self.budget_mib is not None and not self.budget_mib > 0:
            raise ValueError(f"memory bench: budget_mib must be > 0, got {self.budget_mib}")
        if self.context_len < 1 or self.sweep_steps < 0 or self.resident < 1:
            raise ValueError("memory bench: context_len and resident must be >= 1 and sweep_steps >= 0")


@dataclass
class SizeMemory:
    size: int
    outputs_mib: float  # the step's outputs
    pool_growth_mib: float  # how much the capture grew its mempool (activations, outputs, rounding)
    graph_mib: float  # the graph executable and its kernel parameters (driver bytes outside the mempool)
    first_use_mib: float  # modules loaded on a kernel's first launch (the process's, never given back)
    own_mib: float  # what the graph alone holds: what evicting it gives back
    seconds: float


@dataclass
class LayoutResult:
    layout: str
    ladder_size: int
    capture_seconds: float
    static_mib: float  # the pool's static input buffers
    accounted_mib_all: float  # what the pool accounts with the whole ladder resident
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (resident graphs, held MiB, accounted MiB)
    held_after_close_mib: float = math.nan
    sizes: list[SizeMemory] = field(default_factory=list)
    arena_mib: float = 0.0  # the arena with the whole ladder resident
    point_arenas: list[float] = field(default_factory=list)  # the arena at each of `points` (MiB)
    point_seconds: list[float] = field(default_factory=list)  # capture seconds up to each of `points`
    executables_mib: float = 0.0  # driver bytes outside the mempools over every capture (the executables)
    evictions: list[tuple[int, float, float]] = field(default_factory=list)  # (graphs evicted, accounted MiB, freed MiB)


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
    layout: str = "arena"


def markdown(layouts: Sequence[LayoutResult], budget: BudgetResult, cfg: MemoryBenchConfig, ups: int,
             replay: dict[str, dict[int, float]] | None = None, overhead_mib: float = 0.0) -> str:
    """The report; `ups`: how many of a layout's points are the captures (the rest are evictions)."""
    out = [f"Model {cfg.model} (random weights), the engine's decode step as its pool captures it (up to the final "
           f"norm; the LM head runs after the replay) at context "
           f"{cfg.context_len}, ladder of {layouts[0].ladder_size} sizes up to {cfg.max_batch_size}. MiB, driver "
           "view (`mem_get_info`), split by the caching allocator's view of the graph's mempool. The capture "
           f"stream's cuBLAS workspaces ({overhead_mib:.0f} MiB, once per process) are outside every number.\n\n"]
    shown = {1, 8, 32, 64, 128, cfg.max_batch_size}
    rows = [[r.layout, s.size, s.outputs_mib, s.pool_growth_mib, s.graph_mib, s.first_use_mib, s.own_mib]
            for r in layouts for s in r.sizes if s.size in shown]
    out.append(md_table(["layout", "bs", "outputs", "mempool growth (activations, outputs, rounding)",
                         "graph executable", "first use (modules)", "the graph alone holds"], rows))
    out.append("\nResident sets, captured largest first (the cover, filled to the pool size, then the ladder):\n\n")
    rows = [[r.layout, n, held, acc, arena, sec] for r in layouts
            for (n, held, acc), arena, sec in zip(r.points[:ups], r.point_arenas, r.point_seconds, strict=False)]
    out.append(md_table(["layout", "graphs", "held MiB", "accounted MiB", "of which the arena", "capture s"], rows))
    out.append("\nThe graph executables (driver bytes outside the mempools, over the whole ladder): " + ", ".join(
        f"{r.layout} {r.executables_mib:.0f} MiB" for r in layouts) + f" for {layouts[0].ladder_size} graphs; the "
        "driver keeps that heap for the process and the later layout reuses it.\n")
    out.append("\nEvicting (the latest captured first): accounted bytes and what the driver got back:\n\n")
    rows = [[r.layout, n, acc, freed, freed / acc if acc else math.nan] for r in layouts for n, acc, freed in r.evictions]
    out.append(md_table(["layout", "graphs evicted", "accounted MiB", "freed MiB", "freed / accounted"], rows))
    if replay:
        sizes = sorted(next(iter(replay.values())))
        rows = [[s, *[replay[lay][s] for lay in replay], common.ratio(replay["arena"][s], replay["per_graph"][s])]
                for s in sizes]
        out.append("\nThe engine's step (a replay through `GraphPool.run`, then the LM head), median ms (layouts "
                   "interleaved):\n\n")
        out.append(md_table(["bs", *replay, "arena / per_graph"], rows))
    out.append(f"\nByte budget ({budget.layout}, capture on miss, then {cfg.sweep_steps} random batch sizes):\n\n")
    out.append(md_table(
        ["budget MiB", "warm-up kept", "max accounted MiB", "max held MiB", "final graphs", "captures",
         "evictions", "accounted > budget"],
        [[budget.budget_mib, budget.warmup_captured, budget.max_accounted_mib, budget.max_held_mib,
          budget.final_resident_graphs, budget.captures, budget.evictions, budget.over_budget_events]],
    ))
    return "".join(out)
