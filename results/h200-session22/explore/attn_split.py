"""Exploration (session 22): the decode attention's split length at 1B / 8B shapes, bs 1-128, context 512 /
1024 (bound = context, as `bench step` runs it) and the engine's bound 4096 with 512-token rows; and the greedy
argmax of a [bs, 128256] bf16 logits row in a CUDA graph, torch vs the staged Triton kernel.
Usage: python attn_split.py  (GPU)"""
import sys

import torch
from triton.testing import do_bench_cudagraph

from graphpool.bench.attention_kernel import SHAPES
from graphpool.kernels._triton_argmax import argmax_rows_triton
from graphpool.kernels._triton_decode_attention import choose_split_len, device_num_sms, paged_decode_attention_triton

torch.manual_seed(0)
print("shape bs ctx bound split_len splits graph_us (default split first)")
for name in ("llama3.2-1b", "llama3-8b"):
    hq, hkv, dim = SHAPES[name]
    for ctx, bound in ((512, 512), (1024, 1024), (512, 4096)):
        for bs in (1, 8, 64, 128):
            bsz = 16
            max_blocks = -(-bound // bsz)
            nb = 1 + bs * max_blocks
            q = torch.randn(bs, hq, dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(nb, bsz, hkv, dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            bt = (torch.randperm(nb - 1, device="cuda")[: bs * max_blocks] + 1).view(bs, max_blocks).int()
            lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
            out = torch.empty_like(q)
            default = choose_split_len(hkv, bound, device_num_sms(q.device))
            row = []
            for split in [default] + [s for s in (64, 128, 256, 512) if s != default]:
                for warps in (4,):
                    t = do_bench_cudagraph(lambda: paged_decode_attention_triton(
                        q, k, v, bt, lens, dim**-0.5, bound, out=out, split_len=split, num_warps=warps)) * 1e3
                    row.append(f"{split}:{t:.1f}")
            print(name, bs, ctx, bound, " ".join(row), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
print("argmax [bs, 128256] bf16, graph us: torch / triton")
for bs in (1, 8, 64, 128):
    x = torch.randn(bs, 128256, device="cuda", dtype=torch.bfloat16)
    a = do_bench_cudagraph(lambda: x.argmax(-1)) * 1e3
    b = do_bench_cudagraph(lambda: argmax_rows_triton(x)) * 1e3
    assert torch.equal(x.argmax(-1), argmax_rows_triton(x))
    print(f"argmax bs {bs}: {a:.1f} / {b:.1f}", flush=True)
sys.exit(0)
