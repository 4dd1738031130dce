"""Engine flags for every command that builds an engine (`generate`, `serve`, `bench serve`): argparse flags
named after EngineConfig's fields, and the EngineConfig they give."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from graphpool.kernels.switches import KERNEL_SWITCHES

if TYPE_CHECKING:
    from graphpool.engine.config import EngineConfig

# flag -> EngineConfig field; only flags the user gave are passed, so EngineConfig keeps the one set of defaults
_ENGINE_FLAGS: dict[str, str] = {}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Model, KV cache and graph pool flags, shared by `generate`, `serve` and `bench`."""
    from graphpool.engine.generation_defaults import GENERATION_CONFIG_MODES
    from graphpool.pool.config import DEFAULT_MAX_GRAPH_POOL_SIZE

    def add(flag: str, field: str, **kwargs: Any) -> None:
        _ENGINE_FLAGS[flag] = field
        group.add_argument(flag, dest=field, default=None, **kwargs)

    group = parser.add_argument_group("model and KV cache")
    add("--model", "model", help="'smollm2-135m-instruct' (embedded default), a .gguf file, a Hugging Face "
        "folder, a Hugging Face hub id org/name[@revision], or random:<preset> (random weights, e.g. "
        "random:llama3.2-1b). A GGUF is dequantized on loading (a Q4 file takes full-precision memory), "
        "except its Q4 linear weights on the CPU (--int4-weights)")
    add("--revision", "revision", help="hub id revision: a branch, tag or commit (default: main)")
    add("--download-dir", "download_dir", help="hub cache folder (default: huggingface_hub's, under HF_HOME; "
        "HF_HUB_OFFLINE=1 reads only the cache)")
    add("--cache-dir", "cache_dir", help="where the model's tokenizer, built once by transformers, is kept for later starts "
        "(default: $XDG_CACHE_HOME/graphpool or ~/.cache/graphpool; '' keeps none)")
    add("--generation-config", "generation_config", choices=list(GENERATION_CONFIG_MODES),
        help="auto (default): the model's generation_config.json gives the sampling defaults (temperature, top_p, "
             "top_k, min_p, repetition_penalty; do_sample false: greedy) of requests that do not set them; none: "
             "graphpool's own")
    add("--device", "device", help="auto (default), cpu, cuda, cuda:N")
    add("--dtype", "dtype", choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on CUDA and with 4-bit weights on the CPU, else float32")
    _ENGINE_FLAGS["--int4-weights"] = "int4_weights"
    group.add_argument("--int4-weights", dest="int4_weights", action=argparse.BooleanOptionalAction, default=None,
                       help="keep a GGUF's Q4_0/Q4_1/Q4_K linear weights 4-bit (and a Q8_0 LM head 8-bit) on the CPU, "
                            "bfloat16 activations (default: on for a GGUF on the CPU with --dtype auto and one rank)")
    add("--attn-backend", "attn_backend", choices=["auto", "torch", "triton"],
        help="decode attention: auto = triton on CUDA, torch on CPU")
    add("--disable-kernels", "disabled_kernels", metavar="NAMES",
        help=f"default-on kernels to turn off, comma-separated: {', '.join(KERNEL_SWITCHES)} (default: none)")
    add("--max-num-seqs", "max_num_seqs", type=int, help="most requests decoding at once (default 256)")
    add("--max-model-len", "max_model_len", type=int, help="prompt + output tokens per request (default 2048)")
    add("--max-num-batched-tokens", "max_num_batched_tokens", type=int,
        help="prefill token budget per step; longer prompts are prefilled in chunks over several steps")
    _ENGINE_FLAGS["--enable-prefix-caching"] = "enable_prefix_caching"
    group.add_argument("--enable-prefix-caching", dest="enable_prefix_caching",
                       action=argparse.BooleanOptionalAction, default=None,
                       help="reuse the KV blocks of identical prompt prefixes (default: on)")
    add("--kv-cache-fraction", "kv_cache_fraction", type=float,
        help="share of free GPU memory (after loading the model) for the KV cache (default 0.5)")
    add("--num-kv-blocks", "num_kv_blocks", type=int, help="exact number of KV blocks (overrides the fraction)")
    add("--block-size", "block_size", type=int, help="tokens per KV block (default 16)")
    add("--seed", "seed", type=int, help="engine random seed (default 0)")
    _ENGINE_FLAGS["--record-step-timeline"] = "record_step_timeline"
    group.add_argument("--record-step-timeline", dest="record_step_timeline", action="store_true", default=None,
                       help="keep a timeline of engine steps (kind, batch, start, host and device time), served "
                            "at GET /debug/steps (what `bench serve` attributes latency gaps with)")
    add("--tensor-parallel-size", "tensor_parallel_size", type=int,
        help="ranks to shard the model over: one process per GPU (NCCL), or CPU processes (gloo) (default 1)")
    add("--cpu-threads", "cpu_threads", type=int, metavar="N",
        help="torch threads per rank on the CPU device (default: the usable cores less one, over the ranks; "
             "torch's own when OMP_NUM_THREADS is set)")
    group = parser.add_argument_group("CUDA graph pool")
    add("--max-graph-pool-size", "max_graph_pool_size", type=int, help=f"most graphs resident at once (default "
        f"{DEFAULT_MAX_GRAPH_POOL_SIZE}; the whole ladder with --graph-warmup all)")
    add("--graph-max-batch-size", "graph_max_batch_size", type=int, help="largest graph batch size (256)")
    add("--graph-split-batch-size", "graph_split_batch_size", type=int,
        help="every batch size up to this one gets its own graph size (32)")
    add("--graph-grow-step-size", "graph_grow_step_size", type=int, help="graph size step above the split (16)")
    add("--graph-max-len-in-batch", "graph_max_len_in_batch", type=int,
        help="longest context a graph serves; longer steps run eagerly (default: max-model-len)")
    add("--graph-memory-budget", "graph_memory_budget",
        help="device memory for all resident graphs, e.g. 512MiB, 2GiB, or bytes (default: no byte bound)")
    add("--graph-miss-policy", "graph_miss_policy", choices=["capture", "admit"],
        help="on a miss: capture at once, or admit sizes seen often (default: the pool's)")
    add("--graph-mempool", "graph_mempool", choices=["arena", "per_graph", "shared"],
        help="arena (default): one shared pool for every graph's activations, a graph holds only its "
             "executable; per_graph: one pool per graph; shared: one pool that keeps every graph's outputs")
    _ENGINE_FLAGS["--graph-defer-captures"] = "graph_defer_captures"
    group.add_argument("--graph-defer-captures", dest="graph_defer_captures", action=argparse.BooleanOptionalAction,
                       default=None, help="a size admitted while a larger graph can serve it padded is captured "
                       "when the server is idle, not in the step (a capture stalls every stream) (default: off)")
    add("--graph-warmup", "graph_warmup", help="capture at start-up: cover (default: a padding cover of the ladder), none, all, or sizes like 1,2,4,8")
    add("--graph-prefill-max-tokens", "graph_prefill_max_tokens", type=int,
        help="prefill steps of at most this many tokens replay a resident decode graph, one row a token "
             "(default: 256 or --graph-max-batch-size if smaller; 0: off)")
    add("--graph-sample-max-batch-size", "graph_sample_max_batch_size", type=int,
        help="decode graphs of at most this many rows also run the LM head and the draw, so such a step's tokens "
             "come out of its replay (default: 8 on one GPU without microbatch overlap; 0: off)")
    add("--idle-prefill-steps", "idle_prefill_steps", type=int,
        help="with nothing decoding, a prompt of at most this many graph-prefill steps' tokens is prefilled in "
             "such steps, each a graph replay (default: 3; 0: one eager step)")
    _ENGINE_FLAGS["--enable-mixed-steps"] = "enable_mixed_steps"
    group.add_argument("--enable-mixed-steps", dest="enable_mixed_steps", action=argparse.BooleanOptionalAction,
                       default=None, help="decode steps take prompt chunks into their leftover rows (up to the "
                       "largest graph and the token budget), so streams get tokens while prompts prefill (default: on with CUDA graphs)")
    add("--mixed-prompt-tokens", "mixed_prompt_tokens", type=int, metavar="N",
        help="most prompt tokens a mixed step takes beside its decode rows: smaller steps delay the streams in them "
             "less, prompts take more steps (default: as many as fit)")
    _ENGINE_FLAGS["--async-scheduling"] = "async_scheduling"
    group.add_argument("--async-scheduling", dest="async_scheduling", action=argparse.BooleanOptionalAction,
                       default=None, help="launch the next decode step before the host has this one's tokens, so "
                       "detokenizing and scheduling overlap the GPU's work (default: on with CUDA, off on the CPU "
                       "and with --profile-steps)")
    _ENGINE_FLAGS["--enable-microbatch-overlap"] = "enable_microbatch_overlap"
    group.add_argument("--enable-microbatch-overlap", dest="enable_microbatch_overlap", action="store_true",
                       default=None, help="run each decode step as two microbatches in one graph, so one's "
                       "tensor-parallel all-reduce overlaps the other's compute (graph sizes per microbatch)")
    _ENGINE_FLAGS["--disable-cudagraph"] = "disable_cudagraph"
    group.add_argument("--disable-cudagraph", dest="disable_cudagraph", action="store_true", default=None,
                       help="run every decode step eagerly")


def engine_config_from_args(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """EngineConfig from the flags the user gave (everything else keeps EngineConfig's defaults)."""
    from graphpool.engine.config import EngineConfig

    kwargs = {field: getattr(args, field) for field in _ENGINE_FLAGS.values() if getattr(args, field, None) is not None}
    kwargs.update(overrides)
    return EngineConfig(**kwargs)
