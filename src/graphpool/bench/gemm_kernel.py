"""Time the few-row linear kernel (kernels/skinny_gemm) against cuBLAS at decode projection shapes.

Run on a GPU: ``python -m graphpool.bench.gemm_kernel [--rows 1 2 4] [--shapes llama3.2-1b llama3-8b]``.
Each timing replays, inside one CUDA graph, one call per copy of the weight over enough copies to exceed
the L2 cache many times, so every call streams its weight from HBM as in a real decode step (a single
weight replayed alone would stay in the H200's 50 MB L2). The floor is the weight's bytes / the copy
bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse

import torch

from graphpool.bench.common import measure_hbm_bandwidth

SHAPES = {  # name: {projection: (out_features, in_features)}
    "llama3.2-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                    "lm_head": (128256, 2048)},
    "llama3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                  "lm_head": (128256, 4096)},
}  # fmt: skip
STREAM_BYTES = 1 << 30  # weight copies per timing: at least this many bytes (20x the H200's L2)


def time_per_call(fn, weights: list[torch.Tensor], x: torch.Tensor) -> float:
    """Microseconds per call, graph-replayed over every copy of the weight in turn."""
    from triton.testing import do_bench_cudagraph

    def all_copies() -> None:
        for w in weights:
            fn(x, w)

    return do_bench_cudagraph(all_copies, rep=50) * 1e3 / len(weights)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench gemm_kernel needs a CUDA GPU")
    from graphpool.kernels._triton_skinny_gemm import skinny_linear_triton

    torch.manual_seed(0)
    bw = measure_hbm_bandwidth(torch.device("cuda"), nbytes=1 << 30)
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  copy bandwidth {bw / 1e12:.2f} TB/s  "
          f"(bf16; graph-replayed, weights streamed from HBM)")  # fmt: skip
    print(f"{'shape':<12} {'proj':<8} {'rows':>4} {'MiB':>7} {'floor_us':>8} {'cublas_us':>9} {'skinny_us':>9} "
          f"{'cublas/skinny':>13} {'skinny_x_floor':>14}")  # fmt: skip
    for name in args.shapes:
        for proj, (n, k) in SHAPES[name].items():
            nbytes = n * k * 2
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
                       for _ in range(max(2, -(-STREAM_BYTES // nbytes)))]  # fmt: skip
            floor = nbytes / bw * 1e6
            for rows in args.rows:
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                cublas = time_per_call(lambda a, w: torch.nn.functional.linear(a, w), weights, x)
                skinny = time_per_call(lambda a, w: skinny_linear_triton(a, w), weights, x)
                print(f"{name:<12} {proj:<8} {rows:>4} {nbytes / 2**20:>7.1f} {floor:>8.1f} {cublas:>9.1f} "
                      f"{skinny:>9.1f} {cublas / skinny:>13.2f} {skinny / floor:>14.2f}", flush=True)  # fmt: skip
            del weights
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
