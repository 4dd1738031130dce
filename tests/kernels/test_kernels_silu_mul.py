"""SwiGLU's silu(gate) * up: the torch reference, its dispatch and model wiring, the Triton kernel in the
interpreter, and its sm_90 compile (the IEEE division and libdevice exp that make it match torch on CUDA)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from test_kernels_decode_attention import run_in_triton_interpreter

from graphpool.kernels.silu_mul import silu_mul, silu_mul_ref, silu_mul_unchecked
from graphpool.model.config import ModelConfig


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values of the dtype lie between a and b (0: bitwise equal, +0 == -0)."""
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    sign = torch.iinfo(bits).min

    def ordinal(x: torch.Tensor) -> torch.Tensor:
        i = x.contiguous().view(bits).long()
        return torch.where(i < 0, sign - i, i)

    return (ordinal(a) - ordinal(b)).abs()


def test_ulp_distance_counts_representable_steps() -> None:
    x = torch.tensor([1.0, -2.0, 0.0, 3.0], dtype=torch.bfloat16)
    up = torch.nextafter(x, torch.full_like(x, float("inf")))
    assert ulp_distance(x, x).tolist() == [0, 0, 0, 0]
    assert ulp_distance(x, up).tolist() == [1, 1, 1, 1]
    assert ulp_distance(torch.tensor([0.0]), torch.tensor([-0.0])).item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_is_torch_silu_then_product_each_rounded(dtype: torch.dtype) -> None:
    x = (torch.randn(9, 2 * 37) * 4).to(dtype)
    gate, up = x.float()[:, :37], x.float()[:, 37:]
    # NOTE: the op order the Triton kernel copies: silu in fp32 rounded to the dtype, then the fp32 product.
    silu = torch.nn.functional.silu(gate).to(dtype).float()
    assert torch.equal(silu_mul_ref(x), (silu * up).to(dtype))
    exact = (gate.double() / (1 + torch.exp(-gate.double()))) * up.double()
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(silu_mul_ref(x).double(), exact, rtol=tol, atol=tol)


def test_reference_keeps_leading_dims_and_the_gate_first_layout() -> None:
    x = torch.randn(2, 3, 10)
    out = silu_mul_ref(x)
    assert out.shape == (2, 3, 5)
    assert torch.equal(out, torch.nn.functional.silu(x[..., :5]) * x[..., 5:])


def test_dispatch_on_cpu_is_the_reference_and_bad_input_raises() -> None:
    x = torch.randn(4, 12, dtype=torch.bfloat16)
    assert torch.equal(silu_mul(x), silu_mul_ref(x))
    assert torch.equal(silu_mul_unchecked(x), silu_mul_ref(x))
    with pytest.raises(ValueError, match="gate then up"):
        silu_mul(torch.randn(4, 7))
    with pytest.raises(ValueError, match="gate then up"):
        silu_mul(torch.tensor(1.0))
    with pytest.raises(ValueError, match="floating-point"):
        silu_mul(torch.ones(2, 4, dtype=torch.int32))


def _tiny_config() -> ModelConfig:
    from graphpool.model.presets import PRESETS

    return dataclasses.replace(
        PRESETS["llama3.2-1b"], num_layers=1, vocab_size=64, hidden_size=32, intermediate_size=48,
        num_heads=2, num_kv_heads=1, head_dim=16, bos_token_id=1, eos_token_ids=(2,),
    )  # fmt: skip


