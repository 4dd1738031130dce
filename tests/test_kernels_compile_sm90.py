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
        if name in ("bt_ptr", "lens_ptr", "locks_ptr"):
            return "*i32"
        if name in ("po_ptr", "plse_ptr"):
            return partials
        return "fp32" if name == "scale_log2" else "i32"

    return types


def _rope_types(name: str) -> str:
    if name in ("pos_ptr", "slot_ptr"):
        return "*i64"
    if name in ("cos_ptr", "sin_ptr"):
        return "*fp32"
    return "*bf16" if name.endswith("_ptr") else "i32"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize(("direct", "fused"), [(False, False), (False, True), (True, False)])
def test_decode_attention_kernels_compile(direct: bool, fused: bool) -> None:
    from graphpool.kernels import _triton_decode_attention as da

    types = _attn_types("*bf16" if direct else "*fp32")
    constexprs = dict(
        GROUP=4, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
        DIRECT=direct, DOT_PRECISION="tf32", FUSED_MERGE=fused, BLOCK_S=16, PDL_TRIGGER=direct,
        PDL_WAIT=fused, SPLIT_LOOP=False,
    )  # fmt: skip
    kernel = _compile(da._decode_split_kernel, types, constexprs)
    assert "mma" in kernel.asm["ptx"]  # the q.k and p.v products run on tensor cores
    if fused:  # the last split's merge: an acquire-release atomic on the counter, the partials read past L1
        ptx = kernel.asm["ptx"]
        assert "atom" in ptx and ".acq_rel" in ptx and ".cg" in ptx, [
            ln for ln in ptx.splitlines() if "atom" in ln
        ]
    if not direct and not fused:
        _compile(
            da._decode_merge_kernel,
            lambda n: {"po_ptr": "*fp32", "plse_ptr": "*fp32", "lens_ptr": "*i32", "out_ptr": "*bf16"}.get(
                n, "i32"
            ),
            dict(HEAD_DIM=128, BLOCK_S=16, BLOCK_D=128, PDL_TRIGGER=True, PDL_WAIT=False),
        )


def test_staged_split_loop_compiles() -> None:
    """The staged split loop (a program takes every P-th split below its row's length): the loop over splits
    around the loop over tiles, tensor-core products, PDL's wait before any global access."""
    from graphpool.kernels import _triton_decode_attention as da

    constexprs = dict(GROUP=4, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_G=16, BLOCK_D=64, BLOCK_N=64, DIRECT=False,
                      DOT_PRECISION="tf32", FUSED_MERGE=False, BLOCK_S=16, PDL_TRIGGER=True, PDL_WAIT=True,
                      SPLIT_LOOP=True)  # fmt: skip
    ptx = _compile(da._decode_split_kernel, _attn_types("*fp32"), constexprs).asm["ptx"]
    assert "mma" in ptx and "%nctaid.z" in ptx  # the stride over splits: the grid's third extent
    assert _waits_before_any_global_access(ptx)


def test_norm_and_rotary_kernels_compile() -> None:
    from graphpool.kernels import _triton_norm_rope as nr

    _compile(
        nr._rms_norm_kernel,
        _norm_types,
        dict(HAS_RESIDUAL=True, BLOCK=4096, PDL_TRIGGER=True, PDL_WAIT=False),
        num_warps=8,
    )

    constexprs = dict(
        HQ=32, HKV=8, HALF=64, BLOCK_HQ=32, BLOCK_HKV=8, BLOCK_HALF=64, BLOCK_SIZE=16, WRITE_KV=True,
        PDL_CHAIN=False,
    )
    _compile(nr._rotary_kernel, _rope_types, constexprs)


def test_argmax_kernels_compile() -> None:
    from graphpool.kernels import _triton_argmax as am

    def block_types(name: str) -> str:
        return {"x_ptr": "*bf16", "val_ptr": "*fp32", "idx_ptr": "*i64", "nan_ptr": "*i64"}.get(name, "i32")

    _compile(am._block_argmax_kernel, block_types, dict(BLOCK=am.BLOCK))
    rows_types = {"val_ptr": "*fp32", "idx_ptr": "*i64", "nan_ptr": "*i64", "out_ptr": "*i64"}
    _compile(am._rows_argmax_kernel, lambda n: rows_types.get(n, "i32"), dict(BLOCKS=128))


@pytest.mark.parametrize(("has_bias", "pdl"), [(False, False), (True, True)])
def test_gemv_kernel_compiles(has_bias: bool, pdl: bool) -> None:
    """The one-row GEMV; with PDL its first weight tile is loaded before griddepcontrol.wait, x after it."""
    from graphpool.kernels import _triton_gemv as gv

    constexprs = dict(K=2048, BLOCK_N=gv.BLOCK_N, BLOCK_K=gv.MAX_BLOCK_K, HAS_BIAS=has_bias, PDL=pdl, PDL_TRIGGER=pdl,
                      NORM=has_bias, HAS_RESIDUAL=has_bias, SWIGLU=False, LIBDEVICE_EXP=True)
    ptx = _compile(gv._gemv_kernel, _norm_types, constexprs, num_warps=gv.NUM_WARPS).asm["ptx"]
    assert ("griddepcontrol.wait" in ptx) == pdl
    if pdl:
        before, after = ptx.split("griddepcontrol.wait", 1)
        assert "ld.global" in before and "ld.global" in after


