"""The one-row GEMVs with the layer's other ops folded in: SwiGLU into the gate/up GEMV
(kernels/_triton_gemv_swiglu.py, the ``gemv_swiglu`` switch) and the RMSNorm before it or before the qkv GEMV
(`gemv_features` with NORM, the ``gemv_norm`` switch). In the Triton interpreter each is its unfused kernels' output
bit for bit (fp32 and fp16, odd widths, K over two tiles without a norm, the stream stored once); the dispatch
declines off CUDA, with the norm switched off, and where the row outgrows one tile; and the model's wiring: a
one-row decode step runs no norm or SwiGLU op of its own but the final norm, prefill runs them all, and greedy
outputs equal the unfused model's. The sm_90 compile is in test_kernels_compile_sm90.py, the GPU tests in
tests/gpu/test_kernels_gemv_gpu.py."""

from __future__ import annotations

import dataclasses

import torch
from test_kernels_decode_attention import run_in_triton_interpreter
from test_kernels_gemv_rope import PROMPTS, _engine, _reference_fusion

from graphpool.kernels import gemv
from graphpool.kernels.gemv import RowNorm, linear_swiglu
from graphpool.model.ops import TORCH_OPS, add_rms_norm_torch, rms_norm_torch, silu_mul_torch
from model_reference import run_waves

_SCRIPT = """
from graphpool.kernels._triton_gemv import gemv_triton
from graphpool.kernels._triton_gemv_rope import gemv_rope_triton
from graphpool.kernels._triton_gemv_swiglu import gemv_swiglu_triton
from graphpool.kernels._triton_norm_rope import rms_norm_triton
from graphpool.kernels._triton_silu_mul import silu_mul_triton
from graphpool.kernels.gemv import RowNorm

gen = torch.Generator().manual_seed(0)
out = {"swiglu": [], "normed": [], "rope": []}
for dtype in (torch.float32, torch.float16):
    for k, inter in ((64, 96), (40, 7), (3000, 5)):
        w = (torch.randn(2 * inter, k, generator=gen) / k**0.5).to(dtype)
        x = torch.randn(1, k, generator=gen).to(dtype)
        out["swiglu"].append(int((gemv_swiglu_triton(x, w) != silu_mul_triton(gemv_triton(x, w))).sum()))
        if k > 2048:
            continue
        r = torch.randn(1, k, generator=gen).to(dtype)
        nw = (1 + torch.randn(k, generator=gen) / 4).to(dtype)
        for residual in (r, None):
            stream = torch.full_like(x, 7.0)
            got = gemv_swiglu_triton(x, w, norm=RowNorm(residual, nw, 1e-5), stream=stream)
            h, s = rms_norm_triton(x, nw, 1e-5, residual)
            ref = silu_mul_triton(gemv_triton(h, w))
            bad = int((got != ref).sum())
            if residual is not None:
                bad += int((stream != s).sum())
            else:
                bad += int((stream != 7.0).sum())  # nothing to store without a residual
            out["normed"].append(bad)
    hq, hkv, d, k = 6, 2, 8, 40
    n = (hq + 2 * hkv) * d
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    x, r = torch.randn(1, k, generator=gen).to(dtype), torch.randn(1, k, generator=gen).to(dtype)
    nw = (1 + torch.randn(k, generator=gen) / 4).to(dtype)
    cos, sin = torch.rand(64, d // 2, generator=gen), torch.rand(64, d // 2, generator=gen)
    pos, slot = torch.tensor([37]), torch.tensor([13])
    caches = [torch.zeros(4, 8, hkv, d, dtype=dtype) for _ in range(4)]
    stream = torch.empty_like(x)
    got = gemv_rope_triton(x, w, b, pos, cos, sin, caches[0], caches[1], slot, (hq, hkv, d),
                           norm=RowNorm(r, nw, 1e-6), stream=stream)
    h, s = rms_norm_triton(x, nw, 1e-6, r)
    ref = gemv_rope_triton(h, w, b, pos, cos, sin, caches[2], caches[3], slot, (hq, hkv, d))
    out["rope"].append(int((got != ref).sum() + (stream != s).sum() + (caches[0] != caches[2]).sum()
                           + (caches[1] != caches[3]).sum()) + int(caches[0].abs().sum() == 0))
print(json.dumps([out["swiglu"], out["normed"], out["rope"]]))
"""


def test_the_folded_gemvs_are_their_kernels_bitwise_in_the_interpreter() -> None:
    swiglu, normed, rope = run_in_triton_interpreter(_SCRIPT)
    assert swiglu == [0] * 6
    assert normed == [0] * 8  # 2 dtypes x 2 widths x with and without a residual
    assert rope == [0] * 2


