"""The one-row GEMV (kernels/gemv.py): ``w @ x + b`` from the Triton kernel in the interpreter against
float64 (K no multiple of the tile, N no multiple of BLOCK_N, a bias, a strided row, a leading batch shape);
the dispatch (which operands take the kernel) and the kernel switches (names checked, resolved once into the
model's operations, reaching the launch); its sm_90 compile (and PDL's griddepcontrol placement) is in
test_kernels_compile_sm90.py; the GPU tests in tests/gpu/test_kernels_gemv_gpu.py."""

from __future__ import annotations

import pytest
import torch
from test_kernels_decode_attention import run_in_triton_interpreter

from graphpool.kernels.gemv import MAX_ROWS, linear, uses_gemv
from graphpool.kernels.switches import KERNEL_SWITCHES, check_switches

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


def test_gemv_matches_float64_in_the_interpreter() -> None:
    errors = run_in_triton_interpreter(_SCRIPT)
    assert len(errors) == 10
    assert max(errors[:4]) < 1e-5  # fp32
    assert max(errors[5:9]) < 1e-2  # fp16 output rounding
    assert errors[4] == errors[9] == 0.0


_ROWS_SCRIPT = """
from graphpool.kernels._triton_gemv import MAX_ROWS, Tiles, gemv_triton

gen = torch.Generator().manual_seed(1)
out = []
for dtype in (torch.float32, torch.float16):
    for m in range(2, MAX_ROWS + 1):
        for n, k, block_n, block_k, bias in ((70, 300, 8, 512, False), (33, 1000, 16, 256, True)):
            x = torch.randn(m, 2 * k, generator=gen).to(dtype)[:, ::2]  # strided rows: copied first
            w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
            b = torch.randn(n, generator=gen).to(dtype) if bias else None
            tiles = Tiles(block_n, block_k, num_stages=1)
            y = gemv_triton(x, w, b, tiles=tiles)
            ref = x.double() @ w.double().T + (b.double() if bias else 0.0)
            err = float((y.double() - ref).abs().max() / ref.abs().max()) if y.shape == (m, n) else 1.0
            # one weight tile (K <= BLOCK_K): each row is the one-row kernel's very bits
            one = torch.cat([gemv_triton(x[i:i + 1], w, b, tiles=tiles) for i in range(m)])
            same = float(torch.equal(y, one)) if k <= block_k else 1.0
            out.append([err, same])
    y2 = gemv_triton(torch.randn(2, 1, 24).to(dtype), torch.randn(5, 24).to(dtype))
    out.append([0.0 if y2.shape == (2, 1, 5) else 1.0, 1.0])
print(json.dumps(out))
"""


def test_the_few_row_gemv_matches_float64_and_the_one_row_kernel_in_the_interpreter() -> None:
    """Two rows (MAX_ROWS): against float64 (K no multiple of the tile, a bias, strided rows, a leading shape),
    and row by row the one-row kernel's bits where K fits one tile."""
    got = run_in_triton_interpreter(_ROWS_SCRIPT)
    per_dtype = (MAX_ROWS - 1) * 2 + 1
    assert len(got) == 2 * per_dtype
    errors = [e for e, _ in got]
    assert max(errors[:per_dtype]) < 1e-5 and max(errors[per_dtype:]) < 1e-2  # fp32, then fp16's rounding
    assert all(same == 1.0 for _, same in got)


def test_the_gemv_refuses_more_rows_than_it_takes() -> None:
    pytest.importorskip("triton")
    from graphpool.kernels._triton_gemv import MAX_ROWS, gemv_triton

    with pytest.raises(ValueError, match=f"1 to {MAX_ROWS} rows"):
        gemv_triton(torch.randn(MAX_ROWS + 1, 16), torch.randn(8, 16))


def test_switches_name_kernels() -> None:
    assert check_switches("pdl, gemv,pdl") == ("gemv", "pdl")  # the switches' order, no repeats
    assert check_switches(["attn_stages"]) == ("attn_stages",) and check_switches("") == ()
    assert check_switches(KERNEL_SWITCHES) == KERNEL_SWITCHES
    with pytest.raises(ValueError, match=r"unknown kernel switch.*'gemm'.*known: gemv, pdl"):
        check_switches("gemv,gemm")
    with pytest.raises(ValueError, match="comma-separated"):
        check_switches(3)  # type: ignore[arg-type]


def test_pdl_is_never_on_off_cuda() -> None:
    pytest.importorskip("triton")
    from graphpool.kernels.pdl import pdl_on

    assert not pdl_on(torch.device("cpu")) and not pdl_on(torch.device("cpu"), enabled=False)


def test_dispatch_is_torch_off_cuda() -> None:
    x, w, b = torch.randn(1, 16), torch.randn(8, 16), torch.randn(8)
    assert not uses_gemv(x, w)
    assert torch.equal(linear(x, w, b), torch.nn.functional.linear(x, w, b))


class FakeCuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def cuda_like(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(FakeCuda)


def test_dispatch_rules() -> None:
    """Which operands would take the kernel on CUDA (is_cuda faked: the rules are host-side facts)."""
    w = torch.randn(8, 16, dtype=torch.bfloat16)
    assert uses_gemv(cuda_like(torch.randn(1, 16, dtype=torch.bfloat16)), w)
    assert uses_gemv(cuda_like(torch.randn(1, 1, 16, dtype=torch.bfloat16)), w)
    assert not uses_gemv(cuda_like(torch.randn(2, 16, dtype=torch.bfloat16)), w)  # one row unless asked
    assert uses_gemv(cuda_like(torch.randn(4, 16, dtype=torch.bfloat16)), w, max_rows=4)
    assert uses_gemv(cuda_like(torch.randn(3, 1, 16, dtype=torch.bfloat16)), w, max_rows=4)
    assert not uses_gemv(cuda_like(torch.randn(5, 16, dtype=torch.bfloat16)), w, max_rows=4)
    assert not uses_gemv(cuda_like(torch.randn(0, 16, dtype=torch.bfloat16)), w, max_rows=4)
    assert not uses_gemv(cuda_like(torch.randn(1, 16)), w.float())  # fp32 stays on cuBLAS
    assert not uses_gemv(cuda_like(torch.randn(1, 16, dtype=torch.bfloat16)), w.T.contiguous().T)
    assert not uses_gemv(cuda_like(torch.randn(1, 8, dtype=torch.bfloat16)), w)  # K mismatch: torch's error


def test_kernel_ops_resolve_the_switches() -> None:
    """A switched-off kernel is left out of the op set (or its switch bound to the launcher), once."""
    from graphpool.kernels import argmax, decode_attention, gemv, norm_rope, sample, silu_mul
    from graphpool.model.ops import TORCH_OPS, argmax_torch, kernel_ops, no_draw, no_fusion, resolve_ops

    on = kernel_ops()
    assert (on.linear, on.fused_linear_rope, on.rms_norm, on.add_rms_norm, on.silu_mul, on.decode_attention,
            on.step_argmax, on.step_sample) == (
        gemv.linear, gemv.fused_linear_rope, norm_rope.rms_norm, norm_rope.add_rms_norm, silu_mul.silu_mul,
        decode_attention.paged_decode_attention, argmax.argmax_rows, sample.sample_rows)
    off = kernel_ops(KERNEL_SWITCHES)
    assert off.linear is torch.nn.functional.linear and off.fused_linear_rope is off.linear_swiglu is no_fusion
    assert off.step_argmax is argmax_torch and off.step_sample is no_draw
    assert off.decode_attention.keywords == {"pdl": False, "attn_stages": False}  # type: ignore[attr-defined]
    for fn in (off.rms_norm, off.add_rms_norm, off.silu_mul):
        assert fn.keywords == {"pdl": False}  # type: ignore[attr-defined]
    pdl_off = kernel_ops(["pdl"])
    assert pdl_off.linear.func is gemv.linear and pdl_off.linear.keywords == {"pdl": False}  # type: ignore[attr-defined]
    rows_off = kernel_ops(["gemv_rows"]).linear
    assert rows_off.func is gemv.linear and rows_off.keywords == {"rows": False}  # type: ignore[attr-defined]
    assert kernel_ops(["gemv_rope"]).fused_linear_rope is no_fusion and kernel_ops(["gemv_rope"]).linear is gemv.linear
    assert on.linear_swiglu is gemv.linear_swiglu and kernel_ops(["gemv_swiglu"]).linear_swiglu is no_fusion
    norm_off = kernel_ops(["gemv_norm"])
    for fn, fused in ((norm_off.fused_linear_rope, gemv.fused_linear_rope), (norm_off.linear_swiglu, gemv.linear_swiglu)):
        assert fn.func is fused and fn.keywords == {"fold_norm": False}  # type: ignore[attr-defined]
    assert resolve_ops("torch", torch.device("cpu")) is TORCH_OPS
    assert resolve_ops("torch", torch.device("cpu"), ["step_argmax"]).step_argmax is argmax_torch
    torch_off = resolve_ops("torch", torch.device("cpu"), ["step_sample"])
    assert torch_off.step_sample is no_draw and torch_off.step_argmax is argmax.argmax_rows
    with pytest.raises(ValueError, match="unknown kernel switch"):
        kernel_ops(["argmax"])


def test_the_pdl_and_rows_switches_reach_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pdl` off in the op set: the GEMV's launcher is asked for no PDL; `gemv_rows` off: two rows are not
    launched (is_cuda faked, the launcher recorded)."""
    from types import SimpleNamespace

    from graphpool.kernels import _triton_gemv, gemv
    from graphpool.model.ops import kernel_ops

    calls: list[tuple[int, bool]] = []

    def launch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, *, pdl: bool) -> torch.Tensor:
        calls.append((x.shape[0], pdl))
        return torch.zeros(x.shape[0], w.shape[0])

    monkeypatch.setattr(gemv, "triton_impl", lambda module: SimpleNamespace(gemv_triton=launch))
    x, w = cuda_like(torch.randn(1, 16, dtype=torch.bfloat16)), torch.randn(8, 16, dtype=torch.bfloat16)
    kernel_ops().linear(x, w, None)
    kernel_ops(["pdl"]).linear(x, w, None)
    kernel_ops(["gemv"]).linear(x.as_subclass(torch.Tensor), w, None)  # nn.functional.linear: no launch
    x2 = cuda_like(torch.randn(2, 16, dtype=torch.bfloat16))
    kernel_ops().linear(x2, w, None)
    kernel_ops().linear(cuda_like(torch.randn(3, 16, dtype=torch.bfloat16)), w, None)
    kernel_ops(["gemv_rows"]).linear(x2.as_subclass(torch.Tensor), w, None)  # 2 rows: nn.functional.linear
    kernel_ops(["gemv_rows"]).linear(x, w, None)  # one row still takes it
    assert calls == [(1, True), (1, False), (2, True), (1, True)]  # 3 rows: past MAX_ROWS, nn.functional.linear
    assert gemv.MAX_ROWS == _triton_gemv.MAX_ROWS
