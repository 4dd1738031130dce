from __future__ import annotations

import pytest
import torch
from test_kernels_decode_attention import run_in_triton_interpreter

from graphpool.kernels.norm_rope import (
    add_rms_norm,
    add_rms_norm_ref,
    apply_rotary,
    apply_rotary_and_write_kv,
    apply_rotary_and_write_kv_ref,
    apply_rotary_ref,
    rms_norm,
    rms_norm_ref,
)


def test_rms_norm_ref_matches_float64_formula() -> None:
    x = torch.randn(4, 3, 64, dtype=torch.float64).float()
    w = torch.randn(64)
    out = rms_norm_ref(x, w, 1e-6)
    xd = x.double()
    expected = w.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_add_rms_norm_ref_returns_sum_and_norm_of_sum() -> None:
    x, r = torch.randn(5, 32, dtype=torch.bfloat16), torch.randn(5, 32, dtype=torch.bfloat16)
    w = torch.randn(32, dtype=torch.bfloat16)
    out, s = add_rms_norm_ref(x, r, w, 1e-5)
    assert torch.equal(s, x + r)
    assert torch.equal(out, rms_norm_ref(x + r, w, 1e-5))
    assert out.dtype == torch.bfloat16


def test_matches_the_model_layers() -> None:
    layers = pytest.importorskip("graphpool.model.layers")
    norm = layers.RMSNorm(48, 1e-5, torch.device("cpu"), torch.bfloat16)
    norm.weight.data.normal_()
    x = torch.randn(6, 48, dtype=torch.bfloat16)
    assert torch.equal(rms_norm_ref(x, norm.weight, 1e-5), norm(x))
    cos_sin = torch.outer(torch.arange(50.0), torch.rand(8))
    q, k = torch.randn(5, 4, 16, dtype=torch.bfloat16), torch.randn(5, 2, 16, dtype=torch.bfloat16)
    pos = torch.tensor([0, 3, 49, 7, 7])
    c, s = cos_sin.cos(), cos_sin.sin()
    expected_q = layers._rotate(q, c[pos].unsqueeze(1), s[pos].unsqueeze(1))
    assert torch.equal(apply_rotary_ref(pos, q, k, c, s)[0], expected_q)


def test_rotary_ref_is_a_complex_rotation() -> None:
    tokens, dim = 7, 32
    q, k = torch.randn(tokens, 6, dim), torch.randn(tokens, 2, dim)
    angles = torch.rand(20, dim // 2, dtype=torch.float64) * 6.0
    pos = torch.randint(0, 20, (tokens,))
    q_rot, k_rot = apply_rotary_ref(pos, q, k, angles.cos().float(), angles.sin().float())
    for x, x_rot in ((q, q_rot), (k, k_rot)):
        half = dim // 2
        z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(
            torch.ones_like(angles[pos]), angles[pos]
        ).unsqueeze(1)
        torch.testing.assert_close(x_rot.double(), torch.cat((z.real, z.imag), -1), rtol=1e-5, atol=1e-5)
    # norms are preserved: a rotation
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_rotary_and_write_kv_ref_writes_only_the_given_slots() -> None:
    tokens, hkv, dim, block_size = 4, 2, 16, 8
    q, k, v = torch.randn(tokens, 4, dim), torch.randn(tokens, hkv, dim), torch.randn(tokens, hkv, dim)
    cos, sin = torch.rand(10, dim // 2), torch.rand(10, dim // 2)
    pos = torch.tensor([1, 2, 3, 9])
    k_cache = torch.full((5, block_size, hkv, dim), 7.0)
    v_cache = torch.full((5, block_size, hkv, dim), 7.0)
    slots = torch.tensor([9, 17, 39, 0])
    q_rot, k_rot = apply_rotary_and_write_kv_ref(pos, q, k, v, cos, sin, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, hkv, dim), v_cache.view(-1, hkv, dim)
    assert torch.equal(flat_k[slots], k_rot) and torch.equal(flat_v[slots], v)
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert bool((flat_k[untouched] == 7.0).all()) and bool((flat_v[untouched] == 7.0).all())
    assert torch.equal(q_rot, apply_rotary_ref(pos, q, k, cos, sin)[0])


def test_dispatch_on_cpu_equals_reference() -> None:
    x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    assert torch.equal(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5))
    got, expected = add_rms_norm(x, r, w, 1e-5), add_rms_norm_ref(x, r, w, 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    cos, sin, pos = torch.rand(4, 4), torch.rand(4, 4), torch.tensor([0, 3])
    assert all(
        torch.equal(a, b)
        for a, b in zip(apply_rotary(pos, q, k, cos, sin), apply_rotary_ref(pos, q, k, cos, sin), strict=True)
    )
    kc, vc = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
    apply_rotary_and_write_kv(pos, q, k, v, cos, sin, kc, vc, torch.tensor([5, 6]))
    assert torch.equal(vc.view(-1, 2, 8)[5:7], v)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="weight"):
        rms_norm(torch.randn(2, 8), torch.randn(4), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), 1e-5)
    q, k = torch.randn(2, 4, 8), torch.randn(2, 2, 8)
    with pytest.raises(ValueError, match="cos/sin"):
        apply_rotary(torch.tensor([0, 1]), q, k, torch.rand(4, 8), torch.rand(4, 8))
    with pytest.raises(ValueError, match="positions"):
        apply_rotary(torch.tensor([0]), q, k, torch.rand(4, 4), torch.rand(4, 4))
    with pytest.raises(ValueError, match="slot_mapping"):
        apply_rotary_and_write_kv(
            torch.tensor([0, 1]), q, k, k.clone(), torch.rand(4, 4), torch.rand(4, 4),
            torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8), torch.tensor([1]),
        )  # fmt: skip


