"""The staged few-row kernel (kernels/_triton_gemv_rows.py, ``GRAPHPOOL_STAGED_KERNELS=gemv_rows``): ``x @ w.T
+ b`` for 2-8 rows in the Triton interpreter against float64 (K no multiple of the tile, N no multiple of
BLOCK_N, a bias, rows further apart than K, row counts no power of two), and which operands `gemv.linear`
sends to it; its sm_90 compile is in test_kernels_compile_sm90.py, the H200 tests in
tests/gpu/test_kernels_gemv_gpu.py."""

from __future__ import annotations

import pytest
import torch

from graphpool.kernels.gemv import MAX_ROWS, linear, uses_gemv, uses_gemv_rows
from graphpool.kernels.staging import OFF_ENV, STAGED_ENV
from test_kernels_decode_attention import run_in_triton_interpreter

_SCRIPT = """
from graphpool.kernels._triton_gemv_rows import RowTiles, gemv_rows_triton

gen = torch.Generator().manual_seed(3)
errors = []
for dtype in (torch.float32, torch.float16):
    for m, n, k, block_n, block_k, bias in ((2, 70, 300, 8, 128, False), (3, 64, 256, 4, 64, True),
                                            (5, 9, 40, 8, 16, True), (8, 33, 1000, 16, 512, False)):
        x = torch.randn(m, k + 7, generator=gen).to(dtype)[:, :k]  # rows k + 7 apart
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype) if bias else None
        y = gemv_rows_triton(x, w, b, tiles=RowTiles(block_n, block_k=block_k))
        ref = x.double() @ w.double().T + (b.double() if bias else 0.0)
        ok = y.shape == (m, n) and y.dtype == dtype
        errors.append(float((y.double() - ref).abs().max() / ref.abs().max()) if ok else 1.0)
print(json.dumps(errors))
"""


def test_gemv_rows_matches_float64_in_the_interpreter() -> None:
    errors = run_in_triton_interpreter(_SCRIPT)
    assert len(errors) == 8
    assert max(errors[:4]) < 1e-5  # fp32
    assert max(errors[4:]) < 1e-2  # fp16 output rounding


def test_dispatch_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which operands would take the few-row kernel on CUDA (is_cuda faked: the rules are host-side facts)."""
    monkeypatch.delenv(OFF_ENV, raising=False)
    monkeypatch.delenv(STAGED_ENV, raising=False)

    class FakeCuda(torch.Tensor):
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    def rows(m: int, k: int = 16, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(m, k, dtype=dtype).as_subclass(FakeCuda)

    w = torch.randn(8, 16, dtype=torch.bfloat16)
    assert not uses_gemv_rows(rows(2), w)  # staged: off by default
    monkeypatch.setenv(STAGED_ENV, "gemv_rows")
    assert all(uses_gemv_rows(rows(m), w) for m in range(2, MAX_ROWS + 1))
    assert not uses_gemv_rows(rows(1), w) and uses_gemv(rows(1), w)  # one row: the one-row kernel
    assert not uses_gemv_rows(rows(MAX_ROWS + 1), w)
    assert not uses_gemv_rows(rows(2, dtype=torch.float32), w.float())  # fp32 stays on cuBLAS
    assert not uses_gemv_rows(torch.randn(1, 2, 16, dtype=torch.bfloat16).as_subclass(FakeCuda), w)  # 2-D only
    assert not uses_gemv_rows(rows(2), w.T.contiguous().T)
    assert not uses_gemv_rows(rows(2, k=8), w)  # K mismatch: torch's error
    monkeypatch.setenv(OFF_ENV, "gemv")
    assert not uses_gemv_rows(rows(2), w)


def test_linear_is_torch_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STAGED_ENV, "gemv_rows")
    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    assert not uses_gemv_rows(x, w)
    assert torch.equal(linear(x, w, b), torch.nn.functional.linear(x, w, b))
