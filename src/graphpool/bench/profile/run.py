"""`graphpool bench profile`: the kernels of one engine-level decode step per batch size, per layer, with
their time shares, and where the time of one short prefill step goes, from
torch.profiler. On the CPU it profiles CPU activity only (its ops, by self time, stand in for kernels)."""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from graphpool.bench import common
from graphpool.bench.common import md_table, progress
from graphpool.bench.decode import DecodeSetup, build_random_model, model_label
from graphpool.bench.profile import events as pe
from graphpool.bench.profile.prefill import PrefillProfile, prefill_markdown, run_prefill
from graphpool.engine.engine import LoadedModel
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.sequence import Sequence as Seq
from graphpool.model.config import ModelConfig

# what each gp.* range of the decode step holds (gp.step alone: compute_logits, the model's LM head)
# NOTE: the final norm is the model's own add_rms_norm call after the layers (no module call): it is what
# gp.model holds outside the layers; the layers' own residual adds are in the next layer's norm.
PARTS = {"gp.embedding": "embedding", "gp.model": "final add + RMSNorm (model, outside layers)",
         "gp.step": "LM head + greedy argmax (compute_logits, argmax_rows)", "gp.sampling": "sampling (engine's sampler + .tolist())",
         "gp.replay": "graph replay"}


@dataclass(frozen=True)
class ProfileConfig:
    model: str | ModelConfig = "random:llama3.2-1b"
    batch_sizes: tuple[int, ...] = (1, 64)  # () skips the decode part
    context_len: int = 512
    prefill_tokens: int = 40  # 0 skips the prefill part
    steps: int = 1  # profiled decode steps per batch size
    warmup: int = 3
    reps: int = 5  # timed prefill steps without the profiler
    block_size: int = 16
    device: str = "auto"
    dtype: str = "auto"
    attn_backend: str = "auto"
    top: int = 15  # rows of the prefill tables

    def __post_init__(self) -> None:
        if any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"profile bench: batch sizes must be >= 1, got {self.batch_sizes}")
        if not self.batch_sizes and self.prefill_tokens == 0:
            raise ValueError("profile bench: nothing to profile (no batch sizes and --prefill-tokens 0)")
        if min(self.context_len, self.steps, self.reps, self.block_size, self.top) < 1 or self.warmup < 0:
            raise ValueError("profile bench: context_len, steps, reps, block_size, top must be >= 1, warmup >= 0")
        if self.prefill_tokens < 0:
            raise ValueError(f"profile bench: prefill_tokens must be >= 0, got {self.prefill_tokens}")


@dataclass
class DecodeProfile:
    batch_size: int
    num_layers: int
    kernels_per_step: float
    per_layer: float  # inside the gp.layer.* ranges, / num_layers
    per_layer_min: float  # the layers' own counts (equal when every layer runs the same kernels)
    per_layer_max: float
    outside_layers: dict[str, float]  # part -> count per step
    device_us_per_step: float
    layers_share_pct: float
    kinds: dict[str, float]  # kernel / memcpy / memset / cpu op -> per step
    layer_counts: dict[int, float] = field(default_factory=dict)  # layer index -> count per step
    graph_kernels: float | None = None  # device events of one graph replay (CUDA), None where not run
    graph_note: str = ""
    rows: list[pe.KernelRow] = field(default_factory=list)
    unlinked: dict[str, float] = field(default_factory=dict)  # grouped name -> per step, linked to no host call


@contextlib.contextmanager
def regions(model: torch.nn.Module) -> Iterator[None]:
    """gp.* profiler ranges around the model, its embedding and each decoder layer, through forward hooks
    (the model's code stays as it is)."""
    stack: list[record_function] = []

    def enter(name: str) -> Callable[..., None]:
        def pre(*_: object) -> None:
            stack.append(record_function(name))
            stack[-1].__enter__()
        return pre

    def leave(*_: object) -> None:
        stack.pop().__exit__(None, None, None)

    mods = [(model, "gp.model"), (model.embed_tokens, "gp.embedding")]
    mods += [(layer, f"{pe.LAYER_PREFIX}{i}") for i, layer in enumerate(model.layers)]
    handles = [h for m, name in mods for h in (m.register_forward_pre_hook(enter(name)),
                                                m.register_forward_hook(leave))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _activities(cuda: bool) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])


