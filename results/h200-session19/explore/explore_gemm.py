"""Exploration (issue 12): cuBLAS vs Triton skinny GEMM at decode shapes, graph-replayed."""
import itertools, json, os, sys
import torch, triton, triton.language as tl
from triton.testing import do_bench_cudagraph

@triton.jit
def _gemv_fma(x_ptr, w_ptr, y_ptr, N, stride_xm, stride_wn, stride_ym, K: tl.constexpr,
              M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :], mask=n_mask[:, None] & (k[None, :] < K), other=0.0)
            x = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        y = tl.sum(acc, 1)
        tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)

@triton.jit
def _gemm_dot(x_ptr, w_ptr, y_ptr, M, N, stride_xm, stride_wn, stride_ym, K: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=m_mask[:, None] & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :], mask=n_mask[:, None] & (k[None, :] < K), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])

def run_fma(x, w, y, bn, bk, nw, ns):
    M, K = x.shape; N = w.shape[0]
    _gemv_fma[(triton.cdiv(N, bn),)](x, w, y, N, x.stride(0), w.stride(0), y.stride(0), K=K, M=M, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)

def run_dot(x, w, y, bn, bk, nw, ns):
    M, K = x.shape; N = w.shape[0]
    _gemm_dot[(triton.cdiv(N, bn), triton.cdiv(M, 16))](x, w, y, M, N, x.stride(0), w.stride(0), y.stride(0), K=K, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)

SHAPES = {"1b.qkv": (3072, 2048), "1b.o": (2048, 2048), "1b.gateup": (16384, 2048), "1b.down": (2048, 8192),
          "1b.lmhead": (128256, 2048), "8b.o": (4096, 4096), "8b.down": (4096, 14336)}
BW = 4.23e12
out = []
print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
print(f"{'shape':<11} {'M':>3} {'floor':>6} {'cublasLt':>8} {'cublas':>7} {'fma':>7} {'cfg':<14} {'dot':>7} {'cfg':<14} {'err':>7}")
for name, (N, K) in SHAPES.items():
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    for M in (1, 4, 8, 16):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), w.float())
        floor = (N * K * 2) / BW * 1e6
        res = {}
        for lib in ("cublaslt", "cublas"):
            torch.backends.cuda.preferred_blas_library(lib)
            res[lib] = do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w)) * 1e3
        torch.backends.cuda.preferred_blas_library("default")
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        best = {}
        grids = {"fma": itertools.product((8, 16, 32), (256, 512), (4, 8), (3, 4)),
                 "dot": itertools.product((16, 32, 64), (128, 256), (4,), (3, 4, 6))}
        for kind, grid in grids.items():
            if kind == "fma" and M > 4:
                continue
            fn = run_fma if kind == "fma" else run_dot
            for bn, bk, nw, ns in grid:
                if bn * bk > 16384 or bk > K:
                    continue
                try:
                    y.fill_(float("nan"))
                    fn(x, w, y, bn, bk, nw, ns)
                    err = float((y.float() - ref).abs().max() / ref.abs().max())
                    if not err < 1e-2:
                        print("BAD", name, M, kind, bn, bk, nw, ns, err); continue
                    t = do_bench_cudagraph(lambda: fn(x, w, y, bn, bk, nw, ns), rep=10) * 1e3
                except Exception as exc:  # exploration: report and go on
                    print("FAIL", name, M, kind, bn, bk, nw, ns, type(exc).__name__, str(exc)[:100]); continue
                if kind not in best or t < best[kind][0]:
                    best[kind] = (t, f"{bn}/{bk}/{nw}/{ns}", err)
        row = dict(shape=name, M=M, floor=floor, **res, **{k: v[0] for k, v in best.items()},
                   **{k + "_cfg": v[1] for k, v in best.items()})
        out.append(row)
        f = best.get("fma", (float("nan"), "-", 0)); d = best.get("dot", (float("nan"), "-", 0))
        print(f"{name:<11} {M:>3} {floor:>6.1f} {res['cublaslt']:>8.1f} {res['cublas']:>7.1f} {f[0]:>7.1f} {f[1]:<14} {d[0]:>7.1f} {d[1]:<14} {max(f[2], d[2]):>7.1e}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "gemm.json"), "w"), indent=1)
