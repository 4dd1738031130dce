"""Exploration (session 21): the few-row kernel's tilings in bench gemm_kernel's 16-layer chain.
usage: python skinny_tiles.py 'BN BK WARPS STAGES PROGRAMS;...' ROWS... [-- gemm_kernel args]
('' for cuBLAS alone)"""
import sys

import graphpool.kernels._triton_skinny as sk

import graphpool.bench.gemm_kernel as gk

tilings = [tuple(int(v) for v in t.split()) for t in sys.argv[1].split(";") if t.strip()]
rest = sys.argv[2:]
extra = rest[rest.index("--") + 1:] if "--" in rest else []
rows = [int(r) for r in (rest[: rest.index("--")] if "--" in rest else rest)]
for r in rows:
    gk.ROWS_MODES = {"cublas": ("gemv,pdl", "")}
    gk.main(["--rows", str(r), *extra])
    for bn, bk, warps, stages, programs in tilings:
        sk.skinny_gemm_triton.__kwdefaults__["tiles"] = sk.SkinnyTiles(bn, bk, warps, stages, programs)
        gk.ROWS_MODES = {f"sk{bn}x{bk}w{warps}s{stages}p{programs}": ("", "skinny")}
        gk.main(["--rows", str(r), *extra])
