"""The `graphpool` command: one subcommand per function (`generate` here; `serve` and `bench` add theirs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from graphpool.bench.cli import add_bench_parser
from graphpool.engine.args import add_engine_args, engine_config_from_args
from graphpool.server.chat_options import template_kwargs_arg
from graphpool.server.main import add_serve_parser

if TYPE_CHECKING:
    from graphpool.engine.engine import LLMEngine


def describe_graphs(engine: LLMEngine) -> str:
    """One line on the graph pool: why it is off, or what it did."""
    from graphpool.pool import FallbackReason

    if engine.graphs_off is FallbackReason.NO_CUDA:
        return "graph pool: off - CUDA graphs need a CUDA GPU and this run is on the CPU, so decode ran eagerly"
    stats = engine.graph_stats()
    if stats is None:
        return "graph pool: off (--disable-cudagraph), decode ran eagerly"
    config = engine.config
    return f"graph pool: {stats.describe(config.max_graph_pool_size, config.graph_memory_budget)}"


# generate -------------------------------------------------------------------------------------------------
def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts (runs on a CPU-only machine)",
                       description="Generate completions with the engine; prints each completion and a "
                                   "one-line summary of the graph pool.")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    p.add_argument("--max-tokens", type=int, default=64, help="most new tokens per prompt (64)")
    # NOTE: None when not given: the model's generation_config.json may set them (--generation-config auto)
    p.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy (the default, unless the model's generation_config.json sets one)")
    p.add_argument("--top-p", type=float, default=None, help="1 = off (the default, or the model's)")
    p.add_argument("--top-k", type=int, default=None, help="0 = off (the default, or the model's)")
    p.add_argument("--min-p", type=float, default=None, help="0 = off (the default, or the model's)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="1 = off (the default, or the model's)")
    p.add_argument("--presence-penalty", type=float, default=None, help="0 = off (the default)")
    p.add_argument("--frequency-penalty", type=float, default=None, help="0 = off (the default)")
    p.add_argument("--stop", action="append", help="a stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-text token")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    p.add_argument("--chat-template-kwargs", type=template_kwargs_arg, default=None, metavar="JSON",
                   help='with --chat: more variables of the chat template, as a JSON object (e.g. '
                   '\'{"enable_thinking": false}\'); each one the template must read')
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p)
    p.set_defaults(func=run_generate)


_SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty")


def run_generate(args: argparse.Namespace) -> int:
    from graphpool.engine.llm import LLM
    from graphpool.engine.sampling_params import SamplingParams
    from graphpool.pool import FallbackReason

    if args.chat_template_kwargs is not None and not args.chat:
        print("graphpool generate: --chat-template-kwargs needs --chat", file=sys.stderr)
        return 2
    try:
        config = engine_config_from_args(args)
        given = {k: v for k in _SAMPLING_FLAGS if (v := getattr(args, k)) is not None}
        # checked before the model loads; its sampling defaults fill the fields not given once it is loaded
        params = SamplingParams(**{"temperature": 0.0, **given}, max_tokens=args.max_tokens, stop=args.stop,
                                ignore_eos=args.ignore_eos)
    except ValueError as exc:
        print(f"graphpool generate: {exc}", file=sys.stderr)
        return 2
    device = config.torch_device
    graphs = "on" if config.graphs_off is None else (
        "OFF (CPU device: CUDA graphs need a GPU; decode runs eagerly)" if config.graphs_off is FallbackReason.NO_CUDA
        else "OFF (--disable-cudagraph)")
    kernels = f"; kernels off: {', '.join(config.disabled_kernels)}" if config.disabled_kernels else ""
    print(f"loading {config.model} on {device} ({str(config.torch_dtype).removeprefix('torch.')}); "
          f"CUDA graphs {graphs}{kernels}", file=sys.stderr)
    try:
        llm = LLM.from_config(config)
        threads = f"; torch threads {llm.engine.cpu_threads}" if llm.engine.cpu_threads is not None else ""
        print(f"loaded: {llm.engine.startup.describe()}{threads}", file=sys.stderr)
        defaults = llm.engine.sampling_defaults
        if defaults.describe() is not None:
            print(defaults.describe(), file=sys.stderr)
        params = defaults.apply(params, explicit=given)
        if args.chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params,
                               use_tqdm=not args.no_progress, chat_template_kwargs=args.chat_template_kwargs)
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
    for register in (add_generate_parser, add_serve_parser, add_bench_parser):
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
