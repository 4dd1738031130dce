"""The one-row GEMV (kernels/gemv.py): ``w @ x + b`` from the Triton kernel in the interpreter against
float64 (K no multiple of the tile, N no multiple of BLOCK_N, a bias, a strided row, a leading batch shape);
the dispatch (which operands take the kernel) and the kernel switches; its sm_90 compile (and PDL's
griddepcontrol placement) is in test_kernels_compile_sm90.py; the H200 tests in tests/gpu/test_kernels_gemv_gpu.py."""

from __future__ import annotations

import pytest
import torch

from graphpool.kernels.gemv import linear, uses_gemv
from graphpool.kernels.pdl import pdl_on
from graphpool.kernels.staging import OFF_ENV, STAGED_ENV, kernel_on, staged_kernels_on
from test_kernels_decode_attention import run_in_triton_interpreter

_SCRIPT = """
from graphpool.kernels._triton_gemv import Tiles, gemv_triton

gen = torch.Generator().manual_seed(0)
errors = []
for dtype in (torch.float32, torch.float16):
    for n, k, block_n, block_k, bias in ((70, 300, 8, 128, False), (64, 256, 8, 64, True), (9, 40, 4, 16, True),
                                         (33, 1000, 16, 512, False)):
        x = torch.randn(1, 2 * k, generator=gen).to(dtype)[:, ::2]  # a strided row: copied first
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype) if bias else None
        y = gemv_triton(x, w, b, tiles=Tiles(block_n, block_k, num_stages=1))
        ref = x.double() @ w.double().T + (b.double() if bias else 0.0)
        ok = y.shape == (1, n) and y.dtype == dtype
        errors.append(float((y.double() - ref).abs().max() / ref.abs().max()) if ok else 1.0)
    y3 = gemv_triton(torch.randn(1, 1, 24).to(dtype), torch.randn(5, 24).to(dtype))
    errors.append(0.0 if y3.shape == (1, 1, 5) else 1.0)
print(json.dumps(errors))
"""


_NORM_SCRIPT = """
from graphpool.kernels._triton_gemv import Tiles, norm_gemv_triton
from graphpool.kernels.norm_rope import add_rms_norm_ref, rms_norm_ref

gen = torch.Generator().manual_seed(1)
errors = []
for dtype in (torch.float32, torch.float16):
    for n, k, block_k, with_residual, bias in ((40, 300, 128, True, False), (24, 256, 64, False, True),
                                               (9, 1000, 512, True, True)):
        x = torch.randn(1, k, generator=gen).to(dtype)
        res = torch.randn(1, k, generator=gen).to(dtype) if with_residual else None
        g = (torch.rand(k, generator=gen) + 0.5).to(dtype)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype) if bias else None
        y, new_res = norm_gemv_triton(x, res, g, 1e-5, w, b, tiles=Tiles(8, block_k, num_stages=1))
        if res is None:
            h, want_res = rms_norm_ref(x.double(), g.double(), 1e-5), x
        else:
            h = add_rms_norm_ref(x.double(), res.double(), g.double(), 1e-5)[0]
            want_res = (x + res)  # the stream after the add, rounded as torch rounds it
        ref = h @ w.double().T + (b.double() if bias else 0.0)
        ok = y.shape == (1, n) and y.dtype == dtype and torch.equal(new_res, want_res)
        errors.append(float((y.double() - ref).abs().max() / ref.abs().max()) if ok else 1.0)
print(json.dumps(errors))
"""


def test_norm_gemv_matches_float64_in_the_interpreter() -> None:
    """The staged norm + GEMV: the product of the normalized row within fp32 (fp16) rounding of float64,
    and the residual stream after the add bitwise torch's ``x + residual``."""
    errors = run_in_triton_interpreter(_NORM_SCRIPT)
    assert len(errors) == 6
    assert max(errors[:3]) < 1e-5
    assert max(errors[3:]) < 1e-2


