"""The `bench` subcommand: `graphpool bench step|memory|trace` (also `python -m graphpool.bench ...`)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

_HELP = ("Benchmarks; each prints its tables and writes JSON, Markdown and PNG under results/<bench>/ "
         "(--out to change).")


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """Registers `bench` on the `graphpool` command's subparsers."""
    _add_benches(sub.add_parser("bench", help="benchmarks: decode step, graph memory, serving trace, live server",
                                description=_HELP))


# name, module (its add_args and main), help; a module is imported only when its bench is parsed or described
_BENCHES = (
    ("step", "graphpool.bench.step", "decode step per batch size: eager, graph, torch.compile, HBM floor"),
    ("memory", "graphpool.bench.memory",
     "graph memory: where a graph's bytes go, arena vs per_graph mempool, eviction, byte budget"),
    ("trace", "graphpool.bench.trace.run", "a serving trace through the engine under seven graph policies"),
    ("serve", "graphpool.bench.serve.run", "a live server per graph configuration, driven by a streaming openai client"),
    ("profile", "graphpool.bench.profile.run",
     "torch.profiler: the kernels of a decode step per layer; a prefill step's time"),
    ("tp-step", "graphpool.bench.tp_step",
     "the engine's decode step by tensor-parallel size and batch size, graph and eager"),
    ("kernels", "graphpool.bench.kernels_ab",
     "the decode step with kernel switches A (default kernels off) vs B, interleaved"),
)


class _BenchParser(argparse.ArgumentParser):
    """A bench's parser that imports its module (torch and all) for the flags only when that bench is chosen,
    so `graphpool --help` and `graphpool bench --help` stay import-light."""

    def __init__(self, *args: Any, module: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._module = module

    def _load(self) -> None:
        if self._module:
            module = importlib.import_module(self._module)
            self._module = ""
            module.add_args(self)
            self.set_defaults(func=_runner(module.main))

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        self._load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._load()
        return super().format_help()

    def format_usage(self) -> str:
        self._load()
        return super().format_usage()


def _add_benches(p: argparse.ArgumentParser) -> None:
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH", parser_class=_BenchParser)
    for name, module, text in _BENCHES:
        bench_sub.add_parser(name, help=text, description=text, module=module)


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
