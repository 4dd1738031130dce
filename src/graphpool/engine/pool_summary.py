"""`describe(stats)`: a graph pool's work in one line, for every command that prints it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphpool.pool import PoolStats

MIB = 1 << 20


def describe(stats: PoolStats, max_graphs: int | None = None, budget_bytes: int | None = None) -> str:
    """Decode steps by outcome, captures, evictions and what is resident; `max_graphs` and `budget_bytes`
    (the pool's bounds, when given) follow the resident count and bytes."""
    of_graphs = f"/{max_graphs}" if max_graphs is not None else ""
    of_budget = f" of {budget_bytes / MIB:.0f} MiB budget" if budget_bytes else ""
    return (
        f"{stats.steps} decode steps: {stats.hits} hits, {stats.padded_hits} padded hits, {stats.misses} misses, "
        f"{stats.captures} captures ({stats.capture_seconds_total:.2f} s), {stats.evictions} evictions, "
        f"{stats.eager_steps} eager; {stats.resident_graphs}{of_graphs} graphs resident "
        f"({stats.resident_bytes / MIB:.1f} MiB{of_budget})"
    )
