"""The `bench` subcommand: `graphpool bench step|memory|trace` (also `python -m graphpool.bench ...`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

_HELP = ("Benchmarks; each prints its tables and writes JSON, Markdown and PNG under results/<bench>/ "
         "(--out to change).")


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """Registers `bench` on the `graphpool` command's subparsers."""
    _add_benches(sub.add_parser("bench", help="benchmarks: decode step, graph memory, serving trace, live server",
                                description=_HELP))


def _add_benches(p: argparse.ArgumentParser) -> None:
    from graphpool.bench import kernels_ab, memory, step, tp_step
    from graphpool.bench.profile import run as profile
    from graphpool.bench.serve import run as serve
    from graphpool.bench.trace import run as trace

    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, module, text in (
        ("step", step, "decode step per batch size: eager, graph, torch.compile, HBM floor"),
        ("memory", memory, "graph memory: where a graph's bytes go, arena vs per_graph mempool, eviction, byte budget"),
        ("trace", trace, "a serving trace through the engine under seven graph policies"),
        ("serve", serve, "a live server per graph configuration, driven by a streaming openai client"),
        ("profile", profile, "torch.profiler: the kernels of a decode step per layer; a prefill step's time"),
        ("tp-step", tp_step, "the engine's decode step by tensor-parallel size and batch size, graph and eager"),
        ("kernels", kernels_ab, "the decode step with kernel switches A (default kernels off) vs B, interleaved"),
    ):
        q = bench_sub.add_parser(name, help=text, description=text)
        module.add_args(q)
        q.set_defaults(func=_runner(module.main))


def _runner(fn: Callable[[argparse.Namespace, Sequence[str]], object]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        try:
            fn(args, sys.argv)
        except ValueError as exc:
            print(f"graphpool bench {args.bench}: {exc}", file=sys.stderr)
            return 2
        return 0

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphpool.bench", description=_HELP)
    _add_benches(parser)
    args = parser.parse_args(argv)
    return int(args.func(args))
