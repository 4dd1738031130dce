"""Exploration (session 21): the one-row GEMV with WARPS warps where K >= MIN_K, in bench gemm_kernel's chain
or a graphpool command. usage: python gemv_warps.py WARPS MIN_K gemm|cli ARGS..."""
import sys

import graphpool.kernels._triton_gemv as g

warps, min_k = int(sys.argv[1]), int(sys.argv[2])
launch = g.gemv_triton


def gemv_triton(x, weight, bias=None, **kw):
    if weight.shape[1] >= min_k and "tiles" not in kw:
        kw["tiles"] = g.Tiles(num_warps=warps)
    return launch(x, weight, bias, **kw)


g.gemv_triton = gemv_triton
what, rest = sys.argv[3], sys.argv[4:]
if what == "gemm":
    import graphpool.bench.gemm_kernel as gk
    gk.MODES = {"gemv+pdl": gk.MODES["gemv+pdl"]}
    gk.main(rest)
else:
    from graphpool.cli import main
    sys.exit(main(rest))