def test_swiglu_runs_the_ops_silu_mul_on_the_gate_up_output() -> None:
    from graphpool.model.layers import SwiGLU
    from graphpool.model.ops import TORCH_OPS

    cfg = _tiny_config()
    seen: list[torch.Size] = []

    def recording(h: torch.Tensor) -> torch.Tensor:
        seen.append(h.shape)
        return torch.zeros(*h.shape[:-1], h.shape[-1] // 2, dtype=h.dtype)

    mlp = SwiGLU(cfg, torch.device("cpu"), torch.float32, dataclasses.replace(TORCH_OPS, silu_mul=recording))
    for p in mlp.parameters():
        p.normal_()
    x = torch.randn(3, cfg.hidden_size)
    assert torch.equal(mlp(x), torch.zeros(3, cfg.hidden_size))  # down_proj of the op's zeros
    assert seen == [torch.Size([3, 2 * cfg.intermediate_size])]
    # the default (torch) op is the unfused formula, bitwise
    mlp.ops = TORCH_OPS
    gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
    assert torch.equal(mlp(x), mlp.down_proj(torch.nn.functional.silu(gate) * up))
    assert TORCH_OPS.silu_mul is silu_mul_unchecked


def test_the_triton_op_set_uses_the_fused_kernel() -> None:
    from graphpool.model.ops import kernel_ops

    assert kernel_ops().silu_mul is silu_mul


def test_llama_layers_get_the_models_ops() -> None:
    from graphpool.model.llama import LlamaModel
    from graphpool.model.ops import kernel_ops

    ops = kernel_ops()
    model = LlamaModel(_tiny_config(), ops=ops)
    assert all(layer.mlp.ops is ops for layer in model.layers)


# NOTE: on top of the decode-attention prelude, two fixes of triton 3.6's interpreter: its float32 -> bfloat16
# cast truncates (the GPU rounds to nearest even), so the bf16 casts go through torch here; and it has no
# libdevice, so the kernel's exp is tl.exp (numpy's) under the interpreter. torch's CPU silu uses its own exp,
# so in fp32 and fp16 the kernel may differ from the reference by an ulp (stated and asserted below).
_INTERP_SCRIPT = """
import numpy as np
import triton.language as tl

_cast = interp.InterpreterBuilder.cast_impl

def _cast_rtne(self, src, dst_type):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        data = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.int16).numpy()
        return interp.TensorHandle(data.view(np.uint16), dst_type.scalar)
    return _cast(self, src, dst_type)

interp.InterpreterBuilder.cast_impl = _cast_rtne

from graphpool.kernels._triton_silu_mul import silu_mul_triton
from graphpool.kernels.silu_mul import silu_mul_ref
from test_kernels_silu_mul import ulp_distance

torch.manual_seed(0)
results = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for tokens in (1, 7, 64):
        # I = 1000: not a multiple of the 256 or default 1024 block; 1536: a full and a partial default block
        for inter, block in ((1000, 256), (1000, None), (1536, None), (3, None)):
            x = (torch.randn(tokens, 2 * inter) * 4).to(dtype)
            x[0, :4] = torch.tensor([0.0, -90.0, 90.0, -0.0])  # exp over/underflow, signed zeros
            out = silu_mul_triton(x, block=block)
            ref = silu_mul_ref(x)
            assert out.shape == ref.shape and out.dtype == ref.dtype
            d = ulp_distance(out, ref)
            results.append([str(dtype), tokens, inter, int(d.max()), float((d == 0).float().mean())])
# leading dims, a strided row view (no copy), an empty batch
wide = torch.randn(5, 2 * 300 + 64)
view = wide[:, : 2 * 300]
d = ulp_distance(silu_mul_triton(view), silu_mul_ref(view))
results.append(["strided", 5, 300, int(d.max()), float((d == 0).float().mean())])
x3 = torch.randn(2, 3, 2 * 40)
out3 = silu_mul_triton(x3)
assert out3.shape == (2, 3, 40)
d = ulp_distance(out3, silu_mul_ref(x3))
results.append(["3d", 6, 40, int(d.max()), float((d == 0).float().mean())])
assert silu_mul_triton(torch.randn(0, 16)).shape == (0, 8)
print(json.dumps(results))
"""


def test_triton_kernel_in_interpreter_matches_reference() -> None:
    pytest.importorskip("triton")
    results = run_in_triton_interpreter(_INTERP_SCRIPT)
    assert len(results) == 3 * 3 * 4 + 2
    for dtype, tokens, inter, max_ulp, equal in results:
        # torch's CPU exp vs numpy's: an fp32 ulp of the silu can move its 16-bit rounding by one ulp, which
        # the product carries as up to two output ulps; in fp32 up to 4 seen (limit 8). Mostly bitwise.
        limit = {"torch.bfloat16": 2, "torch.float16": 2}.get(dtype, 8)
        assert max_ulp <= limit, (dtype, tokens, inter, max_ulp)
        assert equal >= (0.99 if dtype == "torch.bfloat16" else 0.5), (dtype, tokens, inter, equal)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_kernel_compiles_for_sm90_with_ieee_division_and_libdevice_exp(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from graphpool.kernels import _triton_silu_mul as sm

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    types = {
        "x_ptr": f"*{dtype}",
        "out_ptr": f"*{dtype}",
        "stride_x": "i64",
        "stride_o": "i64",
        "n_cols": "i32",
    }

    def ptx(libdevice_exp: bool) -> str:
        constexprs = {"BLOCK": 1024, "LIBDEVICE_EXP": libdevice_exp, "PDL_TRIGGER": False}
        signature = {
            name: "constexpr" if name in constexprs else types[name] for name in sm._silu_mul_kernel.arg_names
        }
        source = ASTSource(sm._silu_mul_kernel, signature, constexprs=constexprs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]

    gpu = ptx(True)
    assert "div.rn.f32" in gpu and "div.full" not in gpu and "div.approx" not in gpu
    # libdevice's expf reduces the argument with fmas before ex2; tl.exp (the interpreter's) is one ex2
    assert re.search(r"fma\.rm", gpu) and not re.search(r"fma\.rm", ptx(False))
