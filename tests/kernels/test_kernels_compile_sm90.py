"""The Triton kernels compile for an H100/H200 (sm_90) without a GPU: ahead-of-time, down to PTX and cubin.

The interpreter tests check the kernels' arithmetic; this checks what the interpreter cannot (that the
compiler accepts them: control flow, dot shapes and dtypes, constexpr use) so a GPU run is not the first
place a compile error shows up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")


def _compile(fn, types: Callable[[str], str], constexprs: dict, num_warps: int = 4):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: "constexpr" if name in constexprs else types(name) for name in fn.arg_names}
    source = ASTSource(fn, signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _norm_types(name: str) -> str:
    """bf16 pointers, an fp32 eps, i32 else: the norm and GEMV kernels' arguments."""
    return "*bf16" if name.endswith("_ptr") else ("fp32" if name == "eps" else "i32")


def _attn_types(partials: str) -> Callable[[str], str]:
    """The split kernel's arguments, its partial outputs in `partials` ("*bf16" when direct)."""

    def types(name: str) -> str:
        if name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr"):
            return "*bf16"
        if name in ("bt_ptr", "lens_ptr"):
            return "*i32"
        if name in ("po_ptr", "plse_ptr"):
            return partials
        return "fp32" if name in ("qk_scale", "cap_log2") else "i32"

    return types


def _rope_types(name: str) -> str:
    if name in ("pos_ptr", "slot_ptr"):
        return "*i64"
    if name in ("cos_ptr", "sin_ptr"):
        return "*fp32"
    return "*bf16" if name.endswith("_ptr") else ("fp32" if name == "eps" else "i32")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize(("direct", "softcap"), [(False, False), (True, False), (False, True)])
def test_decode_attention_kernels_compile(direct: bool, softcap: bool) -> None:
    from graphpool.kernels import _triton_decode_attention as da

    types = _attn_types("*bf16" if direct else "*fp32")
    constexprs = dict(
        GROUP=4, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
        DIRECT=direct, DOT_PRECISION="tf32", SOFTCAP=softcap, PDL_TRIGGER=direct,
    )  # fmt: skip
    ptx = _compile(da._decode_split_kernel, types, constexprs).asm["ptx"]
    assert "mma" in ptx  # the q.k and p.v products run on tensor cores
    if softcap:  # its tanh is one more exp2 per score: more ex2 than the plain kernel's softmax alone
        plain = _compile(da._decode_split_kernel, types, {**constexprs, "SOFTCAP": False}).asm["ptx"]
        assert ptx.count("ex2.approx") > plain.count("ex2.approx") > 0
    assert ("griddepcontrol.launch_dependents" in ptx) == direct
    if not direct:
        _compile(
            da._decode_merge_kernel,
            lambda n: {"po_ptr": "*fp32", "plse_ptr": "*fp32", "lens_ptr": "*i32", "out_ptr": "*bf16"}.get(
                n, "i32"
            ),
            dict(HEAD_DIM=128, BLOCK_S=16, BLOCK_D=128, PDL_TRIGGER=True),
        )


def test_norm_and_rotary_kernels_compile() -> None:
    from graphpool.kernels import _triton_norm_rope as nr

    _compile(nr._rms_norm_kernel, _norm_types, dict(HAS_RESIDUAL=True, BLOCK=4096, PDL_TRIGGER=True), num_warps=8)

    constexprs = dict(HQ=32, HKV=8, HALF=64, BLOCK_HQ=32, BLOCK_HKV=8, BLOCK_HALF=64, BLOCK_SIZE=16, WRITE_KV=True)
    _compile(nr._rotary_kernel, _rope_types, constexprs)


def test_argmax_kernels_compile() -> None:
    from graphpool.kernels import _triton_argmax as am

    def block_types(name: str) -> str:
        return {"x_ptr": "*bf16", "val_ptr": "*fp32", "idx_ptr": "*i64", "nan_ptr": "*i64"}.get(name, "i32")

    _compile(am._block_argmax_kernel, block_types, dict(BLOCK=am.BLOCK))
    rows_types = {"val_ptr": "*fp32", "idx_ptr": "*i64", "nan_ptr": "*i64", "out_ptr": "*i64"}
    _compile(am._rows_argmax_kernel, lambda n: rows_types.get(n, "i32"), dict(BLOCKS=128))


