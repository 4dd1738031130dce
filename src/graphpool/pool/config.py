"""PoolConfig: every knob of the graph pool, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from graphpool.pool.buckets import BucketLadder

MempoolLayout = Literal["arena", "per_graph", "shared"]
LAYOUTS: tuple[MempoolLayout, ...] = ("arena", "per_graph", "shared")
MissPolicyName = Literal["capture", "admit"]

# NOTE: the one line that picks the default mempool layout (bench memory decides it, docs/benchmarks.md).
DEFAULT_MEMPOOL: MempoolLayout = "arena"

# NOTE: the one line that picks the default miss policy (the serving-trace benchmark decides it).
DEFAULT_MISS_POLICY: MissPolicyName = "admit"
DEFAULT_MAX_GRAPH_POOL_SIZE = 16  # LightLLM's bound on resident graphs


@dataclass(frozen=True)
class PoolConfig:
    """Configuration of a GraphPool.

    Batch sizes are per microbatch: with ``num_microbatches=2`` a graph of size ``b`` runs two microbatches
    of ``b`` rows each. ``batch_sizes`` (an explicit ladder) overrides max/split/grow.
    """

    max_batch_size: int = 256
    split_batch_size: int = 32
    grow_step: int = 16
    batch_sizes: tuple[int, ...] | None = None
    max_graph_pool_size: int = DEFAULT_MAX_GRAPH_POOL_SIZE
    graph_memory_budget: int | None = None  # bytes of device memory for all resident graphs and their arena
    max_len_in_batch: int = 8192  # graphs only for steps whose max_len_in_batch is <= this
    pinned: tuple[int, ...] = ()  # ladder sizes never evicted by the LRU or the budget
    mempool: MempoolLayout = DEFAULT_MEMPOOL
    miss_policy: MissPolicyName = DEFAULT_MISS_POLICY
    max_padding_ratio: float = 0.5  # "admit": a miss may use a resident graph of size <= bucket*(1+ratio)
    admit_after: int = 3  # "admit": capture a size once requested this often within the window ...
    admit_window: int = 128  # ... of the last this-many graph-eligible steps
    # a capture the miss policy asks for while a larger graph is resident is not made in the step (it stalls every
    # row of it): the step pads into that graph and the size waits for capture_wanted(), which the engine calls
    # when idle
    defer_captures: bool = False
    # ... for at most this many of its own steps: a size still waiting then (no idle moment came) is captured in
    # the step, so a steady load does not pay the padding for ever (a capture costs a few dozen steps' time)
    defer_max_padded_steps: int = 64
    enabled: bool = True  # False = disable_cudagraph: every step eager
    num_microbatches: int = 1  # 2 = two microbatches in one graph (overlap mode)
    _ladder: BucketLadder = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.batch_sizes is not None:
            if not isinstance(self.batch_sizes, tuple):
                object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
            ladder = BucketLadder(self.batch_sizes)  # raises on empty, < 1, unsorted, duplicates
        else:
            ladder = BucketLadder.build(self.max_batch_size, self.split_batch_size, self.grow_step)
        if self.max_graph_pool_size < 1:
            raise ValueError(f"max_graph_pool_size must be >= 1, got {self.max_graph_pool_size}")
        if self.max_len_in_batch < 1:
            raise ValueError(f"max_len_in_batch must be >= 1, got {self.max_len_in_batch}")
        if self.mempool not in LAYOUTS:
            raise ValueError(f"mempool must be one of {LAYOUTS}, got {self.mempool!r}")
        if self.graph_memory_budget is not None:
            if self.graph_memory_budget <= 0:
                raise ValueError(f"graph_memory_budget must be > 0 bytes (or None), got {self.graph_memory_budget}")
            if self.mempool == "shared":
                raise ValueError(
                    "graph_memory_budget needs mempool='arena' or 'per_graph': in the shared mempool every "
                    "graph keeps its outputs, and evicting one returns no device memory until every graph on "
                    "it is gone, so a byte budget would be enforced on paper only"
                )
        if self.miss_policy not in ("capture", "admit"):
            raise ValueError(f"miss_policy must be 'capture' or 'admit', got {self.miss_policy!r}")
        if not self.max_padding_ratio >= 0.0:
            raise ValueError(f"max_padding_ratio must be >= 0, got {self.max_padding_ratio}")
        if self.admit_after < 1:
            raise ValueError(f"admit_after must be >= 1, got {self.admit_after}")
        if self.admit_window < self.admit_after:
            raise ValueError(
                f"admit_window ({self.admit_window}) must be >= admit_after ({self.admit_after}), "
                "or no size could ever be admitted"
            )
        if self.defer_max_padded_steps < 1:
            raise ValueError(f"defer_max_padded_steps must be >= 1, got {self.defer_max_padded_steps}")
        if self.num_microbatches not in (1, 2):
            raise ValueError(f"num_microbatches must be 1 or 2, got {self.num_microbatches}")
        if not isinstance(self.pinned, tuple):
            object.__setattr__(self, "pinned", tuple(self.pinned))
        if len(set(self.pinned)) != len(self.pinned):
            raise ValueError(f"pinned sizes contain duplicates: {self.pinned}")
        for s in self.pinned:
            if s not in ladder:
                raise ValueError(f"pinned size {s} is not a ladder size (ladder: {list(ladder.sizes)})")
        if len(self.pinned) >= self.max_graph_pool_size:
            raise ValueError(
                f"{len(self.pinned)} pinned sizes need max_graph_pool_size > {len(self.pinned)} "
                f"(got {self.max_graph_pool_size}): one slot must stay evictable"
            )
        object.__setattr__(self, "_ladder", ladder)

    def ladder(self) -> BucketLadder:
        """The graph batch sizes of this config (built once, at construction)."""
        return self._ladder
