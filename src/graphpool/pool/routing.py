"""Where a step goes before residency is asked: whether graphs can run at all (`graphs_off`), the bucket a
shape routes to (`Route`, from `GraphPool.route`), and the eviction log line."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from graphpool.pool.stats import FallbackReason

logger = logging.getLogger("graphpool.pool.pool")  # NOTE: the pool's logger: eviction lines come from GraphPool


class _EvictionLog:
    """Logs the first few evictions one by one, then one summary line every ``every`` evictions."""

    def __init__(self, first: int = 8, every: int = 100) -> None:
        self.first, self.every, self.count = first, every, 0

    def note(self, size: int, nbytes: int, why: str) -> None:
        self.count += 1
        if self.count <= self.first:
            logger.info("graph pool: evicted bs=%d (%s, %.1f MiB)", size, why, nbytes / 2**20)
        elif self.count % self.every == 0:
            logger.info("graph pool: %d evictions so far (latest bs=%d, %s)", self.count, size, why)


def graphs_off(enabled: bool, device: torch.device, has_capturer: bool) -> FallbackReason | None:
    """Why no step can ever replay a graph, or None (graphs on): no CUDA device (and no capturer standing in
    for CUDA graphs) first, then graphs disabled (``PoolConfig.enabled``)."""
    if device.type != "cuda" and not has_capturer:
        return FallbackReason.NO_CUDA
    return None if enabled else FallbackReason.DISABLED


@dataclass(frozen=True)
class Route:
    """Where a step of one shape goes before residency and the miss policy are asked: ``bucket``, the ladder
    size whose graph (or a larger resident one) may serve it, unless ``reason`` says why it runs eagerly."""

    bucket: int | None
    reason: FallbackReason | None = None