def test_pdl_trigger_compiles_in_only_when_on() -> None:
    from graphpool.kernels import _triton_norm_rope as nr

    def ptx(on: bool) -> str:
        return _compile(
            nr._rms_norm_kernel,
            _norm_types,
            dict(HAS_RESIDUAL=False, BLOCK=2048, PDL_TRIGGER=on, PDL_WAIT=False),
        ).asm["ptx"]

    assert "griddepcontrol.launch_dependents" in ptx(True)
    assert "griddepcontrol" not in ptx(False)


def _waits_before_any_global_access(ptx: str) -> bool:
    before = ptx.split("griddepcontrol.wait", 1)[0] if "griddepcontrol.wait" in ptx else ptx
    return "griddepcontrol.wait" in ptx and "ld.global" not in before and "st.global" not in before


def test_staged_pdl_chain_kernels_wait_before_touching_memory() -> None:
    """The staged PDL chain: each kernel launched with PDL waits before its first global load or store (a
    kernel that has not waited may run beside the one ahead of it)."""
    from graphpool.kernels import _triton_decode_attention as da
    from graphpool.kernels import _triton_norm_rope as nr
    from graphpool.kernels import _triton_silu_mul as sm

    norm = _compile(
        nr._rms_norm_kernel,
        _norm_types,
        dict(HAS_RESIDUAL=True, BLOCK=2048, PDL_TRIGGER=True, PDL_WAIT=True),
    )

    rope = _compile(nr._rotary_kernel, _rope_types, dict(HQ=32, HKV=8, HALF=32, BLOCK_HQ=32, BLOCK_HKV=8,
                                                         BLOCK_HALF=32, BLOCK_SIZE=16, WRITE_KV=True, PDL_CHAIN=True))
    silu = _compile(sm._silu_mul_kernel, lambda n: "*bf16" if n.endswith("_ptr") else "i32",
                    dict(BLOCK=1024, LIBDEVICE_EXP=True, PDL_TRIGGER=True, PDL_WAIT=True))

    split = _compile(da._decode_split_kernel, _attn_types("*fp32"), dict(
        GROUP=4, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_G=16, BLOCK_D=64, BLOCK_N=64, DIRECT=False,
        DOT_PRECISION="tf32", FUSED_MERGE=False, BLOCK_S=16, PDL_TRIGGER=True, PDL_WAIT=True, SPLIT_LOOP=False))
    merge = _compile(da._decode_merge_kernel,
                     lambda n: {"po_ptr": "*fp32", "plse_ptr": "*fp32", "lens_ptr": "*i32", "out_ptr": "*bf16"}.get(n, "i32"),
                     dict(HEAD_DIM=64, BLOCK_S=16, BLOCK_D=64, PDL_TRIGGER=True, PDL_WAIT=True))
    for name, kernel in (("norm", norm), ("rotary", rope), ("silu", silu), ("split", split), ("merge", merge)):
        ptx = kernel.asm["ptx"]
        assert _waits_before_any_global_access(ptx), name
        assert "griddepcontrol.launch_dependents" in ptx, name


def test_staged_silu_gemv_kernel_compiles() -> None:
    from graphpool.kernels import _triton_gemv as gv

    constexprs = dict(K=8192, BLOCK_N=gv.BLOCK_N, BLOCK_K=gv.MAX_BLOCK_K, HAS_BIAS=False, PDL=True, PDL_TRIGGER=False,
                      NORM=False, HAS_RESIDUAL=False, SWIGLU=True, LIBDEVICE_EXP=True)
    ptx = _compile(gv._gemv_kernel, _norm_types, constexprs, num_warps=gv.NUM_WARPS).asm["ptx"]
    assert "div.rn.f32" in ptx and "griddepcontrol.wait" in ptx  # IEEE division, as the SwiGLU kernel's


def test_staged_gemv_rope_kernel_compiles() -> None:
    """The qkv GEMV + rotary + KV write at 1B's shapes; with PDL the weight load comes before the wait."""
    from graphpool.kernels import _triton_gemv as gv
    from graphpool.kernels import _triton_gemv_rope as gr

    constexprs = dict(K=2048, HQ=32, HKV=8, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_K=gv.MAX_BLOCK_K, HAS_BIAS=False,
                      PDL=True)  # fmt: skip
    ptx = _compile(gr._gemv_rope_kernel, _rope_types, constexprs, num_warps=gv.NUM_WARPS).asm["ptx"]
    before, after = ptx.split("griddepcontrol.wait", 1)
    assert "ld.global" in before and "ld.global" in after and "st.global" in after