def test_the_folds_decline_off_cuda_with_the_norm_off_and_past_one_tile(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Off CUDA nothing is launched; with a CUDA-looking row the launcher is asked only where the norm is
    folded and fits one tile (the launcher recorded, its output a stand-in)."""
    from types import SimpleNamespace

    x, w = torch.randn(1, 16, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16)
    norm = RowNorm(torch.randn(1, 16, dtype=torch.bfloat16), torch.ones(16, dtype=torch.bfloat16), 1e-5)
    assert linear_swiglu(x, w) is None and linear_swiglu(x, w, norm=norm) is None
    calls: list[bool] = []

    def launch(x, w, *, norm, stream, pdl):  # type: ignore[no-untyped-def]
        calls.append(norm is not None)
        return torch.zeros(1, w.shape[0] // 2, dtype=x.dtype)

    monkeypatch.setattr(gemv, "uses_gemv", lambda x, w, max_rows=1: x.numel() == x.shape[-1])
    monkeypatch.setattr(gemv, "triton_impl", lambda name: SimpleNamespace(gemv_swiglu_triton=launch))
    act, stream = linear_swiglu(x, w, norm=norm)  # type: ignore[misc]
    assert act.shape == (1, 16) and stream is not None and stream.shape == x.shape
    assert linear_swiglu(x, w, norm=norm, fold_norm=False) is None
    assert linear_swiglu(x, w, norm=norm._replace(residual=None)) is not None  # the stream is then x itself
    wide = torch.randn(1, 4096, dtype=torch.bfloat16)
    assert linear_swiglu(wide, torch.randn(8, 4096, dtype=torch.bfloat16), norm=RowNorm(None, wide[0], 1e-5)) is None
    assert linear_swiglu(x, w, norm=norm._replace(weight=torch.ones(8, dtype=torch.bfloat16))) is None
    assert calls == [True, True]
    assert linear_swiglu(x, w) is not None and calls[-1] is False


def _reference_swiglu(calls: list[int]):  # type: ignore[no-untyped-def]
    """The folded gate/up op as its parts (the norm, linear, silu * up), recording the rows of each call; it
    declines rows past one, as the kernel's dispatch does."""

    def fused(x, w, norm=None):  # type: ignore[no-untyped-def]
        calls.append(x.shape[0])
        if x.shape[0] != 1:
            return None
        stream = None
        if norm is not None:
            stream = x if norm.residual is None else x + norm.residual
            x = rms_norm_torch(stream, norm.weight, norm.eps)
        return silu_mul_torch(torch.nn.functional.linear(x, w)), stream

    return fused


def test_a_one_row_decode_step_runs_no_norm_or_swiglu_of_its_own() -> None:
    """The torch op set with the folds as their parts: the same greedy tokens as without them; one-row decode
    steps call the norm ops only for the final norm (one add_rms_norm a step) and silu_mul never, while the
    prompts' prefill calls them all."""
    counts = {"rms_norm": [], "add_rms_norm": [], "silu_mul": []}

    def counted(name, fn):  # type: ignore[no-untyped-def]
        def call(x, *rest):  # type: ignore[no-untyped-def]
            counts[name].append(x.shape[0])
            return fn(x, *rest)

        return call

    ops = dataclasses.replace(TORCH_OPS, rms_norm=counted("rms_norm", rms_norm_torch),
                              add_rms_norm=counted("add_rms_norm", add_rms_norm_torch),
                              silu_mul=counted("silu_mul", silu_mul_torch))  # fmt: skip
    waves = [range(len(PROMPTS))]
    plain = run_waves(_engine(ops), PROMPTS, waves, 12)
    assert counts["silu_mul"].count(1) > 0
    for c in counts.values():
        c.clear()
    rope_rows: list[int] = []
    swiglu_rows: list[int] = []
    folded = dataclasses.replace(ops, fused_linear_rope=_reference_fusion(rope_rows),
                                 linear_swiglu=_reference_swiglu(swiglu_rows))  # fmt: skip
    got = run_waves(_engine(folded), PROMPTS, waves, 12)
    assert got == plain
    decode_steps = len(PROMPTS) * 11  # one sequence at a time: 12 tokens, the first from the prefill
    assert set(rope_rows) == {1} and swiglu_rows.count(1) == len(rope_rows) == 2 * decode_steps  # 2 layers
    assert 1 not in counts["silu_mul"] and 1 not in counts["rms_norm"] and counts["silu_mul"]
    assert counts["add_rms_norm"].count(1) == decode_steps  # the final norm alone
