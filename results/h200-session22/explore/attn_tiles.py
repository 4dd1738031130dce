"""For a next GPU window (no carry, ~2 min): the decode attention's tile knobs at the default split length, and
the staged split loop. Per shape (1B / 8B), bs 1-128, bound = context 1024 and bound 4096 over 512-token rows:
graph replay us of split + merge for block_n 32 / 64 (default) / 128, num_warps 4 / 8, num_stages 1-3, and
with `split_programs = loop_programs(...)`; each variant's output checked against the default's (block_n
changes the bits, so those report a max difference; the split loop must be equal).
Usage (device): PYTHONPATH=src python3 results/h200-session22/explore/attn_tiles.py"""
import torch
from triton.testing import do_bench_cudagraph

from graphpool.bench.attention_kernel import SHAPES
from graphpool.kernels import _triton_decode_attention as tda

torch.manual_seed(0)
VARIANTS = {"default": {}, "bn32": {"block_n": 32}, "bn128": {"block_n": 128}, "w8": {"num_warps": 8},
            "st1": {"num_stages": 1}, "st2": {"num_stages": 2}, "st3": {"num_stages": 3}, "loop": None}
print("shape bs ctx bound | " + " ".join(VARIANTS) + "  (graph us; * = output differs from default)")
for name in ("llama3.2-1b", "llama3-8b"):
    hq, hkv, dim = SHAPES[name]
    for ctx, bound in ((1024, 1024), (512, 4096)):
        for bs in (1, 8, 64, 128):
            max_blocks = bound // 16
            nb = 1 + bs * max_blocks
            q = torch.randn(bs, hq, dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(nb, 16, hkv, dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            bt = (torch.randperm(nb - 1, device="cuda")[: bs * max_blocks] + 1).view(bs, max_blocks).int()
            lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
            out = torch.empty_like(q)
            sms = tda.device_num_sms(q.device)
            splits = -(-bound // tda.choose_split_len(hkv, bound, sms))
            ref = tda.paged_decode_attention_triton(q, k, v, bt, lens, dim**-0.5, bound, fused_merge=False)
            cells = []
            for label, kw in VARIANTS.items():
                kw = {"split_programs": tda.loop_programs(bs * hkv, splits, sms)} if kw is None else kw
                got = tda.paged_decode_attention_triton(q, k, v, bt, lens, dim**-0.5, bound, fused_merge=False, **kw)
                torch.cuda.synchronize()  # do_bench_cudagraph's side stream waits for nothing
                t = do_bench_cudagraph(lambda kw=kw: tda.paged_decode_attention_triton(
                    q, k, v, bt, lens, dim**-0.5, bound, out=out, fused_merge=False, **kw)) * 1e3
                cells.append(f"{t:.1f}{'' if torch.equal(got, ref) else '*'}")
            print(name, bs, ctx, bound, "|", " ".join(cells), flush=True)
            del q, k, v, bt
            torch.cuda.empty_cache()