@pytest.mark.parametrize("logits", ["*bf16", "*fp32"])
def test_sample_kernel_compiles(logits: str) -> None:
    """The draw's stage 1, without and with the cut rows' block sums, and the cut rows' stage 2 (rejection
    loops and the top-k bisection)."""
    from graphpool.kernels import _triton_sample as ts

    types = {"x_ptr": logits, "params_ptr": "*i64", "val_ptr": "*fp32", "idx_ptr": "*i64", "nan_ptr": "*i64",
             "max_ptr": "*fp32", "sum_ptr": "*fp32", "out_ptr": "*i64"}
    for cut in (False, True):
        ptx = _compile(ts._block_sample_kernel, lambda n: types.get(n, "i32"), dict(BLOCK=ts.BLOCK, CUT=cut)).asm["ptx"]
        assert "philox" in ptx.lower() or "mul.hi.u32" in ptx  # the draw's Philox rounds are in the kernel
    ptx = _compile(ts._rows_sample_kernel, lambda n: types.get(n, "i32"), dict(BLOCKS=128, ROW_BLOCK=ts.ROW_BLOCK),
                   num_warps=8).asm["ptx"]
    assert "mul.hi.u32" in ptx  # the redraw's Philox rounds


@pytest.mark.parametrize(("has_bias", "pdl", "k"), [(False, False, 2048), (True, True, 2048), (False, True, 8192)])
def test_gemv_kernel_compiles(has_bias: bool, pdl: bool, k: int) -> None:
    """The one-row GEMV (one tile, or a loop over four); with PDL its first weight tile is loaded before
    griddepcontrol.wait, x after it."""
    from graphpool.kernels import _triton_gemv as gv

    constexprs = dict(K=k, BLOCK_N=gv.BLOCK_N, BLOCK_K=gv.MAX_BLOCK_K, HAS_BIAS=has_bias, PDL=pdl)
    ptx = _compile(gv._gemv_kernel, _norm_types, constexprs, num_warps=gv.NUM_WARPS).asm["ptx"]
    _check_gemv_pdl(ptx, pdl)


def _check_gemv_pdl(ptx: str, pdl: bool) -> None:
    """With PDL a GEMV lets the next PDL launch in first thing (a GEMV may follow it now that the norm and
    SwiGLU fold into them), loads weights before its own wait and x after it; without, neither instruction."""
    assert ("griddepcontrol.wait" in ptx) == pdl and ("griddepcontrol.launch_dependents" in ptx) == pdl
    if pdl:
        assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("griddepcontrol.wait")
        before, after = ptx.split("griddepcontrol.wait", 1)
        assert "ld.global" in before and "ld.global" in after


@pytest.mark.parametrize(("has_bias", "pdl", "k"), [(False, True, 576), (True, False, 2048), (False, True, 8192)])
def test_two_row_gemv_kernel_compiles(has_bias: bool, pdl: bool, k: int) -> None:
    """The two-row GEMV (one tile, or a loop over four); with PDL its first weight tile is loaded before
    griddepcontrol.wait, the rows of x after it."""
    from graphpool.kernels import _triton_gemv as gv

    constexprs = dict(K=k, BLOCK_N=gv.BLOCK_N, BLOCK_K=min(gv.MAX_BLOCK_K, triton.next_power_of_2(k)),
                      HAS_BIAS=has_bias, PDL=pdl)
    ptx = _compile(gv._gemv_rows_kernel, _norm_types, constexprs, num_warps=gv.NUM_WARPS).asm["ptx"]
    _check_gemv_pdl(ptx, pdl)
    assert ptx.count("st.global") >= 2  # a store per row


def test_pdl_trigger_compiles_in_only_when_on() -> None:
    from graphpool.kernels import _triton_norm_rope as nr

    def ptx(on: bool) -> str:
        return _compile(
            nr._rms_norm_kernel, _norm_types, dict(HAS_RESIDUAL=False, BLOCK=2048, PDL_TRIGGER=on)
        ).asm["ptx"]

    assert "griddepcontrol.launch_dependents" in ptx(True)
    assert "griddepcontrol" not in ptx(False)


