"""The `graphpool` command: one subcommand per function (`generate` here; `serve` and `bench` add theirs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine

# flag -> EngineConfig field; only flags the user gave are passed, so EngineConfig keeps the one set of defaults
_ENGINE_FLAGS: dict[str, str] = {}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Model, KV cache and graph pool flags, shared by `generate`, `serve` and `bench`."""

    def add(flag: str, field: str, **kwargs: Any) -> None:
        _ENGINE_FLAGS[flag] = field
        group.add_argument(flag, dest=field, default=None, **kwargs)

    group = parser.add_argument_group("model and KV cache")
    add("--model", "model", help="'smollm2-135m-instruct' (embedded default), a .gguf file, a Hugging Face "
        "folder, or random:<preset> (random weights, e.g. random:llama3.2-1b)")
    add("--device", "device", help="auto (default), cpu, cuda, cuda:N")
    add("--dtype", "dtype", choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on CUDA, float32 on CPU")
    add("--attn-backend", "attn_backend", choices=["auto", "torch", "triton"],
        help="decode attention: auto = triton on CUDA, torch on CPU")
    add("--max-num-seqs", "max_num_seqs", type=int, help="most requests decoding at once (default 256)")
    add("--max-model-len", "max_model_len", type=int, help="prompt + output tokens per request (default 2048)")
    add("--max-num-batched-tokens", "max_num_batched_tokens", type=int, help="prefill tokens per step")
    add("--kv-cache-fraction", "kv_cache_fraction", type=float,
        help="share of free GPU memory (after loading the model) for the KV cache (default 0.5)")
    add("--num-kv-blocks", "num_kv_blocks", type=int, help="exact number of KV blocks (overrides the fraction)")
    add("--block-size", "block_size", type=int, help="tokens per KV block (default 16)")
    add("--seed", "seed", type=int, help="engine random seed (default 0)")
    group = parser.add_argument_group("CUDA graph pool")
    add("--max-graph-pool-size", "max_graph_pool_size", type=int, help="most graphs resident at once (default 16; the whole ladder with --graph-warmup all)")
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
    add("--graph-mempool", "graph_mempool", choices=["per_graph", "shared"],
        help="one memory pool per graph (eviction frees memory) or one shared pool")
    add("--graph-warmup", "graph_warmup", help="capture at start-up: cover (default: a padding cover of the ladder), none, all, or sizes like 1,2,4,8")
    _ENGINE_FLAGS["--disable-cudagraph"] = "disable_cudagraph"
    group.add_argument("--disable-cudagraph", dest="disable_cudagraph", action="store_true", default=None,
                       help="run every decode step eagerly")


def engine_config_from_args(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """EngineConfig from the flags the user gave (everything else keeps EngineConfig's defaults)."""
    from graphpool.engine.config import EngineConfig

    kwargs = {field: getattr(args, field) for field in _ENGINE_FLAGS.values() if getattr(args, field, None) is not None}
    kwargs.update(overrides)
    return EngineConfig(**kwargs)


def describe_graphs(engine: LLMEngine) -> str:
    """One line on the graph pool: why it is off, or what it did."""
    config = engine.config
    if config.torch_device.type != "cuda":
        return "graph pool: off - CUDA graphs need a CUDA GPU and this run is on the CPU, so decode ran eagerly"
    stats = engine.graph_stats()
    if stats is None:
        return "graph pool: off (--disable-cudagraph), decode ran eagerly"
    budget = f" of {config.graph_memory_budget / 2**20:.0f} MiB budget" if config.graph_memory_budget else ""
    return (
        f"graph pool: {stats.resident_graphs}/{config.max_graph_pool_size} graphs resident "
        f"({stats.resident_bytes / 2**20:.1f} MiB{budget}); {stats.steps} decode steps: {stats.hits} hits, "
        f"{stats.padded_hits} padded hits, {stats.misses} misses, {stats.captures} captures "
        f"({stats.capture_seconds_total:.2f} s), {stats.evictions} evictions, {stats.eager_steps} eager"
    )


# generate -------------------------------------------------------------------------------------------------
def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts (runs on a CPU-only machine)",
                       description="Generate completions with the engine; prints each completion and a "
                                   "one-line summary of the graph pool.")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    p.add_argument("--max-tokens", type=int, default=64, help="most new tokens per prompt (64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--stop", action="append", help="a stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-text token")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p)
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from graphpool.engine.llm import LLM
    from graphpool.engine.sampling_params import SamplingParams

    try:
        config = engine_config_from_args(args)
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, stop=args.stop, ignore_eos=args.ignore_eos)
    except ValueError as exc:
        print(f"graphpool generate: {exc}", file=sys.stderr)
        return 2
    device = config.torch_device
    graphs = "on" if config.graphs_enabled else (
        "OFF (CPU device: CUDA graphs need a GPU; decode runs eagerly)" if device.type != "cuda"
        else "OFF (--disable-cudagraph)")
    print(f"loading {config.model} on {device} ({str(config.torch_dtype).removeprefix('torch.')}); "
          f"CUDA graphs {graphs}", file=sys.stderr)
    try:
        llm = LLM(**{f: getattr(config, f) for f in config.__dataclass_fields__})
        if args.chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params,
                               use_tqdm=not args.no_progress)
        else:
            outputs = llm.generate(args.prompt, params, use_tqdm=not args.no_progress)
    except ValueError as exc:
        print(f"graphpool generate: {exc}", file=sys.stderr)
        return 2
    for i, (prompt, out) in enumerate(zip(args.prompt, outputs, strict=True), 1):
        print(f"=== [{i}] {prompt}")
        print(out.text)
        print(f"--- {len(out.token_ids)} tokens, finish: {out.finish_reason}")
    print(describe_graphs(llm.engine))
    return 0


# the command ----------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphpool", description="LLM inference with a bounded CUDA graph pool")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from graphpool.bench.cli import add_bench_parser
    from graphpool.server.main import add_serve_parser

    for register in (add_generate_parser, add_serve_parser, add_bench_parser):
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
