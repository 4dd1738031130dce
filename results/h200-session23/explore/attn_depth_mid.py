"""Session 23, call F (no carry, ~1 min): the attention's pipeline depth (3 = triton's default vs 2) where
`attn_stages` switches at 8 kv heads under the engine-like bound 4096 (16 splits: 2 stages from bs 9), bs 4-64,
rows at 512 tokens and at 1-1200 random; 1B / 8B head shapes; split + merge replayed in a graph, us.
Usage (device): PYTHONPATH=src python3 results/h200-session23/explore/attn_depth_mid.py
(Run as call F with the inputs built inline; they now come from `attention_kernel.paged_inputs`, the same draws in
the same order.)"""
import torch
from triton.testing import do_bench_cudagraph

from graphpool.bench.attention_kernel import SHAPES, paged_inputs
from graphpool.kernels import _triton_decode_attention as tda
from graphpool.kernels.attention_grid import choose_num_stages, choose_split_len, device_num_sms

torch.manual_seed(0)
bound = 4096


def graph_us(args: tuple, out: torch.Tensor, stages: int) -> float:
    q, k, v, bt, lens, scale = args
    return do_bench_cudagraph(lambda: tda.paged_decode_attention_triton(
        q, k, v, bt, lens, scale, bound, out=out, fused_merge=False, num_stages=stages), rep=200) * 1e3


print("shape rows bs programs picked | 3 stages us, 2 stages us, 2/3, equal")
for name in ("llama3.2-1b", "llama3-8b"):
    _, hkv, dim = SHAPES[name]
    for rows in ("512", "rand"):
        for bs in (4, 8, 9, 12, 16, 24, 32, 48, 64):
            q, k, v, bt = paged_inputs(SHAPES[name], bs, bound)
            lens = (torch.full((bs,), 512) if rows == "512" else torch.randint(1, 1201, (bs,))).to("cuda", torch.int32)
            out = torch.empty_like(q)
            sms = device_num_sms(q.device)
            programs = bs * hkv * -(-bound // choose_split_len(hkv, bound, sms))
            a = tda.paged_decode_attention_triton(q, k, v, bt, lens, dim**-0.5, bound, fused_merge=False, num_stages=3)
            b = tda.paged_decode_attention_triton(q, k, v, bt, lens, dim**-0.5, bound, fused_merge=False, num_stages=2)
            torch.cuda.synchronize()  # do_bench_cudagraph's side stream waits for nothing
            t = [graph_us((q, k, v, bt, lens, dim**-0.5), out, s) for s in (3, 2)]
            print(name, rows, bs, programs, choose_num_stages(programs, sms), "|",
                  f"{t[0]:.1f} {t[1]:.1f} {t[1] / t[0]:.3f} {torch.equal(a, b)}", flush=True)
            del q, k, v, bt
            torch.cuda.empty_cache()
