"""The server configurations `bench serve` compares, by name: each is a set of `graphpool serve` flags, or of
`vllm serve` flags on top of graphpool's settings (serve/foreign.py)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphpool.engine.config import EngineConfig

CONFIG_LABELS = {
    "no-graphs": "no graphs",
    "capture-all": "capture all at start-up",
    "lru16-capture-on-miss": "LightLLM: LRU 16, capture on miss, shared",
    "default": "graphpool default",
    "budget": "graphpool + byte budget",
    "no-warmup": "graphpool, no start-up warm-up",
    "eager-prefill": "graphpool, eager prefill steps, no mixed steps",
    "no-mixed-steps": "graphpool, no mixed steps",
    "eager-idle-prefill": "graphpool, a prompt while nothing decodes in one eager step",
    "sync-scheduling": "graphpool, synchronous scheduling",
    "head-after-replay": "graphpool, the LM head and the draw after every replay",
    "defer-captures": "graphpool, admitted captures deferred to idle",
    "microbatch-overlap": "graphpool + microbatch overlap",
    "full-pool": "graphpool, pool filled at start-up",
    "vllm": "vLLM defaults",
    "vllm-eager": "vLLM, no graphs (--enforce-eager)",
}
VLLM_CONFIGS = ("vllm", "vllm-eager")
CONFIG_NAMES = tuple(CONFIG_LABELS)
DEFAULT_CONFIGS = ("no-graphs", "capture-all", "lru16-capture-on-miss", "default", "budget")
CONFIG_HELP = (
    "no-graphs; capture-all: every ladder size at start-up; lru16-capture-on-miss: LightLLM's pool (LRU 16, capture "
    "on miss, shared mempool, no warm-up, eager prefill); default: graphpool's defaults; budget: with "
    "--graph-memory-budget; no-warmup: the defaults without the start-up warm-up (lazy capture); eager-prefill: eager "
    "prefill steps and no mixed steps; no-mixed-steps; eager-idle-prefill: + --idle-prefill-steps 0; "
    "sync-scheduling: + --no-async-scheduling; head-after-replay: + --graph-sample-max-batch-size 0; defer-captures: + --graph-defer-captures; microbatch-overlap: "
    "+ --enable-microbatch-overlap (with --server-arg=--tensor-parallel-size=2); vllm: vLLM 0.26 at its defaults "
    "with graphpool's model, max-model-len, max-num-seqs, seed and dtype; vllm-eager: the same, --enforce-eager; "
    "full-pool: the defaults with the whole pool (16 graphs) captured at start-up, its graph memory beside vLLM's; "
    "or NAME=FLAGS: the defaults plus those engine flags, e.g. p128=--mixed-prompt-tokens=128 (quote FLAGS with spaces)"
)
_CUSTOM_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")
# every prefill step eager, and decodes wait for it (LightLLM's prefill)
_EAGER_PREFILL = ("--graph-prefill-max-tokens", "0", "--no-enable-mixed-steps")


@dataclass(frozen=True)
class ServeConfig:
    key: str
    label: str
    flags: tuple[str, ...]  # server flags of this configuration
    server: str = "graphpool"  # "graphpool", or "vllm": a foreign server (no graphpool_* series)

    @property
    def foreign(self) -> bool:
        return self.server != "graphpool"


def custom_config(spec: str) -> ServeConfig:
    """``NAME=FLAGS``: graphpool's defaults plus the engine flags FLAGS (shell words), under a name of its own,
    so one run compares any setting side by side, e.g. ``p128=--mixed-prompt-tokens 128``."""
    name, sep, text = spec.partition("=")
    if not sep or not _CUSTOM_NAME.fullmatch(name) or name in CONFIG_LABELS:
        raise ValueError(f"serve bench: --configs are names of {', '.join(CONFIG_LABELS)}, or NAME=FLAGS with a "
                         f"new lower-case NAME, got {spec!r}")
    flags = tuple(shlex.split(text))
    try:
        _, unknown = _engine_parser(exit_on_error=False).parse_known_args(list(flags))
    except argparse.ArgumentError as e:
        raise ValueError(f"serve bench: configuration {name!r}: {e}") from None
    if not flags or unknown:
        raise ValueError(f"serve bench: configuration {name!r} needs engine flags (graphpool serve --help), got "
                         f"{' '.join(unknown) or 'none'}")
    return ServeConfig(name, "graphpool " + " ".join(flags), flags)


def _engine_parser(exit_on_error: bool = True) -> argparse.ArgumentParser:
    """A parser of the engine's flags alone (`graphpool serve` has more)."""
    from graphpool.engine.args import add_engine_args

    parser = argparse.ArgumentParser(add_help=False, exit_on_error=exit_on_error)
    add_engine_args(parser)
    return parser