# NOTE: see test_kernels_decode_attention for why a subprocess and the interpreter patch.
_INTERP_SCRIPT = """
from graphpool.kernels import _triton_norm_rope as tn
from graphpool.kernels import norm_rope as nr

torch.manual_seed(0)
errors = []
for dt in (torch.float32, torch.float16):
    x = torch.randn(5, 3, 96, dtype=dt)
    r, w = torch.randn_like(x), torch.randn(96, dtype=dt)
    out, s = tn.rms_norm_triton(x, w, 1e-5, r)
    e_out, e_s = nr.add_rms_norm_ref(x, r, w, 1e-5)
    errors += [(out.float() - e_out.float()).abs().max().item(), (s.float() - e_s.float()).abs().max().item()]
    out, none = tn.rms_norm_triton(x[:, 1], w, 1e-5, None)  # a strided view
    errors.append((out.float() - nr.rms_norm_ref(x[:, 1], w, 1e-5).float()).abs().max().item())
    tokens, hq, hkv, d = 6, 7, 2, 64
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, dtype=dt)  # q, k, v are strided views of one projection
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, d)
    pos = torch.tensor([0, 5, 99, 5, 0, 0])
    cos, sin = torch.randn(100, d // 2), torch.randn(100, d // 2)
    slots = torch.tensor([3, 17, 31, 8, 0, 0])  # the last two: padded rows on the dummy slot
    kc = torch.zeros(4, 8, hkv, d, dtype=dt)
    vc = torch.zeros_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    got = (*tn.rotary_triton(pos, q, k, cos, sin, (v, kc, vc, slots)), kc[1:], vc[1:])
    want = (*nr.apply_rotary_and_write_kv_ref(pos, q, k, v, cos, sin, kc2, vc2, slots), kc2[1:], vc2[1:])
    errors += [(a.float() - b.float()).abs().max().item() for a, b in zip(got, want)]
    got = tn.rotary_triton(pos, q, k, cos, sin, None)
    errors += [(a.float() - b.float()).abs().max().item() for a, b in zip(got, want[:2])]
print(json.dumps(errors))
"""


def test_triton_kernels_in_interpreter_match_reference() -> None:
    pytest.importorskip("triton")
    errors = run_in_triton_interpreter(_INTERP_SCRIPT)
    assert len(errors) == 18
    assert all(e < 1e-3 for e in errors), errors