_SILU_SCRIPT = """
from graphpool.kernels._triton_gemv import Tiles, gemv_triton
from graphpool.kernels._triton_silu_mul import silu_mul_triton

gen = torch.Generator().manual_seed(2)
same = []
for dtype in (torch.float32, torch.float16):
    for n, inter, block_k, bias in ((40, 300, 128, False), (9, 1000, 512, True)):
        gate_up = (torch.randn(1, 2 * inter, generator=gen) * 3).to(dtype)
        w = (torch.randn(n, inter, generator=gen) / inter**0.5).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype) if bias else None
        tiles = Tiles(8, block_k, num_stages=1)
        fused = gemv_triton(gate_up, w, b, tiles=tiles, swiglu=True)
        two = gemv_triton(silu_mul_triton(gate_up), w, b, tiles=tiles)
        same.append(fused.shape == (1, n) and torch.equal(fused, two))
print(json.dumps(same))
"""


def test_silu_gemv_is_the_two_kernels_bitwise_in_the_interpreter() -> None:
    """The staged SwiGLU + GEMV computes the SwiGLU kernel's bits on the fly, so its product is the GEMV's of
    the SwiGLU kernel's output, bit for bit."""
    assert run_in_triton_interpreter(_SILU_SCRIPT) == [True] * 4


def test_fused_ops_decline_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.kernels.gemv import fused_norm_linear, fused_silu_linear

    monkeypatch.setenv(STAGED_ENV, "norm_gemv,silu_gemv")
    x, g, w = torch.randn(1, 16), torch.rand(16) + 0.5, torch.randn(8, 16)
    assert fused_norm_linear(x, None, g, 1e-6, w) is None
    assert fused_silu_linear(torch.randn(1, 32), w) is None


def test_gemv_matches_float64_in_the_interpreter() -> None:
    errors = run_in_triton_interpreter(_SCRIPT)
    assert len(errors) == 10
    assert max(errors[:4]) < 1e-5  # fp32
    assert max(errors[5:9]) < 1e-2  # fp16 output rounding
    assert errors[4] == errors[9] == 0.0


def test_switches_name_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OFF_ENV, raising=False)
    monkeypatch.delenv(STAGED_ENV, raising=False)
    assert kernel_on("gemv") and kernel_on("pdl")  # on by default
    assert not pdl_on(torch.device("cpu"))  # never off CUDA
    monkeypatch.setenv(OFF_ENV, "pdl")
    assert kernel_on("gemv") and not kernel_on("pdl")
    monkeypatch.setenv(OFF_ENV, "gemv,pdl")
    assert not kernel_on("gemv")
    with pytest.raises(ValueError, match="unknown kernel switch"):
        kernel_on("gemm")
    assert not staged_kernels_on("argmax")
    monkeypatch.setenv(STAGED_ENV, "argmax")
    assert staged_kernels_on("argmax") and not staged_kernels_on("fused_merge")
    monkeypatch.setenv(STAGED_ENV, "1")
    assert staged_kernels_on("fused_merge")
    with pytest.raises(ValueError, match="unknown staged kernel"):
        staged_kernels_on("gemv")


def test_dispatch_is_torch_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OFF_ENV, raising=False)
    x, w, b = torch.randn(1, 16), torch.randn(8, 16), torch.randn(8)
    assert not uses_gemv(x, w)
    assert torch.equal(linear(x, w, b), torch.nn.functional.linear(x, w, b))


def test_dispatch_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which operands would take the kernel on CUDA (is_cuda faked: the rules are host-side facts)."""
    monkeypatch.delenv(OFF_ENV, raising=False)

    class FakeCuda(torch.Tensor):
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    def cuda_like(t: torch.Tensor) -> torch.Tensor:
        return t.as_subclass(FakeCuda)

    w = torch.randn(8, 16, dtype=torch.bfloat16)
    assert uses_gemv(cuda_like(torch.randn(1, 16, dtype=torch.bfloat16)), w)
    assert uses_gemv(cuda_like(torch.randn(1, 1, 16, dtype=torch.bfloat16)), w)
    assert not uses_gemv(cuda_like(torch.randn(2, 16, dtype=torch.bfloat16)), w)
    assert not uses_gemv(cuda_like(torch.randn(1, 16)), w.float())  # fp32 stays on cuBLAS
    assert not uses_gemv(cuda_like(torch.randn(1, 16, dtype=torch.bfloat16)), w.T.contiguous().T)
    assert not uses_gemv(cuda_like(torch.randn(1, 8, dtype=torch.bfloat16)), w)  # K mismatch: torch's error
    monkeypatch.setenv(OFF_ENV, "gemv")
    assert not uses_gemv(cuda_like(torch.randn(1, 16, dtype=torch.bfloat16)), w)
