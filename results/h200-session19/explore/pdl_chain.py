"""Exploration (issue 12): does programmatic dependent launch (PDL) pay for a chain of decode GEMVs?

16 "layers" of llama3.2-1b's four projections at batch size 1 (qkv 3072x2048, o 2048x2048, gate_up 16384x2048,
down 2048x8192), each fed by the previous one's output, every weight distinct (1.86 GB: streamed from HBM),
captured in one CUDA graph: cuBLAS vs a Triton GEMV without PDL vs with PDL (the first weight tile loaded
before griddepcontrol.wait, dependents launched at the start)."""
import os, sys, json
import torch, triton, triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, N, stride_wn, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          PDL: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    w0 = tl.load(rows + offs_k[None, :], mask=n_mask[:, None], other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    x0 = tl.load(x_ptr + offs_k)
    acc = w0.to(tl.float32) * x0.to(tl.float32)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + offs_k
        w = tl.load(rows + k[None, :], mask=n_mask[:, None], other=0.0)
        x = tl.load(x_ptr + k)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, 1)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)

def gemv(x, w, y, pdl, bn, bk, nw, ns):
    n, k = w.shape
    _gemv[(triton.cdiv(n, bn),)](x, w, y, n, w.stride(0), K=k, BLOCK_N=bn, BLOCK_K=min(bk, k), PDL=pdl,
                                 num_warps=nw, num_stages=ns, launch_pdl=pdl)

LAYER = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]
layers = int(os.environ.get("LAYERS", "16"))
ws = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for n, k in LAYER] for _ in range(layers)]
x0 = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
bufs = {n: torch.empty(n, device="cuda", dtype=torch.bfloat16) for n, _ in LAYER}
nbytes = sum(w.numel() * 2 for l in ws for w in l)

def chain(kind, cfg=None):
    x = x0
    outs = []
    for l in ws:
        for w in l:
            n, k = w.shape
            xin = x[:k]
            if kind == "cublas":
                y = torch.nn.functional.linear(xin[None], w)[0]
            else:
                y = bufs_kind[kind][len(outs)]
                gemv(xin, w, y, kind == "pdl", *cfg)
            outs.append(y)
            x = y
    return outs

bufs_kind = {k: [torch.empty(w.shape[0], device="cuda", dtype=torch.bfloat16) for l in ws for w in l] for k in ("plain", "pdl")}

def time_graph(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2], outs

bw_probe = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
bw_probe2 = torch.empty_like(bw_probe); bw_probe2.copy_(bw_probe)
a.record(); bw_probe2.copy_(bw_probe); b.record(); b.synchronize()
bw = 2 * bw_probe.numel() * 4 / (a.elapsed_time(b) / 1e3)
del bw_probe, bw_probe2
floor = nbytes / bw * 1e6
print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; {layers} layers x 4 GEMVs, "
      f"{nbytes / 2**20:.0f} MiB of weights, copy bw {bw / 1e12:.2f} TB/s, floor {floor:.0f} us")
ref_t, ref = time_graph(lambda: chain("cublas"))
print(f"cublas          {ref_t:8.1f} us  {ref_t / floor:.2f}x floor  {ref_t / (4 * layers):.2f} us/GEMV")
rows = [("cublas", None, ref_t, 0.0)]
for cfg in [(8, 512, 8, 4), (8, 512, 4, 4), (4, 512, 4, 3), (16, 256, 8, 4), (8, 1024, 8, 3), (8, 256, 8, 4)]:
    plain = None
    for kind in ("plain", "pdl"):
        try:
            t, outs = time_graph(lambda: chain(kind, cfg))
        except Exception as exc:  # exploration: report and go on
            print(kind, cfg, "FAILED", type(exc).__name__, str(exc)[:300]); continue
        err = max(float((o.float() - r.float()).abs().max() / (r.float().abs().max() + 1e-6)) for o, r in zip(outs, ref))
        if kind == "plain":
            plain = [o.clone() for o in outs]
        elif plain is not None:
            same = all(torch.equal(o, p) for o, p in zip(outs, plain))
            print(f"   pdl outputs bitwise the plain kernel's: {same}")
        rows.append((kind, cfg, t, err))
        print(f"{kind:<6} {str(cfg):<16} {t:8.1f} us  {t / floor:.2f}x floor  {t / (4 * layers):.2f} us/GEMV  "
              f"vs cublas {ref_t / t:.2f}x  max rel err {err:.1e}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "pdl_chain.json"), "w"))
