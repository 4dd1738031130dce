"""Time the one-row GEMV (kernels/gemv) against cuBLAS the way a decode step at batch size 1 runs it.

Run on a GPU: ``python -m graphpool.bench.gemm_kernel [--models llama3.2-1b llama3-8b] [--layers 16]``.
Per model, ``--layers`` decoder layers' projections with the kernels between them that a layer has (RMSNorm
-> qkv -> o -> residual add + RMSNorm -> gate_up -> SwiGLU -> down; the attention left out), each fed by the
one before, every weight distinct (so each is streamed from HBM, not the L2), captured in one CUDA graph and
replayed: cuBLAS, the GEMV, and the GEMV with programmatic dependent launch (the model's operations built
with the kernel switches `gemv` and `pdl` off, `pdl` off, and the defaults). The floor is the weights' bytes / the copy bandwidth measured in the same run. Medians of
``--reps`` replays; ``--out DIR`` also writes them as JSON, Markdown and a bar plot.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch

from graphpool.bench.common import (
    EnvInfo,
    capture_graph,
    collect_env,
    md_table,
    measure_hbm_bandwidth,
    write_report,
)
from graphpool.model.ops import ModelOps, kernel_ops

MODELS = {  # name: (hidden, q + 2 kv width, intermediate)
    "llama3.2-1b": (2048, 3072, 8192),
    "llama3-8b": (4096, 6144, 14336),
}
# mode: the kernel switches turned off (kernels/switches.py)
MODES: dict[str, tuple[str, ...]] = {"cublas": ("gemv", "pdl"), "gemv": ("pdl",), "gemv+pdl": ()}


def make_layers(hidden: int, qkv: int, inter: int, layers: int) -> list[dict[str, torch.Tensor]]:
    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)

    return [
        {"norm": torch.ones(hidden, device="cuda", dtype=torch.bfloat16), "qkv": w(qkv, hidden),
         "o": w(hidden, hidden), "gate_up": w(2 * inter, hidden), "down": w(hidden, inter)}
        for _ in range(layers)
    ]  # fmt: skip


def step(layers: list[dict[str, torch.Tensor]], x: torch.Tensor, ops: ModelOps) -> torch.Tensor:
    """The chain of `layers` on the row `x` with the model's operations `ops`."""
    linear = ops.linear
    hidden = x.shape[-1]
    h, residual = ops.rms_norm(x, layers[0]["norm"], 1e-5), x
    for layer in layers:
        attn = linear(linear(h, layer["qkv"], None)[:, :hidden], layer["o"], None)
        h, residual = ops.add_rms_norm(attn, residual, layer["norm"], 1e-5)
        down = linear(ops.silu_mul(linear(h, layer["gate_up"], None)), layer["down"], None)
        h, residual = ops.add_rms_norm(down, residual, layer["norm"], 1e-5)
    return h


def replay_us(fn, reps: int) -> float:
    """Median us of a replay of `fn`'s graph, each replay timed alone (synchronised after it)."""
    graph = capture_graph(fn)[0]
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


HEADERS = ("model", "mode", "weights_MiB", "floor_us", "step_us", "x_floor", "cublas/mode")


def write_outputs(rows: list[dict[str, object]], out: Path, env: EnvInfo, header: str) -> list[Path]:
    """`gemm_kernel.json` (env + rows), `gemm_kernel.md` (the table) and `gemm_kernel.png` under `out`."""
    from graphpool.bench.plots import plot_gemm_chain

    table = md_table(HEADERS, [[row[h] for h in HEADERS] for row in rows])
    paths = list(write_report(out, "gemm_kernel", env, rows, f"{header}\n\n{table}", "One-row GEMV chain"))
    return [*paths, plot_gemm_chain(rows, out / "gemm_kernel.png")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None, help="also write JSON, Markdown and a plot here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench gemm_kernel needs a CUDA GPU")
    torch.manual_seed(0)
    bw = measure_hbm_bandwidth(torch.device("cuda"), nbytes=1 << 30)
    print(
        f"# command: python -m graphpool.bench.gemm_kernel {' '.join(sys.argv[1:] if argv is None else argv)}"
    )
    header = (f"{torch.cuda.get_device_name()}  torch {torch.__version__}  copy bandwidth {bw / 1e12:.2f} TB/s  "
              f"bf16, batch size 1, {args.layers} layers, median of {args.reps} graph replays")  # fmt: skip
    print(f"# {header}")
    print(f"{'model':<12} {'mode':<9} {'weights_MiB':>11} {'floor_us':>8} {'step_us':>8} {'x_floor':>7} "
          f"{'cublas/mode':>11}")  # fmt: skip
    rows: list[dict[str, object]] = []
    for name in args.models:
        hidden, qkv, inter = MODELS[name]
        layers = make_layers(hidden, qkv, inter, args.layers)
        nbytes = sum(t.numel() * t.element_size() for layer in layers for t in layer.values())
        floor = nbytes / bw * 1e6
        x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
        base = None
        for mode, off in MODES.items():
            t = replay_us(functools.partial(step, layers, x, kernel_ops(off)), args.reps)
            base = base or t
            rows.append(dict(zip(HEADERS, (name, mode, round(nbytes / 2**20), round(floor, 1), round(t, 1),
                                           round(t / floor, 2), round(base / t, 2)), strict=True)))  # fmt: skip
            print(f"{name:<12} {mode:<9} {nbytes / 2**20:>11.0f} {floor:>8.1f} {t:>8.1f} {t / floor:>7.2f} "
                  f"{base / t:>11.2f}", flush=True)  # fmt: skip
        del layers
        torch.cuda.empty_cache()
    if args.out is not None:
        for path in write_outputs(rows, args.out, collect_env(device=torch.device("cuda")), header):
            print(f"# wrote {path}")


if __name__ == "__main__":
    main()