def _engine_config(server_args: Sequence[str]) -> EngineConfig:
    from graphpool.engine.args import engine_config_from_args

    known, _ = _engine_parser().parse_known_args(list(server_args))
    return engine_config_from_args(known, device="cpu")


def ladder_size(server_args: Sequence[str]) -> int:
    """Sizes in the pool's ladder under the server's graph flags (the pass-through ones included)."""
    return len(_engine_config(server_args).pool_config.ladder().sizes)


def full_pool_sizes(server_args: Sequence[str]) -> tuple[int, ...]:
    """The sizes that fill the pool (max_graph_pool_size of them) in the order `bench memory` fills it: the
    start-up cover, then a tighter cover, then the largest remaining sizes."""
    from graphpool.bench.memory import capture_order

    cfg = _engine_config(server_args)
    pool = cfg.pool_config
    return tuple(s for group in capture_order(pool, pool.max_graph_pool_size) for s in group)[: pool.max_graph_pool_size]


def serve_configs(ladder_n: int, budget: str, full_pool: Sequence[int] = ()) -> dict[str, ServeConfig]:
    flags = {
        "no-graphs": ("--disable-cudagraph",),
        "capture-all": ("--graph-warmup", "all", "--max-graph-pool-size", str(ladder_n), "--graph-warmup-before-ready"),
        "lru16-capture-on-miss": ("--max-graph-pool-size", "16", "--graph-miss-policy", "capture", "--graph-mempool",
                                  "shared", "--graph-warmup", "none", *_EAGER_PREFILL),
        "default": (),
        "budget": ("--graph-memory-budget", budget),
        "no-warmup": ("--graph-warmup", "none"),
        "eager-prefill": _EAGER_PREFILL,
        "no-mixed-steps": ("--no-enable-mixed-steps",),
        "eager-idle-prefill": ("--idle-prefill-steps", "0"),
        "sync-scheduling": ("--no-async-scheduling",),
        "head-after-replay": ("--graph-sample-max-batch-size", "0"),
        "defer-captures": ("--graph-defer-captures",),
        # NOTE: for tensor parallel (--server-arg=--tensor-parallel-size=2)
        "microbatch-overlap": ("--enable-microbatch-overlap",),
        "full-pool": ("--graph-warmup", ",".join(map(str, full_pool)) if full_pool else "cover",
                      "--graph-warmup-before-ready"),
        "vllm": (),
        "vllm-eager": ("--enforce-eager",),
    }
    labels = CONFIG_LABELS | {"capture-all": f"capture all {ladder_n} at start-up",
                              "budget": f"graphpool + budget {budget}"}
    return {k: ServeConfig(k, labels[k], v, "vllm" if k in VLLM_CONFIGS else "graphpool") for k, v in flags.items()}


def pick_config(spec: str, configs: dict[str, ServeConfig]) -> ServeConfig:
    """``spec``'s configuration: a name of ``configs``, or NAME=FLAGS (`custom_config`)."""
    return configs[spec] if spec in configs else custom_config(spec)


def config_order(key: str) -> tuple[int, str]:
    """Sort key: the configurations in the order above, any other name (a run saved by another version) after."""
    return (CONFIG_NAMES.index(key), "") if key in CONFIG_LABELS else (len(CONFIG_NAMES), key)
