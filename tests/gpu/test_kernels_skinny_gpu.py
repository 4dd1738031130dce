"""The few-row tensor-core kernel (kernels/_triton_skinny.py) on the GPU: against float64 at the projections'
shapes of llama3.2-1b and llama3-8b and an odd one, 2 to 64 rows (no worse than cuBLAS's own error by more
than an output rounding), with and without PDL and a bias; a chain of norm -> kernel -> SwiGLU -> kernel
layers captured in a CUDA graph gives the bits it gives eagerly, with and without PDL (a kernel reading its
rows before the kernel ahead of it finished would not); inside the engine (random llama3.2-1b, bf16, up to 8
sequences, so decode steps have 2-8 rows) against cuBLAS: argmaxes agree except at near-ties, and a graph
step equals an eager one."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import report
from test_engine_gpu import MAX_MODEL_LEN, PRESET, compare, run
from test_kernels_gemv_gpu import SHAPES, _chain, _graph_outputs, _max_err, _work
from test_kernels_silu_mul_gpu import build

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.kernels.pdl import LaunchFlags
from graphpool.kernels.staging import OFF_ENV, STAGED_ENV
from graphpool.model.ops import kernel_ops

ROWS = (2, 3, 8, 16, 33, 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k"), [s for s in SHAPES if s[0] != 128256])
def test_skinny_is_as_close_to_float64_as_cublas(n: int, k: int, dtype: torch.dtype) -> None:
    from graphpool.kernels._triton_skinny import skinny_gemm_triton

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    for m in ROWS:
        # NOTE: a row stride wider than K, as a slice of the fused qkv output is
        x = torch.randn(m, k + 64, device="cuda", generator=gen).to(dtype)[:, :k]
        for b in (None, bias):
            ref = x.double() @ w.double().T + (0.0 if b is None else b.double())
            cublas = torch.nn.functional.linear(x, w, b)
            ulp = float(ref.abs().max()) * torch.finfo(dtype).eps  # one rounding at the largest output
            for pdl in (False, True):
                y = skinny_gemm_triton(x, w, b, flags=LaunchFlags(pdl, False))
                assert y.shape == cublas.shape and y.dtype == dtype
                assert _max_err(y, ref) <= _max_err(cublas, ref) + ulp, (m, b is not None, pdl)


@pytest.mark.parametrize("rows", [4, 16])
def test_skinny_chain_graph_is_eager_with_and_without_pdl(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator(device="cuda").manual_seed(rows)
    hidden, inter = 2048, 8192
    layers = [
        (torch.rand(hidden, device="cuda", generator=gen).bfloat16() + 0.5,
         (torch.randn(2 * inter, hidden, device="cuda", generator=gen) / hidden**0.5).bfloat16(),
         (torch.randn(hidden, inter, device="cuda", generator=gen) / inter**0.5).bfloat16())
        for _ in range(24)
    ]  # fmt: skip
    x = torch.randn(rows, hidden, device="cuda", generator=gen).bfloat16()
    monkeypatch.setenv(STAGED_ENV, "skinny")
    results = {}
    for off in ("pdl", ""):
        monkeypatch.setenv(OFF_ENV, off)
        results[off] = _graph_outputs(lambda: _chain(layers, x))
    plain_eager = results["pdl"][0]
    for off, (eager, graph) in results.items():
        for kind, got in (("eager", eager), ("graph", graph)):
            assert all(torch.equal(a, b) for a, b in zip(got, plain_eager, strict=True)), (off, kind)
    monkeypatch.setenv(OFF_ENV, "gemv,pdl")
    monkeypatch.delenv(STAGED_ENV)
    cublas = _chain(layers, x)
    drift = [
        float((a.float() - b.float()).abs().max() / b.float().abs().max())
        for a, b in zip(results[""][1], cublas, strict=True)
    ]
    report(f"skinny chain, {rows} rows: relative difference from cuBLAS after layers 1 / 24",
           [round(drift[0], 4), round(drift[-1], 4)])  # fmt: skip
    assert all(d == d for d in drift)  # no NaN


def _work8(seed: int):
    return _work(seed) + _work(seed + 100)  # 8 requests: decode steps of up to 8 rows


def _engine(loaded, **kwargs) -> LLMEngine:
    config = EngineConfig(model=PRESET, device="cuda", dtype="bfloat16", max_model_len=MAX_MODEL_LEN,
                          num_kv_blocks=400, max_num_seqs=8, **kwargs)  # fmt: skip
    return LLMEngine(config, loaded=loaded)


def test_engine_with_the_skinny_kernel_matches_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.kernels import _triton_skinny

    loaded = build(torch.bfloat16, kernel_ops())
    rows = []
    launch = _triton_skinny.skinny_gemm_triton
    monkeypatch.setattr(
        _triton_skinny, "skinny_gemm_triton", lambda *a, **kw: rows.append(a[0].shape[0]) or launch(*a, **kw)
    )
    monkeypatch.delenv(OFF_ENV, raising=False)
    monkeypatch.delenv(STAGED_ENV, raising=False)
    ref = run(_engine(loaded, graph_miss_policy="capture"), _work8(4))
    assert not rows
    monkeypatch.setenv(STAGED_ENV, "skinny")
    got = run(_engine(loaded, graph_miss_policy="capture"), _work8(4), forced=ref)
    assert got.graph_steps > 20 and rows and max(rows) >= 2
    compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    flips = sum(got.argmax[k] != ref.argmax[k] for k in ref.argmax)
    report("skinny engine bf16 argmax flips vs cuBLAS", f"{flips} of {len(ref.argmax)}")
    eager = run(_engine(loaded, disable_cudagraph=True), _work8(5))
    graphed = run(_engine(loaded, graph_miss_policy="capture"), _work8(5), forced=eager)
    compare(eager, graphed, tie=0.3, logit_tol=0.3, min_agree=0.93)
