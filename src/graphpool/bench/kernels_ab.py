"""`graphpool bench kernels`: the engine's decode step with two settings of the kernel switches, side by side in
one process: A with default-on kernels turned off (`--off`, the names of ``--disable-kernels``;
`kernels/switches.py`), B the defaults. The two are two models over the same weights, their operations built
with the two settings.

Each batch size captures one graph of the engine's decode step (`full_step_fn`: hidden rows, logits and their argmax) of
each model, then times the two replays in alternating rounds (A first in even rounds, B first in odd ones),
so drift and order effects fall on both; the medians, B/A and each against the HBM floor measured in the same
run are reported, with how far B's logits and argmaxes are from A's. The engine's whole decode step (async
scheduling) is timed the same way at `engine_sizes`, an engine over each model. Without CUDA the steps run
eagerly (the switches then change nothing: the plumbing is what runs).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from graphpool.bench import common
from graphpool.bench.common import md_table, median, progress, ratio
from graphpool.bench.decode import DecodeSetup, build_random_model, model_label
from graphpool.bench.engine_step import engine_step_ms
from graphpool.bench.step_config import StepBenchConfig
from graphpool.kernels.switches import KERNEL_SWITCHES
from graphpool.model.config import ModelConfig
from graphpool.model.llama import LlamaModel


@dataclass(frozen=True)
class KernelsABConfig:
    models: tuple[str | ModelConfig, ...] = ("llama3.2-1b",)
    batch_sizes: tuple[int, ...] = (1, 8, 64, 128)
    engine_sizes: tuple[int, ...] = (1, 8)  # of batch_sizes: the engine's async step timed there too
    off: tuple[str, ...] = KERNEL_SWITCHES  # A: these default-on kernels off (B: the defaults)
    context_len: int = 1024
    block_size: int = 16
    rounds: int = 6
    reps: int = 10  # timed replays per round and setting
    warmup: int = 3
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if not self.models or not self.batch_sizes:
            raise ValueError("kernels bench: give at least one model and one batch size")
        if not self.off:
            raise ValueError("kernels bench: A and B are the same settings: give --off names")
        unknown = [n for n in self.off if n not in KERNEL_SWITCHES]
        if unknown:
            raise ValueError(f"kernels bench: --off {', '.join(unknown)}: not one of {', '.join(KERNEL_SWITCHES)}")
        if any(b < 1 for b in self.batch_sizes) or any(b not in self.batch_sizes for b in self.engine_sizes):
            raise ValueError("kernels bench: batch sizes must be >= 1 and engine sizes among them")
        if self.rounds < 1 or self.reps < 1 or self.warmup < 0 or self.context_len < 1:
            raise ValueError("kernels bench: rounds, reps and context_len must be >= 1, warmup >= 0")


@dataclass
class ABRow:
    model: str
    batch_size: int
    floor_ms: float
    ms: dict[str, float] = field(default_factory=dict)  # setting -> median ms of the step (graph replay on CUDA)
    engine_ms: dict[str, float] = field(default_factory=dict)  # setting -> median ms of the engine's async step
    logits_rel_err: float = math.nan  # ||B - A|| / ||A|| of the step's logits, same inputs
    argmax_agree: float = math.nan  # share of rows whose argmax B and A agree on

    @property
    def b_over_a(self) -> float:
        return ratio(self.ms.get("B", math.nan), self.ms.get("A", math.nan))


def _order(round_: int) -> tuple[str, str]:
    return ("A", "B") if round_ % 2 == 0 else ("B", "A")


def with_kernels_off(model: LlamaModel, off: tuple[str, ...]) -> LlamaModel:
    """A model over `model`'s weights (shared, not copied) whose operations have the kernel switches `off` off."""
    twin = type(model)(model.config, device=model.device, dtype=model.dtype, attn_backend=model.attn_backend,
                        max_positions=model.max_positions, disabled_kernels=off)  # fmt: skip
    twin.load_state_dict(model.state_dict(), assign=True)
    return twin.eval()


@torch.inference_mode()
def bench_model(model: str | ModelConfig, cfg: KernelsABConfig, device: torch.device, dtype: torch.dtype,
                bandwidth: float) -> list[ABRow]:
    m = build_random_model(model, device, dtype, "auto", max_positions=cfg.context_len + 16)
    models = {"A": with_kernels_off(m, cfg.off), "B": m}
    setup = DecodeSetup.create(m, max(cfg.batch_sizes), cfg.context_len, cfg.block_size)
    # NOTE: one KV cache and one set of inputs: the two steps differ only in the models' operations
    steps = {side: replace(setup, model=mm).full_step_fn() for side, mm in models.items()}
    cuda = device.type == "cuda"
    rows = []
    for bs in cfg.batch_sizes:
        static = setup.batch(bs)
        row = ABRow(model_label(model), bs, (setup.weight_bytes_read(bs) + setup.kv_bytes_read(bs)) / bandwidth * 1e3)
        runs, outs = {}, {}
        for side, step in steps.items():
            if cuda:
                graph, outs[side], _ = common.capture_graph(lambda static=static, step=step: step(static))
                runs[side] = graph.replay
            else:
                outs[side] = step(static)
                runs[side] = lambda static=static, step=step: step(static)
        times: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(cfg.rounds):
            for side in _order(r):
                times[side] += common.time_ms(runs[side], device, cfg.warmup, cfg.reps)
        row.ms = {side: median(ts) for side, ts in times.items()}
        (la, ga), (lb, gb) = outs["A"], outs["B"]
        row.logits_rel_err = common.rel_err(lb, la)
        row.argmax_agree = float((ga == gb).float().mean())
        progress(f"  {row.model} bs={bs}: A {row.ms['A']:.3f} ms, B {row.ms['B']:.3f} ms (B/A {row.b_over_a:.3f}), "
                 f"floor {row.floor_ms:.3f} ms")
        rows.append(row)
        del runs, outs
    step_cfg = StepBenchConfig(models=(model,), batch_sizes=cfg.batch_sizes, context_len=cfg.context_len,
                               block_size=cfg.block_size, warmup=cfg.warmup, reps=cfg.reps)  # fmt: skip
    for row in (r for r in rows if r.batch_size in cfg.engine_sizes):
        times = {"A": [], "B": []}
        for r in range(2):
            for side in _order(r):
                times[side].append(engine_step_ms(models[side], m.config, row.batch_size, step_cfg,
                                                  async_scheduling=True))
        row.engine_ms = {side: min(ts) for side, ts in times.items()}
        progress(f"  {row.model} bs={row.batch_size}: engine async A {row.engine_ms['A']:.3f} ms, "
                 f"B {row.engine_ms['B']:.3f} ms")
    return rows


