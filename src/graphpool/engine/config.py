"""EngineConfig: every engine and pool setting, validated once."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from graphpool.engine.generation_defaults import GENERATION_CONFIG_MODES
from graphpool.engine.values import parse_bytes, resolve_device
from graphpool.kernels.switches import check_switches
from graphpool.model.int4 import int4_matmul_available
from graphpool.model.loader import DEFAULT_MODEL, names_gguf
from graphpool.pool import FallbackReason, graphs_off
from graphpool.pool.buckets import BucketLadder
from graphpool.pool.config import DEFAULT_MAX_GRAPH_POOL_SIZE, PoolConfig

_DTYPES = {"auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
_ATTN_BACKENDS = ("auto", "torch", "triton")
# NOTE: "cover" = the pool's padding cover of the ladder (few sizes, every size within the padding ratio of
# one); "all" = every ladder size, largest first, as far as the pool's bounds allow.
WARMUP_MODES = ("none", "cover", "all")
DEFAULT_GRAPH_PREFILL_MAX_TOKENS = 256
DEFAULT_GRAPH_SAMPLE_MAX_BATCH_SIZE = 8


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL
    revision: str | None = None  # of a hub id (a branch, tag or commit); None -> main
    download_dir: str | None = None  # hub cache folder; None -> huggingface_hub's (HF_HOME, HF_HUB_CACHE)
    # where a model's tokenizer, built once by transformers, is kept (model/tokenizer_cache.py); None ->
    # $XDG_CACHE_HOME/graphpool, else ~/.cache/graphpool; "" -> not kept (converted on every start)
    cache_dir: str | None = None
    generation_config: str = "auto"  # engine/generation_defaults.py; "none": graphpool's own sampling defaults
    device: str = "auto"
    dtype: str = "auto"  # auto: bfloat16 on CUDA and with int4_weights, else float32 on CPU
    # a GGUF's Q4_0 / Q4_1 / Q4_K linear weights kept 4-bit (a Q8_0 LM head 8-bit) on the CPU (model/int4.py; bfloat16
    # activations). None -> on for a GGUF on the CPU at dtype auto, one rank, where torch has the kernel: the
    # step reads a fraction of the bytes (docs/benchmarks.md, "4-bit weights on the CPU")
    int4_weights: bool | None = None
    max_num_seqs: int = 256
    max_model_len: int = 2048
    block_size: int = 16
    kv_cache_fraction: float = 0.5
    num_kv_blocks: int | None = None  # overrides kv_cache_fraction (block 0 is the reserved dummy block)
    # prefill token budget per step (longer prompts are prefilled in chunks); None -> max(max_model_len, 4096)
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True  # share the KV blocks of identical prompt prefixes between requests
    attn_backend: str = "auto"
    # default-on kernels to turn off (names of kernels/switches.KERNEL_SWITCHES; a tuple or "gemv,pdl")
    disabled_kernels: tuple[str, ...] | str = ()
    seed: int = 0
    profile_steps: bool = False  # synchronize around each step's forward to time it (benchmarks only)
    record_step_timeline: bool = False  # keep a timeline of steps (engine.timeline; the server's /debug/steps)
    # ranks (processes, one GPU each: cuda:i .. cuda:i+N-1 from the device's index i; gloo on the CPU)
    tensor_parallel_size: int = 1
    # torch threads per rank on the CPU device (set once at engine start); None -> engine/cpu_threads.py's default
    cpu_threads: int | None = None
    # graph pool settings (LightLLM's names)
    # NOTE: None -> the pool's default (PoolConfig), or more when graph_warmup asks for more sizes.
    max_graph_pool_size: int | None = None
    graph_max_batch_size: int = 256
    graph_split_batch_size: int = 32
    graph_grow_step_size: int = 16
    graph_max_len_in_batch: int | None = None  # None -> max_model_len
    graph_memory_budget: int | str | None = None  # bytes, or "512MiB" / "2GiB"
    disable_cudagraph: bool = False
    graph_miss_policy: str | None = None  # None -> the pool's default
    graph_mempool: str | None = None  # None -> the pool's default
    # a size the pool admits while a larger resident graph can serve it padded is captured when the server is
    # idle (LLMEngine.idle_work), not in the step, whose every row a capture stalls (PoolConfig.defer_captures)
    graph_defer_captures: bool = False
    # NOTE: "cover" by default: fewest captures while serving for a fraction of capture-all's start-up
    # (docs/benchmarks.md, "Default policy and why").
    graph_warmup: str | tuple[int, ...] = "cover"  # "none" | "cover" | "all" | batch sizes
    # prefill steps of at most this many tokens replay a resident decode graph, one row a token (0: off);
    # None -> min(256, graph_max_batch_size). NOTE: on by default: a short prefill replayed in a graph is an
    # order of magnitude faster than an eager one (docs/benchmarks.md, "Serving").
    graph_prefill_max_tokens: int | None = None
    # with nothing decoding, a prompt of at most this many graph-prefill steps' tokens is prefilled in such
    # steps, each a replay, not in one eager step (0: one eager step; docs/benchmarks.md "Prefill while nothing
    # decodes"); with mixed steps only
    idle_prefill_steps: int = 3
    # decode graphs of at most this many rows also run the LM head and the kernel draw, so a decode step that size
    # gets its tokens from the replay (no launches after it: the head and the draw's two stages were three); those
    # graphs' logits then live in the arena, bounded by this size. 0: the head runs after every replay. None ->
    # DEFAULT_GRAPH_SAMPLE_MAX_BATCH_SIZE on one rank without microbatches (capped at graph_max_batch_size), else 0
    graph_sample_max_batch_size: int | None = None
    # decode steps take prompt chunks into their leftover rows, up to graph_max_batch_size rows and the token
    # budget: running streams get a token in the steps that prefill (the ITL tail: docs/benchmarks.md).
    # None -> on where decode graphs run (the prompt rows ride in them), off on the CPU and without graphs
    enable_mixed_steps: bool | None = None
    # most prompt tokens a mixed step takes beside its decode rows: a smaller step costs the streams in it less
    # time (the ITL tail under load), and prompts take more steps. None -> as many as fit (above)
    mixed_prompt_tokens: int | None = None
    # launch the next decode step before the host has this one's tokens (engine/async_scheduling.py; what it
    # buys: docs/benchmarks.md). None -> on with CUDA unless profile_steps (which synchronizes every forward);
    # on the CPU the host and the "device" are the same cores, so there is nothing to overlap.
    async_scheduling: bool | None = None
    # decode steps as two microbatches in one graph, layers interleaved so one's all-reduce overlaps the
    # other's compute (LightLLM's overlap mode; for tensor parallel). Graph sizes are then per microbatch.
    enable_microbatch_overlap: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a preset name, a GGUF file or a Hugging Face model folder")
        for name in ("revision", "download_dir"):
            if getattr(self, name) is not None and (not isinstance(getattr(self, name), str) or not getattr(self, name)):
                raise ValueError(f"{name} must be a non-empty string or None, got {getattr(self, name)!r}")
        _ = self.torch_device  # resolved (and refused if bad) once, here: a cached property
        if self.generation_config not in GENERATION_CONFIG_MODES:
            raise ValueError(f"generation_config must be one of {GENERATION_CONFIG_MODES}, got {self.generation_config!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.attn_backend not in _ATTN_BACKENDS:
            raise ValueError(f"attn_backend must be one of {_ATTN_BACKENDS}, got {self.attn_backend!r}")
        object.__setattr__(self, "disabled_kernels", check_switches(self.disabled_kernels))
        for name in ("max_num_seqs", "max_model_len", "block_size",
                     "graph_max_batch_size", "graph_split_batch_size", "graph_grow_step_size"):
            _check_positive_int(name, getattr(self, name))
        for name in ("num_kv_blocks", "max_num_batched_tokens", "graph_max_len_in_batch", "cpu_threads",
                     "mixed_prompt_tokens"):
            if getattr(self, name) is not None:
                _check_positive_int(name, getattr(self, name))
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (block 0 is reserved), got {self.num_kv_blocks}")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0 < self.kv_cache_fraction < 1:
            raise ValueError(f"kv_cache_fraction must be in (0, 1), got {self.kv_cache_fraction}")
        if self.graph_memory_budget is not None:
            budget = parse_bytes(self.graph_memory_budget)
            if budget <= 0:
                raise ValueError(f"graph_memory_budget must be positive, got {self.graph_memory_budget!r}")
            object.__setattr__(self, "graph_memory_budget", budget)
        if isinstance(self.graph_warmup, str) and self.graph_warmup not in WARMUP_MODES:
            try:
                object.__setattr__(self, "graph_warmup", tuple(int(x) for x in self.graph_warmup.split(",")))
            except ValueError:
                raise ValueError(
                    f"graph_warmup must be 'none', 'cover', 'all' or batch sizes like '1,2,4', got {self.graph_warmup!r}"
                ) from None
        if isinstance(self.graph_warmup, (list, tuple)):
            sizes = tuple(self.graph_warmup)
            for s in sizes:
                _check_positive_int("graph_warmup size", s)
            object.__setattr__(self, "graph_warmup", sizes)
        elif self.graph_warmup not in WARMUP_MODES:
            raise ValueError(f"graph_warmup must be 'none', 'cover', 'all' or a tuple of sizes, got {self.graph_warmup!r}")
        if self.enable_mixed_steps is None:
            object.__setattr__(self, "enable_mixed_steps", self.graphs_off is None)
        if self.async_scheduling is None:
            object.__setattr__(self, "async_scheduling",
                               self.torch_device.type == "cuda" and self.profile_steps is False)
        self._resolve_int4()
        for name in ("disable_cudagraph", "profile_steps", "enable_prefix_caching", "record_step_timeline",
                     "enable_mixed_steps", "async_scheduling", "enable_microbatch_overlap", "int4_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._check_tensor_parallel()
        if self.async_scheduling and self.profile_steps:
            raise ValueError("async_scheduling and profile_steps exclude each other: profile_steps synchronizes "
                             "around every forward")
        self._check_graph_prefill()
        self._check_graph_sample()
        self._resolve_pool_size()
        # NOTE: the pool's own settings are validated by PoolConfig; build it now so errors surface here.
        _ = self.pool_config

    def _resolve_int4(self) -> None:
        where = (self.torch_device.type == "cpu" and self.dtype in ("auto", "bfloat16", "bf16")
                 and self.tensor_parallel_size == 1 and int4_matmul_available())
        if self.int4_weights is None:
            object.__setattr__(self, "int4_weights", where and self.dtype == "auto" and names_gguf(self.model))
        elif self.int4_weights is True and not where:
            raise ValueError("int4_weights needs the CPU device, dtype auto or bfloat16, tensor_parallel_size 1 "
                             f"and torch's CPU int4 matmul (torch >= 2.5; this is {torch.__version__})")

    def _check_graph_prefill(self) -> None:
        if self.graph_prefill_max_tokens is None:
            object.__setattr__(self, "graph_prefill_max_tokens",
                               min(DEFAULT_GRAPH_PREFILL_MAX_TOKENS, self.graph_max_batch_size))
        for name in ("graph_prefill_max_tokens", "idle_prefill_steps"):
            n = getattr(self, name)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"{name} must be an int >= 0 (0: off), got {n!r}")
        n = self.graph_prefill_max_tokens
        if n > self.graph_max_batch_size:
            raise ValueError(f"graph_prefill_max_tokens={n} is above graph_max_batch_size="
                             f"{self.graph_max_batch_size}: a prefill step replays a decode graph, one row a token")

    def _check_graph_sample(self) -> None:
        # NOTE: one rank, one microbatch: the draw reads every row's logits, which tensor parallel gathers from its
        # ranks and microbatch overlap splits across two graphs' outputs
        alone = self.tensor_parallel_size == 1 and not self.enable_microbatch_overlap
        n = self.graph_sample_max_batch_size
        if n is None:
            n = min(DEFAULT_GRAPH_SAMPLE_MAX_BATCH_SIZE, self.graph_max_batch_size) if alone else 0
            object.__setattr__(self, "graph_sample_max_batch_size", n)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"graph_sample_max_batch_size must be an int >= 0 (0: off), got {n!r}")
        if n and not alone:
            raise ValueError("graph_sample_max_batch_size needs tensor_parallel_size 1 and no microbatch overlap "
                             "(set it to 0)")

    def _check_tensor_parallel(self) -> None:
        """The settings alone; whether the model's heads shard over the ranks is checked where it is loaded
        (engine/tp_leader.py)."""
        n = self.tensor_parallel_size
        _check_positive_int("tensor_parallel_size", n)
        if n == 1:
            return
        import torch.distributed as dist

        if not dist.is_available():
            raise ValueError("tensor_parallel_size > 1 needs torch.distributed, which this torch build lacks")
        dev = self.torch_device
        if dev.type == "cuda" and (dev.index or 0) + n > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size {n} from {dev} needs GPUs {dev.index}..{(dev.index or 0) + n - 1}, "
                             f"but this machine has {torch.cuda.device_count()}")

    def rank_device(self, rank: int) -> str:
        """The device of tensor-parallel rank `rank`: the next GPUs after this config's, or the CPU."""
        dev = self.torch_device
        return "cpu" if dev.type == "cpu" else f"cuda:{(dev.index or 0) + rank}"

    def _resolve_pool_size(self) -> None:
        """Sizes the pool for what warm-up asks, or refuses a warm-up the pool would evict while serving."""
        ladder = BucketLadder.build(**self._ladder_kwargs())
        wanted = len(ladder.sizes) if self.graph_warmup == "all" else None
        if isinstance(self.graph_warmup, tuple):
            for s in self.graph_warmup:
                if s not in ladder:
                    raise ValueError(f"graph_warmup size {s} is not a graph size (the ladder: {list(ladder.sizes)})")
            wanted = len(set(self.graph_warmup))
        size = self.max_graph_pool_size
        if size is None:
            object.__setattr__(self, "max_graph_pool_size", max(DEFAULT_MAX_GRAPH_POOL_SIZE, wanted or 0))
            return
        _check_positive_int("max_graph_pool_size", size)
        if wanted is not None and wanted > size:
            what = "every ladder size" if self.graph_warmup == "all" else "the sizes asked for"
            raise ValueError(
                f"graph_warmup={self.graph_warmup!r} captures {wanted} graphs ({what}) but max_graph_pool_size "
                f"is {size}: the pool would hold only {size} and evict while serving. Set max_graph_pool_size "
                f">= {wanted} (or leave it unset to size the pool to the warm-up), or use graph_warmup='cover'"
            )

    # NOTE: cached: each torch.cuda.is_available() asks the driver (~1.5 ms; 120 asks in a start-up)
    @cached_property
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    @property
    def tokenizer_cache(self) -> Path | None:
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser() if self.cache_dir else None
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "graphpool"

    @property
    def resolved_attn_backend(self) -> str:
        """"auto" decided for this config's device (model.ops.default_attn_backend)."""
        from graphpool.model.ops import default_attn_backend

        return default_attn_backend(self.attn_backend, self.torch_device)

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = _DTYPES[self.dtype]
        if dtype is None:
            return torch.bfloat16 if self.torch_device.type == "cuda" or self.int4_weights else torch.float32
        return dtype

    @property
    def len_bound(self) -> int:
        """Longest context a captured decode graph serves (baked into its attention launch grid)."""
        if self.graph_max_len_in_batch is None:
            return self.max_model_len
        return min(self.graph_max_len_in_batch, self.max_model_len)

    @property
    def token_budget(self) -> int:
        return self.max_num_batched_tokens or max(self.max_model_len, 4096)

    @property
    def mixed_rows(self) -> int:
        """Rows a mixed step may fill (decode rows + prompt tokens); 0 without mixed steps."""
        return min(self.graph_max_batch_size, self.token_budget) if self.enable_mixed_steps else 0

    @property
    def idle_prefill_rows(self) -> int:
        """Tokens a prefill step takes of a short-enough prompt while nothing decodes (each such step replays
        a decode graph: `Scheduler`); 0 without mixed steps or graph prefill."""
        return min(self.mixed_rows, self.graph_prefill_max_tokens or 0) if self.idle_prefill_steps else 0

    @property
    def graphs_off(self) -> FallbackReason | None:
        """Why decode steps will never replay a CUDA graph (the pool's `graphs_off`: no CUDA device,
        disable_cudagraph), or None: graphs on. `LLMEngine.graphs_off` is the loaded engine's answer."""
        return graphs_off(not self.disable_cudagraph, self.torch_device, has_capturer=False)

    @property
    def num_microbatches(self) -> int:
        return 2 if self.enable_microbatch_overlap else 1

    def _ladder_kwargs(self) -> dict[str, int]:
        """The pool's ladder, whose sizes are per microbatch: with two, every graph_* size is halved (rounded
        up), so a graph still holds up to graph_max_batch_size rows in all."""
        n = self.num_microbatches
        # A max below the split just means every size up to the max gets its own graph.
        split = min(self.graph_split_batch_size, self.graph_max_batch_size)
        return dict(max_batch_size=-(-self.graph_max_batch_size // n),
                    split_batch_size=-(-split // n),
                    grow_step=max(1, self.graph_grow_step_size // n))

    @cached_property
    def pool_config(self) -> PoolConfig:
        """The graph pool's settings, built (and validated) once, by __post_init__."""
        kwargs: dict[str, Any] = dict(
            enabled=not self.disable_cudagraph,
            max_graph_pool_size=self.max_graph_pool_size,
            num_microbatches=self.num_microbatches,
            **self._ladder_kwargs(),
            max_len_in_batch=self.len_bound,
            graph_memory_budget=self.graph_memory_budget,
            defer_captures=self.graph_defer_captures,
        )
        if self.graph_miss_policy is not None:
            kwargs["miss_policy"] = self.graph_miss_policy
        if self.graph_mempool is not None:
            kwargs["mempool"] = self.graph_mempool
        return PoolConfig(**kwargs)


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