def profile_decode(setup: DecodeSetup, bs: int, cfg: ProfileConfig) -> DecodeProfile:
    """Profiles the engine's decode step (`full_step_fn` on the runner's static inputs: logits and their argmax)
    + the engine's greedy sampler, eagerly; on CUDA also one replay of a graph captured from the same step."""
    model, device = setup.model, setup.model.device
    cuda = device.type == "cuda"
    static = setup.batch(bs)
    step = setup.full_step_fn()
    sampler = Sampler(device, seed=0, argmax=model.ops.step_argmax, draw=model.ops.step_sample)
    seqs = [Seq(f"r{i}", [0], SamplingParams(temperature=0.0), frozenset(), None) for i in range(bs)]

    def engine_step() -> None:
        with record_function("gp.step"):
            logits, _ = step(static)
        with record_function("gp.sampling"):
            sampler.sample(logits, seqs).tolist()

    for _ in range(cfg.warmup + 1):  # the first call may JIT-compile Triton kernels
        engine_step()
    common.sync(device)
    with regions(model), profile(activities=_activities(cuda)) as prof:
        for _ in range(cfg.steps):
            engine_step()
        common.sync(device)
    evs = pe.device_events(prof.events(), cuda)
    n, steps = model.config.num_layers, cfg.steps
    layers = pe.layer_counts(evs, steps)
    in_layers = sum(layers.values())
    parts = Counter(pe.part_of(e.region, PARTS) for e in evs if not e.region.startswith(pe.LAYER_PREFIX))
    total_us = sum(e.dur_us for e in evs) or 1.0
    layer_us = sum(e.dur_us for e in evs if e.region.startswith(pe.LAYER_PREFIX))
    out = DecodeProfile(
        batch_size=bs, num_layers=n, kernels_per_step=len(evs) / steps, per_layer=in_layers / n,
        per_layer_min=min(layers.values(), default=0.0), per_layer_max=max(layers.values(), default=0.0),
        outside_layers={k: v / steps for k, v in parts.most_common()}, device_us_per_step=total_us / steps,
        layers_share_pct=100.0 * layer_us / total_us,
        kinds={k: v / steps for k, v in Counter(e.kind for e in evs).items()},
        layer_counts=layers, rows=pe.kernel_table(evs, steps, n),
        unlinked={k: v / steps for k, v in pe.unlinked(evs).items()},
    )
    if cuda:
        out.graph_kernels, out.graph_note = _graph_replay_count(step, static, out)
    return out


def _graph_replay_count(
    step: Callable[..., object], static: dict[str, torch.Tensor], eager: DecodeProfile
) -> tuple[float, str]:
    graph = common.capture_graph(lambda: step(static))[0]
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=_activities(True)) as prof, record_function("gp.replay"):
        graph.replay()
        torch.cuda.synchronize()
    evs = pe.device_events(prof.events(), True)
    sampling = eager.outside_layers.get(PARTS["gp.sampling"], 0.0)
    note = (f"one replay of a graph of the whole step: the profiler shows {len(evs)} device events "
            f"(eager step without sampling: {eager.kernels_per_step - sampling:g})")
    if not evs:
        note = "one replay of a graph of the whole step: the profiler shows no device events for it"
    del graph
    return float(len(evs)), note


def decode_markdown(d: DecodeProfile, context_len: int, cuda: bool) -> str:
    unit = "kernels" if cuda else "CPU ops (no CUDA: they stand in for kernels; self times)"
    outside = ", ".join(f"{k} {v:g}" for k, v in d.outside_layers.items())
    kinds = ", ".join(f"{k} {v:g}" for k, v in sorted(d.kinds.items()))
    lines = [
        f"### Decode step, bs {d.batch_size}, context {context_len}\n\n",
        f"- {unit} per step: **{d.kernels_per_step:g}** ({kinds})\n",
        f"- per layer: **{d.per_layer:g}** x {d.num_layers} layers = {d.per_layer * d.num_layers:g} "
        f"(layers' own counts {d.per_layer_min:g}-{d.per_layer_max:g}); outside the layers: {outside}\n",
        f"- device time per step (sum of {unit}): {d.device_us_per_step:.1f} us, "
        f"{d.layers_share_pct:.1f}% in the layers\n",
    ]
    if d.graph_note:
        lines.append(f"- graph replay: {d.graph_note}\n")
    if d.unlinked:
        names = ", ".join(f"{k} x{v:g}" for k, v in sorted(d.unlinked.items()))
        lines.append(f"- unattributed ({pe.UNLINKED}): {names}\n")
    lines.append("\n" + md_table(["name", "kind", "per step", "per layer", "outside layers", "us per step",
                                  "share %"],
                                 [[r.name, r.kind, r.per_step, r.in_layers_per_layer, r.outside_layers_per_step,
                                   r.us_per_step, r.share_pct] for r in d.rows]))
    return "".join(lines)