def markdown(rows: Sequence[ABRow], cfg: KernelsABConfig, bandwidth: float, cuda: bool) -> str:
    what = "graph replay" if cuda else "eager step (no CUDA: the switches change nothing here)"
    out = [f"A: `--disable-kernels {','.join(cfg.off)}`; B: the defaults"
           f". The engine's decode step ({what}), medians of {cfg.rounds} alternating rounds x {cfg.reps}; "
           f"HBM bandwidth {bandwidth / 1e12:.2f} TB/s; context {cfg.context_len} tokens per sequence.\n"]
    for label in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == label]
        out.append(f"\n## {label}\n\n")
        out.append(md_table(
            ["bs", "A ms", "B ms", "B/A", "floor ms", "A x floor", "B x floor", "argmax agree", "logits rel err"],
            [[r.batch_size, r.ms["A"], r.ms["B"], r.b_over_a, r.floor_ms, ratio(r.ms["A"], r.floor_ms),
              ratio(r.ms["B"], r.floor_ms), r.argmax_agree, r.logits_rel_err] for r in mine],
        ))
        eng = [r for r in mine if r.engine_ms]
        if eng:
            out.append("\nThe engine's whole decode step with async scheduling (median wall ms; the better of two "
                       "runs per setting, in alternating order):\n\n")
            out.append(md_table(["bs", "A engine ms", "B engine ms", "B/A"],
                                [[r.batch_size, r.engine_ms["A"], r.engine_ms["B"],
                                  ratio(r.engine_ms["B"], r.engine_ms["A"])] for r in eng]))
    return "".join(out)


def plot(rows: Sequence[ABRow], path: Path) -> Path:
    """Bars of A and B per batch size, one panel per model, the HBM floor as a line."""
    from graphpool.bench.plots import _pyplot, _save

    plt = _pyplot()
    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [r for r in rows if r.model == model]
        xs = range(len(mine))
        ax.bar([x - 0.2 for x in xs], [r.ms["A"] for r in mine], width=0.4, label="A (kernels off)")
        ax.bar([x + 0.2 for x in xs], [r.ms["B"] for r in mine], width=0.4, label="B (defaults)")
        ax.plot(list(xs), [r.floor_ms for r in mine], "k:", marker="_", label="HBM floor")
        ax.set_xticks(list(xs), [str(r.batch_size) for r in mine])
        ax.set_xlabel("batch size")
        ax.set_ylabel("ms per decode step")
        ax.set_title(model)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def run_kernels_bench(cfg: KernelsABConfig, out_dir: Path, argv: Sequence[str] | None = None) -> dict[str, object]:
    device, dtype = common.device_and_dtype(cfg.device, cfg.dtype)
    env = common.collect_env(argv, device)
    print(env.header_markdown(), flush=True)
    bandwidth = common.measure_hbm_bandwidth(device, nbytes=(2 << 30) if device.type == "cuda" else (64 << 20))
    progress(f"kernels bench on {env.gpu}, torch {env.torch_version}: A kernels off {','.join(cfg.off)}, B the defaults")
    rows: list[ABRow] = []
    for model in cfg.models:
        rows += bench_model(model, cfg, device, dtype, bandwidth)
        common.free_device_memory(device)
    png = plot(rows, out_dir / "kernels.png")
    body = markdown(rows, cfg, bandwidth, device.type == "cuda") + f"\n![A vs B per batch size]({png.name})\n"
    results: dict[str, object] = {"config": cfg, "bandwidth_bytes_per_s": bandwidth, "rows": rows}
    common.write_report(out_dir, "kernels", env, results, body, "Decode step: kernel switches A vs B")
    print(body)
    return results


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=list(KernelsABConfig.models), help="random-weight presets")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(KernelsABConfig.batch_sizes))
    p.add_argument("--engine-sizes", type=int, nargs="*", default=list(KernelsABConfig.engine_sizes))
    p.add_argument("--off", default=",".join(KERNEL_SWITCHES),
                   help=f"A: default-on kernels off ({', '.join(KERNEL_SWITCHES)}); B: the defaults")
    p.add_argument("--context-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", type=Path, default=Path("results/kernels"))


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    cfg = KernelsABConfig(
        models=tuple(args.models), batch_sizes=tuple(args.batch_sizes), engine_sizes=tuple(args.engine_sizes),
        off=tuple(n for n in args.off.split(",") if n),
        context_len=args.context_len, rounds=args.rounds, reps=args.reps, warmup=args.warmup, device=args.device,
        dtype=args.dtype,
    )  # fmt: skip
    run_kernels_bench(cfg, args.out, argv)
