"""The step bench's configuration and result row (its own module: the compile column and the plots use both)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphpool.model.config import ModelConfig

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class StepBenchConfig:
    models: tuple[str | ModelConfig, ...] = ("llama3.2-1b", "llama3-8b")
    batch_sizes: tuple[int, ...] = DEFAULT_SIZES
    compile_sizes: tuple[int, ...] = (1, 32)
    context_len: int = 1024
    block_size: int = 16
    device: str = "auto"
    dtype: str = "auto"
    attn_backend: str = "auto"
    warmup: int = 5
    reps: int = 30
    use_pool: bool = True
    # sizes (of batch_sizes) at which the whole engine's decode step is timed, synchronous and async
    engine_sizes: tuple[int, ...] = (1, 8, 64)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("step bench: give at least one model")
        for name in ("batch_sizes", "compile_sizes", "engine_sizes"):
            sizes = getattr(self, name)
            if any(s < 1 for s in sizes):
                raise ValueError(f"step bench: {name} must be >= 1, got {sizes}")
        if not self.batch_sizes:
            raise ValueError("step bench: give at least one batch size")
        if self.context_len < 1 or self.block_size < 1 or self.warmup < 0 or self.reps < 1:
            raise ValueError("step bench: context_len, block_size, reps must be >= 1 and warmup >= 0")


@dataclass
class StepRow:
    model: str
    batch_size: int
    eager_ms: float
    graph_ms: float = math.nan  # torch.cuda.graph replay of the step
    pool_ms: float = math.nan  # GraphPool.run (copy-in, replay, slice out)
    engine_ms: float = math.nan  # the engine's whole decode step (bench/engine_step.py), synchronous
    engine_async_ms: float = math.nan  # ... with async scheduling
    # torch.compile(mode="reduce-overhead") of the plain-torch-ops twin of the step (compile_step.py says why)
    compile_ms: float = math.nan
    compile_s: float = math.nan  # first calls of the compiled step (compile + its own capture)
    compile_cudagraph_skips: int | None = None  # inductor's count of skipped cudagraph partitions
    compile_error: str | None = None
    torch_ops_eager_ms: float = math.nan  # the plain-torch-ops step, eager: the compile's own baseline
    compile_rel_err: float = math.nan  # ||compiled - plain-ops eager|| / ||plain-ops eager||, same inputs
    capture_ms: float = math.nan  # torch.cuda.graph capture alone (after one warm-up run)
    graph_rel_err: float = math.nan  # ||graph - eager|| / ||eager|| on the same inputs
    weight_bytes: int = 0
    kv_bytes: int = 0
    floor_ms: float = math.nan
    speedup: float = math.nan  # eager / graph
    graph_over_floor: float = math.nan
    notes: list[str] = field(default_factory=list)
