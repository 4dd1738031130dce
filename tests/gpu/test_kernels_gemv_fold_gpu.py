"""The one-row GEMVs with the layer's other ops folded in, on the GPU: the gate/up GEMV + SwiGLU is the GEMV then
the SwiGLU kernel bit for bit (SmolLM2's, 1B's and 8B's widths, eagerly and replayed); with the RMSNorm folded in
(qkv + rotary and gate/up + SwiGLU) the output is no further from float64 than the unfused kernels' plus an
output rounding, and the stream is the norm kernel's sum bit for bit; a chain of folded layers (each GEMV right
after a GEMV, so each lets the next one in early) gives the same bits with PDL as without and replays as it ran;
inside the engine (random llama3.2-1b, bf16, one sequence at a time) the defaults against `--disable-kernels
gemv_norm,gemv_swiglu`: argmaxes agree except at near-ties, and no norm or SwiGLU kernel runs in a one-row step
but the final norm."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import report
from test_engine_gpu import Record, run
from test_kernels_gemv_gpu import (
    _engine,
    _graph_outputs,
    _work,
    chain_layers,
    near_ties_only_then_graph_as_eager,
    pdl_keeps_the_bits,
)
from test_kernels_silu_mul_gpu import build

from graphpool.kernels.gemv import RowNorm
from graphpool.model.ops import ModelOps, kernel_ops


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max())


@pytest.mark.parametrize(("k", "inter"), [(576, 1536), (2048, 8192), (4096, 14336)])
def test_gemv_swiglu_is_the_gemv_then_the_swiglu_kernel(k: int, inter: int) -> None:
    from graphpool.kernels._triton_gemv import gemv_triton
    from graphpool.kernels._triton_gemv_swiglu import gemv_swiglu_triton
    from graphpool.kernels._triton_silu_mul import silu_mul_triton

    gen = torch.Generator(device="cuda").manual_seed(k)
    w = (torch.randn(2 * inter, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
    eager, graph = _graph_outputs(lambda: [gemv_swiglu_triton(x, w)])
    two = silu_mul_triton(gemv_triton(x, w))
    assert torch.equal(eager[0], two) and torch.equal(graph[0], two)


def _normed(x: torch.Tensor, r: torch.Tensor | None, nw: torch.Tensor, eps: float) -> torch.Tensor:
    s = x.double() if r is None else (x.float() + r.float()).bfloat16().double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * nw.double()


@pytest.mark.parametrize("k", [576, 2048])
@pytest.mark.parametrize("with_residual", [True, False])
def test_the_folded_norm_is_as_close_to_float64_as_the_norm_kernel(k: int, with_residual: bool) -> None:
    """Gate/up + SwiGLU and the qkv projection (its v part: not rotated) of the norm, against float64 of the same
    inputs: no further than the norm kernel then the unfused kernels, plus one output rounding; the stream is
    the norm kernel's sum."""
    from graphpool.kernels._triton_gemv import gemv_triton
    from graphpool.kernels._triton_gemv_rope import gemv_rope_triton
    from graphpool.kernels._triton_gemv_swiglu import gemv_swiglu_triton
    from graphpool.kernels._triton_norm_rope import rms_norm_triton
    from graphpool.kernels._triton_silu_mul import silu_mul_triton

    gen = torch.Generator(device="cuda").manual_seed(k + with_residual)
    inter, hq, hkv, dim = 3 * k, k // 64, max(1, k // 256), 64
    n = (hq + 2 * hkv) * dim
    w = (torch.randn(2 * inter, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    wq = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    nw = (1 + torch.randn(k, device="cuda", generator=gen) / 4).bfloat16()
    cos = sin = torch.ones(8, dim // 2, device="cuda")
    pos, slot = torch.tensor([3], device="cuda"), torch.tensor([5], device="cuda")
    caches = [torch.zeros(2, 16, hkv, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    worst = {"swiglu": 0.0, "qkv": 0.0}
    for trial in range(8):
        x = (torch.randn(1, k, device="cuda", generator=gen) * (1 + trial)).bfloat16()
        r = torch.randn(1, k, device="cuda", generator=gen).bfloat16() if with_residual else None
        norm = RowNorm(r, nw, 1e-5)
        h, s = rms_norm_triton(x, nw, 1e-5, r)
        g64 = _normed(x, r, nw, 1e-5) @ w.double().T
        ref = torch.nn.functional.silu(g64[:, :inter]) * g64[:, inter:]
        stream = torch.empty_like(x)
        got = gemv_swiglu_triton(x, w, norm=norm, stream=stream)
        unfused = silu_mul_triton(gemv_triton(h, w))
        ulp = float(ref.abs().max()) * torch.finfo(torch.bfloat16).eps
        assert _err(got, ref) <= _err(unfused, ref) + ulp, trial
        if r is not None:
            assert torch.equal(stream, s)
        v64 = (_normed(x, r, nw, 1e-5) @ wq.double().T)[:, (hq + hkv) * dim:]
        qkv = gemv_rope_triton(x, wq, None, pos, cos, sin, *caches, slot, (hq, hkv, dim), norm=norm,
                               stream=torch.empty_like(x))  # fmt: skip
        v_unfused = gemv_triton(h, wq)[:, (hq + hkv) * dim:]
        ulp = float(v64.abs().max()) * torch.finfo(torch.bfloat16).eps
        assert _err(qkv[:, (hq + hkv) * dim:], v64) <= _err(v_unfused, v64) + ulp, trial
        worst["swiglu"] = max(worst["swiglu"], _err(got, ref) / max(ulp, 1e-30))
        worst["qkv"] = max(worst["qkv"], _err(qkv[:, (hq + hkv) * dim:], v64) / max(ulp, 1e-30))
    report(f"folded norm K={k} residual={with_residual}: worst error vs float64 (in output roundings)",
           {name: round(v, 2) for name, v in worst.items()})


def _folded_chain(layers: list[tuple[torch.Tensor, ...]], x: torch.Tensor, ops: ModelOps) -> list[torch.Tensor]:
    """Per layer: the gate/up GEMV with the norm and SwiGLU folded in, then the down GEMV; each GEMV follows a
    GEMV (the first layer's norm without a residual)."""
    outs = []
    y, residual = x, None
    for norm_w, gate_up, down in layers:
        fused = ops.linear_swiglu(y, gate_up, norm=RowNorm(residual, norm_w, 1e-5))
        assert fused is not None
        act, residual = fused
        y = ops.linear(act, down, None)
        outs += [y, residual]
    return outs


def test_pdl_between_folded_gemvs_gives_the_bits_of_plain_launches() -> None:
    layers, x = chain_layers(1)
    pdl_keeps_the_bits(_folded_chain, layers, x)


def test_engine_with_the_folds_matches_the_unfolded_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.kernels import _triton_norm_rope, _triton_silu_mul

    rows: dict[str, list[int]] = {"norm": [], "silu": []}
    norm_launch, silu_launch = _triton_norm_rope.rms_norm_triton, _triton_silu_mul.silu_mul_triton
    monkeypatch.setattr(_triton_norm_rope, "rms_norm_triton",
                        lambda x, *a, **kw: rows["norm"].append(x.numel() // x.shape[-1]) or norm_launch(x, *a, **kw))
    monkeypatch.setattr(_triton_silu_mul, "silu_mul_triton",
                        lambda x, *a, **kw: rows["silu"].append(x.numel() // x.shape[-1]) or silu_launch(x, *a, **kw))
    ref = run(_engine(None, graph_miss_policy="capture", disabled_kernels="gemv_norm,gemv_swiglu"), _work(0))
    assert rows["silu"].count(1) > 0
    unfolded = {name: r.count(1) for name, r in rows.items()}
    for r in rows.values():
        r.clear()
    loaded = build(torch.bfloat16, kernel_ops())
    got: Record = run(_engine(loaded, graph_miss_policy="capture"), _work(0), forced=ref)
    assert got.graph_steps > 50
    assert 1 not in rows["silu"]
    # NOTE: the final norm's one-row launches are what is left: one a captured or eager one-row step
    assert 0 < rows["norm"].count(1) < unfolded["norm"] / 10
    near_ties_only_then_graph_as_eager(ref, got, loaded, "folded norm + SwiGLU engine bf16 argmax flips vs unfolded")
