"""`graphpool bench tp-step`: the engine's decode step at tensor_parallel_size 1 and N, graph and eager, by
batch size (random weights, one engine per (N, mode)).

Each batch size runs `bs` requests of `prompt_len` random tokens for `decode_steps` greedy tokens; every
decode step of exactly `bs` rows is timed by the engine (`profile_steps`: CUDA events around rank 0's
forward, which includes waiting for the other ranks in the all-reduces; and the whole step's wall time,
sampling and the step message to the other ranks included). The first `skip` decode steps are not counted.
Graph memory per rank is what each rank's pool accounts (in lockstep: the largest footprint over the ranks).
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graphpool.bench.common import (
    collect_env,
    free_device_memory,
    md_table,
    median,
    progress,
    ratio,
    write_report,
)

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MODES = ("graph", "eager", "overlap")  # overlap: graphs of two microbatches (enable_microbatch_overlap)


@dataclass(frozen=True)
class TPStepConfig:
    model: str = "random:llama3-8b"
    tp_sizes: tuple[int, ...] = (1, 2)
    batch_sizes: tuple[int, ...] = DEFAULT_SIZES
    modes: tuple[str, ...] = MODES
    prompt_len: int = 128
    decode_steps: int = 40
    skip: int = 5
    device: str = "cuda"
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if not self.tp_sizes or any(n < 1 for n in self.tp_sizes):
            raise ValueError(f"tp-step: tensor-parallel sizes must be >= 1, got {self.tp_sizes}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"tp-step: batch sizes must be >= 1, got {self.batch_sizes}")
        if not set(self.modes) <= set(MODES) or not self.modes:
            raise ValueError(f"tp-step: modes must be among {MODES}, got {self.modes}")
        if self.prompt_len < 1 or self.skip < 0 or self.decode_steps <= self.skip:
            raise ValueError("tp-step: prompt_len >= 1 and decode_steps > skip >= 0")


@dataclass
class TPStepRow:
    tp: int
    mode: str
    batch_size: int
    forward_ms: float  # median device time of rank 0's forward
    step_ms: float  # median wall time of the whole engine step
    timed_steps: int
    graph_steps: int  # of the timed steps, those that replayed a graph
    graph_bytes_by_rank: list[int] = field(default_factory=list)  # after the run


def _engine(cfg: TPStepConfig, tp: int, mode: str):  # -> LLMEngine
    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine

    sizes = tuple(sorted(set(cfg.batch_sizes)))
    overlap = mode == "overlap"
    warm = tuple(sorted({-(-b // 2) for b in sizes})) if overlap else sizes  # graph sizes are per microbatch
    config = EngineConfig(
        model=cfg.model, device=cfg.device, dtype=cfg.dtype, tensor_parallel_size=tp,
        max_model_len=cfg.prompt_len + cfg.decode_steps + 16, max_num_seqs=max(sizes),
        # NOTE: no mixed steps: the bs requests must decode in the same steps for a step of exactly bs rows
        enable_prefix_caching=False, enable_mixed_steps=False, profile_steps=True, disable_cudagraph=mode == "eager",
        graph_max_batch_size=max(256, max(sizes)), graph_miss_policy="capture",
        graph_warmup="none" if mode == "eager" else warm, max_graph_pool_size=len(sizes) + 1,
        enable_microbatch_overlap=overlap,
    )
    return LLMEngine(config)


def _measure(engine, bs: int, cfg: TPStepConfig, rng: random.Random) -> tuple[list[float], list[float], int]:
    from graphpool.engine.sampling_params import SamplingParams

    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=cfg.decode_steps + 1, temperature=0, ignore_eos=True)
    for i in range(bs):
        engine.add_request(f"bs{bs}-{i}", [rng.randrange(100, vocab) for _ in range(cfg.prompt_len)], params)
    forward, wall, graphs, seen = [], [], 0, 0
    while engine.has_unfinished_requests():
        engine.step()
        info = engine.last_step
        if info is None or info.kind != "decode" or info.batch_size != bs:
            continue
        seen += 1
        if seen > cfg.skip:
            forward.append(info.forward_seconds * 1e3)
            wall.append(info.seconds * 1e3)
            graphs += info.graph
    return forward, wall, graphs


def run_tp_step_bench(cfg: TPStepConfig, out_dir: Path, argv: Sequence[str] | None = None) -> list[TPStepRow]:
    import torch

    rows: list[TPStepRow] = []
    for tp in cfg.tp_sizes:
        for mode in cfg.modes:
            progress(f"{cfg.model} tp={tp} {mode}: loading and warming up")
            engine = _engine(cfg, tp, mode)
            try:
                rng = random.Random(0)
                for bs in cfg.batch_sizes:
                    forward, wall, graphs = _measure(engine, bs, cfg, rng)
                    rows.append(TPStepRow(tp, mode, bs, median(forward), median(wall), len(forward), graphs))
                    progress(f"  bs={bs}: forward {rows[-1].forward_ms:.3f} ms, step {rows[-1].step_ms:.3f} ms "
                             f"({graphs}/{len(forward)} replayed)")
                bytes_by_rank = [s.resident_bytes if s else 0 for s in engine.graph_stats_by_rank()]
                for row in rows:
                    if row.tp == tp and row.mode == mode:
                        row.graph_bytes_by_rank = bytes_by_rank
            finally:
                engine.close()
                del engine
                free_device_memory(torch.device(cfg.device))
    env = collect_env(argv, torch.device(cfg.device))
    write_report(out_dir, "tp_step", env, {"config": cfg, "rows": rows}, _markdown(cfg, rows),
                 f"Decode step by tensor-parallel size ({cfg.model})")
    print(_markdown(cfg, rows))
    return rows


def _markdown(cfg: TPStepConfig, rows: list[TPStepRow]) -> str:
    by = {(r.tp, r.mode, r.batch_size): r for r in rows}
    headers = ["bs", *(f"tp{n} {m} ms" for n in cfg.tp_sizes for m in cfg.modes)]
    headers += [f"tp{n}/tp1 {m}" for n in cfg.tp_sizes if n != 1 and 1 in cfg.tp_sizes for m in cfg.modes]
    table = []
    for bs in cfg.batch_sizes:
        cells: list[object] = [bs]
        cells += [by[(n, m, bs)].forward_ms for n in cfg.tp_sizes for m in cfg.modes]
        cells += [ratio(by[(n, m, bs)].forward_ms, by[(1, m, bs)].forward_ms)
                  for n in cfg.tp_sizes if n != 1 and 1 in cfg.tp_sizes for m in cfg.modes]
        table.append(cells)
    graph_mib = [[f"tp{r.tp} {r.mode}", *(f"{b / 2**20:.0f}" for b in r.graph_bytes_by_rank)]
                 for r in rows if r.batch_size == cfg.batch_sizes[0]]
    width = max((len(g) for g in graph_mib), default=1)
    graph_mib = [g + ["-"] * (width - len(g)) for g in graph_mib]
    steps = min((r.timed_steps for r in rows), default=0)
    return (f"Median device time of rank 0's decode forward (ms), {cfg.dtype}, prompts of {cfg.prompt_len} "
            f"tokens, >= {steps} timed steps per cell (the first {cfg.skip} of each size skipped).\n\n"
            + md_table(headers, table)
            + "\nGraph memory per rank after the run (MiB; the pool accounts the largest footprint over ranks):\n\n"
            + md_table(["engine", *(f"rank {i}" for i in range(width - 1))], graph_mib)
            + "\nWall time of the whole step (ms), and its ratio to the forward (the engine's host work around "
            "the forward: scheduling, inputs, sampling, outputs; the target is <= 1.05 at tp1 graph bs 1):\n\n"
            + md_table(["bs", *(f"tp{n} {m}" for n in cfg.tp_sizes for m in cfg.modes),
                        *(f"tp{n} {m} step/forward" for n in cfg.tp_sizes for m in cfg.modes)],
                       [[bs, *(by[(n, m, bs)].step_ms for n in cfg.tp_sizes for m in cfg.modes),
                         *(ratio(by[(n, m, bs)].step_ms, by[(n, m, bs)].forward_ms)
                           for n in cfg.tp_sizes for m in cfg.modes)]
                        for bs in cfg.batch_sizes]))


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=TPStepConfig.model, help="any engine model (default random:llama3-8b)")
    p.add_argument("--tp-sizes", type=int, nargs="+", default=list(TPStepConfig.tp_sizes))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--prompt-len", type=int, default=TPStepConfig.prompt_len)
    p.add_argument("--decode-steps", type=int, default=TPStepConfig.decode_steps)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", type=Path, default=Path("results/tp_step"))


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    cfg = TPStepConfig(model=args.model, tp_sizes=tuple(args.tp_sizes), batch_sizes=tuple(args.batch_sizes),
                       modes=tuple(args.modes), prompt_len=args.prompt_len, decode_steps=args.decode_steps,
                       device=args.device, dtype=args.dtype)
    rows = run_tp_step_bench(cfg, args.out, argv)
    if any(math.isnan(r.forward_ms) for r in rows):
        progress("note: some cells have no timed steps (decode_steps too small?)")
