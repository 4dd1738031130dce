"""What an LLMEngine reports about itself: counters, the KV and prefix cache, the graph pool (every rank's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.outputs import EngineStats
from graphpool.engine.prefix_cache import PrefixCacheStats
from graphpool.engine.runner import ModelRunner
from graphpool.engine.scheduler import Scheduler
from graphpool.pool import FallbackReason, PoolStats

if TYPE_CHECKING:
    from graphpool.engine.async_scheduling import AsyncDecode
    from graphpool.engine.tp_leader import TPLeader


class EngineIntrospection:
    """The engine's read-only reports (and `close`, which ends its other ranks)."""

    runner: ModelRunner
    block_manager: BlockManager
    scheduler: Scheduler
    prompt_tokens_total: int
    generation_tokens_total: int
    _tp: TPLeader | None
    _async: AsyncDecode | None

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.block_manager.pool.stats()

    @property
    def graphs_off(self) -> FallbackReason | None:
        """Why no decode step replays a graph here (no CUDA device, disable_cudagraph), or None: graphs on."""
        return self.runner.pool.graphs_off

    def graph_stats(self) -> PoolStats | None:
        return self.runner.pool.stats() if self.graphs_off is None else None

    def graph_stats_by_rank(self) -> list[PoolStats | None]:
        """Every tensor-parallel rank's pool stats, rank 0 first (in lockstep they differ only in capture
        seconds)."""
        return [self.graph_stats(), *(self._tp.pool_stats() if self._tp is not None else [])]

    def close(self) -> None:
        """Stops the other tensor-parallel ranks (a no-op with one rank); the engine cannot step afterwards."""
        if self._tp is not None:
            self._tp.close()

    def stats(self) -> EngineStats:
        prefix = self.prefix_cache_stats()
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            num_free_kv_blocks=self.block_manager.num_free_blocks,
            num_kv_blocks=self.block_manager.num_usable_blocks,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            preemptions_total=self.scheduler.num_preemptions,
            prefix_cache_queries_tokens_total=prefix.queries_tokens,
            prefix_cache_hits_tokens_total=prefix.hits_tokens,
            prefix_cache_blocks=prefix.cached_blocks,
            async_chained_steps_total=self._async.chained_steps if self._async is not None else 0,
            graph_warmup_pending=self.runner.deferred_graphs,
        )