def test_the_kernels_before_a_gemv_trigger_and_never_wait() -> None:
    """Only the GEMVs are launched with PDL: the norm, SwiGLU and attention kernels trigger their dependents
    first thing and never wait themselves."""
    from graphpool.kernels import _triton_decode_attention as da
    from graphpool.kernels import _triton_norm_rope as nr
    from graphpool.kernels import _triton_silu_mul as sm

    norm = _compile(nr._rms_norm_kernel, _norm_types, dict(HAS_RESIDUAL=True, BLOCK=2048, PDL_TRIGGER=True))
    silu = _compile(sm._silu_mul_kernel, lambda n: "*bf16" if n.endswith("_ptr") else "i32",
                    dict(BLOCK=1024, LIBDEVICE_EXP=True, PDL_TRIGGER=True))
    split = _compile(da._decode_split_kernel, _attn_types("*fp32"), dict(
        GROUP=4, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_G=16, BLOCK_D=64, BLOCK_N=64, DIRECT=False,
        DOT_PRECISION="tf32", SOFTCAP=False, PDL_TRIGGER=True))
    merge = _compile(da._decode_merge_kernel,
                     lambda n: {"po_ptr": "*fp32", "plse_ptr": "*fp32", "lens_ptr": "*i32", "out_ptr": "*bf16"}.get(n, "i32"),
                     dict(HEAD_DIM=64, BLOCK_S=16, BLOCK_D=64, PDL_TRIGGER=True))
    for name, kernel in (("norm", norm), ("silu", silu), ("split", split), ("merge", merge)):
        ptx = kernel.asm["ptx"]
        assert "griddepcontrol.launch_dependents" in ptx and "griddepcontrol.wait" not in ptx, name


@pytest.mark.parametrize(("norm", "residual"), [(False, False), (True, True), (True, False)])
def test_gemv_rope_kernel_compiles(norm: bool, residual: bool) -> None:
    """The qkv GEMV + rotary + KV write at 1B's shapes, alone or with the norm folded in; with PDL the weight
    load comes before the wait."""
    from graphpool.kernels import _triton_gemv as gv
    from graphpool.kernels import _triton_gemv_rope as gr

    constexprs = dict(K=2048, HQ=32, HKV=8, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_K=gv.MAX_BLOCK_K, HAS_BIAS=False,
                      NORM=norm, HAS_RESIDUAL=residual, PDL=True)  # fmt: skip
    ptx = _compile(gr._gemv_rope_kernel, _rope_types, constexprs, num_warps=gv.NUM_WARPS).asm["ptx"]
    _check_gemv_pdl(ptx, True)
    assert "st.global" in ptx.split("griddepcontrol.wait", 1)[1]
    assert ("rsqrt" in ptx) == norm


@pytest.mark.parametrize(("norm", "residual", "k"), [(False, False, 576), (True, True, 576), (True, False, 2048),
                                                     (False, False, 8192)])  # fmt: skip
def test_gemv_swiglu_kernel_compiles(norm: bool, residual: bool, k: int) -> None:
    """The gate/up GEMV + SwiGLU at SmolLM2's and 1B's widths (8192: the loop over tiles), alone or with the norm
    folded in; libdevice's exp, PDL as every GEMV's."""
    from graphpool.kernels import _triton_gemv as gv
    from graphpool.kernels import _triton_gemv_swiglu as gs

    constexprs = dict(K=k, BLOCK_K=min(gv.MAX_BLOCK_K, triton.next_power_of_2(k)), NORM=norm, HAS_RESIDUAL=residual,
                      LIBDEVICE_EXP=True, PDL=True)  # fmt: skip
    ptx = _compile(gs._gemv_swiglu_kernel, _norm_types, constexprs, num_warps=gv.NUM_WARPS).asm["ptx"]
    _check_gemv_pdl(ptx, True)
    assert ("rsqrt" in ptx) == norm and "ex2" in ptx
