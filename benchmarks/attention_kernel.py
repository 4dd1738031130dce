"""Time the Triton paged decode attention against the HBM floor of the bytes it must read.

Run on a GPU: ``python benchmarks/attention_kernel.py [--ref] [--mixed] [--split-len N] [--bound N]``.
The floor is (K + V bytes of every row's context + q + out) / the copy bandwidth measured in the same run.
``eager`` is triton.testing.do_bench (L2 flushed between runs, launch cost included); ``graph`` is
do_bench_cudagraph (the kernels replayed inside a CUDA graph, as the decode step runs them).
"""

from __future__ import annotations

import argparse
import math

import torch

from graphpool.bench.common import measure_hbm_bandwidth

SHAPES = {  # name: (num_heads, num_kv_heads, head_dim)
    "llama3-8b": (32, 8, 128),
    "llama3.2-1b": (32, 8, 64),
    "qwen2.5-0.5b": (14, 2, 64),
    "smollm2-135m": (9, 3, 64),
}


def paged_inputs(
    shape: tuple[int, int, int],
    bs: int,
    max_len: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random decode-attention inputs ``(q, k_cache, v_cache, block_tables)`` for `bs` rows of up to `max_len`
    tokens: every row gets its own blocks, scattered over the cache (block 0 stays unused, the engine's
    reserved dummy block), so the kernel's gathers are not sequential. The row lengths are the caller's."""
    hq, hkv, dim = shape
    max_blocks = -(-max_len // block_size)
    num_blocks = 1 + bs * max_blocks
    q = torch.randn(bs, hq, dim, device=device, dtype=dtype)
    k = torch.randn(num_blocks, block_size, hkv, dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    bt = (torch.randperm(num_blocks - 1, device=device)[: bs * max_blocks] + 1).view(bs, max_blocks).int()
    return q, k, v, bt


def bench_one(
    shape: tuple[int, int, int],
    bs: int,
    ctx: int,
    mixed: bool,
    split_len: int | None,
    with_ref: bool,
    knobs: dict[str, int],
    block_size: int = 16,
    bound: int | None = None,
) -> dict[str, float]:
    from triton.testing import do_bench, do_bench_cudagraph

    from graphpool.kernels._triton_decode_attention import paged_decode_attention_triton
    from graphpool.kernels.attention_grid import choose_split_len, device_num_sms
    from graphpool.kernels.decode_attention import paged_decode_attention_ref

    _, hkv, dim = shape
    dtype = torch.bfloat16
    bound = max(bound or ctx, ctx)
    q, k, v, bt = paged_inputs(shape, bs, bound, block_size, dtype)
    if mixed:
        lens = torch.randint(1, ctx + 1, (bs,), device="cuda", dtype=torch.int32)
    else:
        lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    scale = dim**-0.5
    split = split_len or choose_split_len(hkv, bound, device_num_sms(q.device), knobs.get("block_n", 64))

    def run() -> None:
        paged_decode_attention_triton(q, k, v, bt, lens, scale, bound, out=out, split_len=split, **knobs)

    run()
    ref = (
        paged_decode_attention_ref(q.float(), k.float(), v.float(), bt, lens, scale, bound)
        if with_ref
        else None
    )
    elem = torch.finfo(dtype).bits // 8
    total_tokens = int(lens.sum())
    nbytes = 2 * total_tokens * hkv * dim * elem + 2 * q.numel() * elem + bt.numel() * 4
    row = {
        "split_len": float(split),
        "splits": float(math.ceil(bound / split)),
        "bytes": float(nbytes),
        "eager_us": do_bench(run) * 1e3,
        "graph_us": do_bench_cudagraph(run) * 1e3,
    }
    if ref is not None:
        row["rel_err"] = float((out.float() - ref).norm() / ref.norm())
        row["ref_us"] = do_bench(lambda: paged_decode_attention_ref(q, k, v, bt, lens, scale, bound)) * 1e3
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32, 64, 256])
    parser.add_argument("--lens", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--mixed", action="store_true", help="row lengths uniform in [1, len], bound = len")
    parser.add_argument("--split-len", type=int, default=None, help="override the split heuristic")
    parser.add_argument("--bound", type=int, default=None,
                        help="the kernel's length bound (a graph's: the engine's max_model_len), at least len")
    parser.add_argument("--block-n", type=int, default=None, help="context tokens per tile (default 64)")
    parser.add_argument("--num-warps", type=int, default=None)
    parser.add_argument("--num-stages", type=int, default=None)
    parser.add_argument("--ref", action="store_true", help="also time the torch reference and check accuracy")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench attention_kernel needs a CUDA GPU")

    knobs = {
        name: value
        for name, value in (
            ("block_n", args.block_n),
            ("num_warps", args.num_warps),
            ("num_stages", args.num_stages),
        )
        if value is not None
    }
    torch.manual_seed(0)
    bw = measure_hbm_bandwidth(torch.device("cuda"), nbytes=1 << 30)
    print(
        f"# {torch.cuda.get_device_name()}  copy bandwidth {bw / 1e12:.2f} TB/s  (bf16, block_size 16) {knobs}"
    )
    header = f"{'shape':<13} {'bs':>4} {'len':>5} {'split':>5} {'n':>3} {'MiB':>8} {'floor_us':>9}"
    header += f" {'eager_us':>9} {'graph_us':>9} {'x_floor':>7} {'TB/s':>6}"
    if args.ref:
        header += f" {'ref_us':>9} {'rel_err':>8}"
    print(header)
    for name in args.shapes:
        for ctx in args.lens:
            for bs in args.batch_sizes:
                row = bench_one(SHAPES[name], bs, ctx, args.mixed, args.split_len, args.ref, knobs, bound=args.bound)
                floor_us = row["bytes"] / bw * 1e6
                line = (
                    f"{name:<13} {bs:>4} {ctx:>5} {int(row['split_len']):>5} {int(row['splits']):>3} "
                    f"{row['bytes'] / 2**20:>8.1f} {floor_us:>9.1f} {row['eager_us']:>9.1f} "
                    f"{row['graph_us']:>9.1f} {row['graph_us'] / floor_us:>7.2f} "
                    f"{row['bytes'] / row['graph_us'] / 1e6:>6.2f}"
                )
                if args.ref:
                    line += f" {row['ref_us']:>9.1f} {row['rel_err']:>8.1e}"
                print(line, flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
