"""The trace bench's settings and the graph policies it compares (their own module: the report reads both)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphpool.bench.common import MIB
from graphpool.bench.workload import TraceConfig
from graphpool.engine.config import EngineConfig
from graphpool.model.config import ModelConfig


def model_architecture(model: str) -> ModelConfig:
    """The ModelConfig of a model the engine accepts, without loading its weights (model.loader)."""
    from graphpool.model.loader import model_config

    return model_config(model)


CONFIG_NAMES = ("no-graphs", "capture-all", "lazy-unbounded", "lru16-capture-on-miss", "no-warmup", "budget",
                "warm-cover")
CONFIG_HELP = (
    "no-graphs; capture-all: every ladder size at start-up; lazy-unbounded: capture on miss, no eviction; "
    "lru16-capture-on-miss: LightLLM's pool (LRU 16, capture on miss, shared mempool); no-warmup: graphpool's pool "
    "without warm-up; budget: the same with a byte budget; warm-cover: graphpool warming a padding cover"
)


def config_order(key: str) -> tuple[int, str]:
    """Sort key: the configurations in the order above, any other name (a run saved by another version) after."""
    return (CONFIG_NAMES.index(key), "") if key in CONFIG_NAMES else (len(CONFIG_NAMES), key)


@dataclass(frozen=True)
class ServingConfig:
    key: str
    label: str
    overrides: dict[str, Any]  # EngineConfig fields


def serving_configs(ladder: Sequence[int], budget_bytes: int) -> list[ServingConfig]:
    """The policies under test, as EngineConfig overrides (graphpool's are named explicitly so the bench
    measures them whatever the defaults become)."""
    from graphpool.pool import PoolConfig

    all_sizes = tuple(ladder)  # NOTE: explicit sizes: "capture every size", whatever "all" means to the engine
    n = len(ladder)
    # NOTE: LightLLM's pool captures every size at start-up and its LRU then keeps the 16 smallest; warming exactly
    # those gives the same resident set (its start-up capture time is then understated, not overstated).
    seed_resident = tuple(sorted(ladder)[:16])
    pool_defaults = PoolConfig()
    cover = tuple(pool_defaults.ladder().padding_cover(pool_defaults.max_padding_ratio)[:16])
    capture = {"graph_miss_policy": "capture", "graph_mempool": "shared"}
    # NOTE: graphpool's configs use the pool's default miss policy and layout, named explicitly (and in the label)
    ours = {"graph_miss_policy": pool_defaults.miss_policy, "graph_mempool": pool_defaults.mempool}
    return [
        ServingConfig("no-graphs", "no graphs", {"disable_cudagraph": True}),
        ServingConfig("capture-all", "capture all at start-up",
                      {"max_graph_pool_size": n, "graph_warmup": all_sizes, **capture}),
        ServingConfig("lazy-unbounded", "lazy, unbounded", {"max_graph_pool_size": n, "graph_warmup": "none", **capture}),
        ServingConfig("lru16-capture-on-miss", "LightLLM: LRU 16",
                      {"max_graph_pool_size": 16, "graph_warmup": seed_resident, **capture}),
        ServingConfig("no-warmup", f"graphpool ({pool_defaults.miss_policy}, {pool_defaults.mempool})",
                      {**ours, "graph_warmup": "none"}),
        ServingConfig("budget", f"graphpool + budget {budget_bytes // MIB} MiB",
                      {**ours, "graph_warmup": "none", "graph_memory_budget": budget_bytes}),
        ServingConfig("warm-cover", f"graphpool + warm cover ({len(cover)})", {**ours, "graph_warmup": cover}),
    ]


@dataclass(frozen=True)
class TraceBenchConfig:
    model: str = "random:llama3.2-1b"
    # NOTE: 40 req/s is the over-capacity load (docs/benchmarks.md)
    rates: tuple[float, ...] = (4.0, 16.0, 40.0)
    duration_s: float = 8.0
    configs: tuple[str, ...] = CONFIG_NAMES
    budget_mib: int = 256
    kv_gib: float = 8.0
    max_model_len: int = 2048
    prompt_mean: float = 300.0
    prompt_cap: int = 1024
    output_mean: float = 256.0
    output_cap: int = 1024
    window: int = 1000  # decode steps over which the batch-size working set is counted
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if not self.rates or any(not r > 0 for r in self.rates):
            raise ValueError(f"trace bench: rates must be > 0 requests/s, got {self.rates}")
        unknown = set(self.configs) - set(CONFIG_NAMES)
        if unknown or not self.configs:
            raise ValueError(f"trace bench: configs are names of {', '.join(CONFIG_NAMES)}, got {self.configs}")
        if self.prompt_cap + self.output_cap > self.max_model_len:
            raise ValueError(f"prompt_cap + output_cap ({self.prompt_cap + self.output_cap}) must fit "
                             f"max_model_len ({self.max_model_len})")
        if not (self.duration_s > 0 and self.kv_gib > 0 and self.budget_mib > 0):
            raise ValueError("trace bench: duration_s, kv_gib and budget_mib must be > 0")

    def trace_config(self, rate: float) -> TraceConfig:
        return TraceConfig(rate=rate, duration_s=self.duration_s, prompt_mean=self.prompt_mean,
                           prompt_cap=self.prompt_cap, output_mean=self.output_mean, output_cap=self.output_cap,
                           seed=self.seed)

    def engine_config(self, overrides: dict[str, Any]) -> EngineConfig:
        from graphpool.engine.kv_cache import kv_bytes_per_block

        base = EngineConfig(model=self.model, device=self.device, dtype=self.dtype,
                            max_model_len=self.max_model_len)
        per_block = kv_bytes_per_block(model_architecture(self.model), base.block_size, base.torch_dtype)
        # NOTE: a fixed KV cache, the same for every configuration, so memory deltas are the graphs' own.
        blocks = max(2, int(self.kv_gib * (1 << 30)) // per_block)
        return EngineConfig(model=self.model, device=self.device, dtype=self.dtype, max_model_len=self.max_model_len,
                            num_kv_blocks=blocks, seed=self.seed, profile_steps=False, **overrides)

    @property
    def max_context(self) -> int:
        """The longest decode context the trace can reach (longest prompt + longest output - 1)."""
        return min(self.prompt_cap + self.output_cap, self.max_model_len) - 1