def _load(cfg: ProfileConfig, device: torch.device, dtype: torch.dtype, max_positions: int) -> LoadedModel:
    if isinstance(cfg.model, ModelConfig):
        m = build_random_model(cfg.model, device, dtype, cfg.attn_backend, max_positions)
        return m, cfg.model, None
    from graphpool.model.loader import load_model
    from graphpool.model.ops import default_attn_backend

    return load_model(cfg.model, device, dtype, default_attn_backend(cfg.attn_backend, device),
                      max_positions=max_positions)


def run_profile_bench(cfg: ProfileConfig, out_dir: Path, argv: Sequence[str] | None = None) -> dict[str, Any]:
    device, dtype = common.device_and_dtype(cfg.device, cfg.dtype)
    cuda = device.type == "cuda"
    env = common.collect_env(argv, device)
    activity = ("torch.profiler activities CPU + CUDA" if cuda
                else "torch.profiler activity CPU only (no CUDA device: CPU ops stand in for kernels)")
    header = env.header_markdown() + f"- {activity}\n"
    print(header, flush=True)
    label = model_label(cfg.model)
    max_len = max(2048, cfg.context_len + 16, cfg.prefill_tokens + 16)
    loaded = _load(cfg, device, dtype, max_len)
    progress(f"profile: {label} on {env.gpu}, torch {env.torch_version}, {dtype}")
    decodes: list[DecodeProfile] = []
    prefill: PrefillProfile | None = None
    if cfg.batch_sizes:
        setup = DecodeSetup.create(loaded[0], max(cfg.batch_sizes), cfg.context_len, cfg.block_size)
        with torch.inference_mode():
            for bs in cfg.batch_sizes:
                decodes.append(profile_decode(setup, bs, cfg))
                progress(f"  decode bs={bs}: {decodes[-1].kernels_per_step:g} per step")
        del setup
        common.free_device_memory(device)
    if cfg.prefill_tokens:
        prefill = run_prefill(loaded, label, cfg, max_len)
        progress(f"  prefill {cfg.prefill_tokens} tokens: {prefill.warm_step_ms:.2f} ms a step")
    body = f"## {label} ({str(dtype).removeprefix('torch.')})\n\n- {activity}\n\n"
    body += "\n".join(decode_markdown(d, cfg.context_len, cuda) for d in decodes)
    if prefill is not None:
        body += "\n" + prefill_markdown(prefill, cuda)
    results = {"config": cfg, "dtype": str(dtype), "cuda": cuda, "decode": decodes, "prefill": prefill}
    common.write_report(out_dir, "profile", env, results, body, "Kernels of a decode step; a prefill step's time")
    print(body)
    return results


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=ProfileConfig.model, help="any model load_model accepts")
    p.add_argument("--batch-sizes", default="1,64", help="decode batch sizes, comma-separated ('' = none)")
    p.add_argument("--context-len", type=int, default=ProfileConfig.context_len)
    p.add_argument("--prefill-tokens", type=int, default=ProfileConfig.prefill_tokens,
                   help="prompt length of the profiled prefill step (0 = no prefill part)")
    p.add_argument("--steps", type=int, default=ProfileConfig.steps, help="profiled decode steps per size")
    p.add_argument("--warmup", type=int, default=ProfileConfig.warmup)
    p.add_argument("--reps", type=int, default=ProfileConfig.reps, help="timed prefill steps (no profiler)")
    p.add_argument("--top", type=int, default=ProfileConfig.top, help="rows of the prefill tables")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attn-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--out", type=Path, default=Path("results/profile"))


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    try:
        sizes = tuple(int(s) for s in args.batch_sizes.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes must be comma-separated ints, got {args.batch_sizes!r}") from None
    cfg = ProfileConfig(model=args.model, batch_sizes=sizes, context_len=args.context_len,
                        prefill_tokens=args.prefill_tokens, steps=args.steps, warmup=args.warmup, reps=args.reps,
                        top=args.top, device=args.device, dtype=args.dtype, attn_backend=args.attn_backend)
    run_profile_bench(cfg, args.out, argv)
