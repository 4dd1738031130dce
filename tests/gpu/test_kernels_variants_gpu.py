"""A step's metadata (context lengths, block tables, positions, KV slots, the draw's parameters) reaches the
Triton kernels as views into staged buffers, at offsets that change with the batch. Triton specializes a
pointer argument on 16-byte alignment unless told not to, so each new alignment was a JIT compile (~0.5 s)
in the middle of serving. These run each kernel on aligned metadata, then on the same values 4 or 8 bytes
past a 16-byte boundary: the same bits, and no new compiled variant."""

from __future__ import annotations

from collections.abc import Callable

import torch
from test_kernels_gpu import make_case

from graphpool.kernels._triton_attention_merge import _decode_merge_kernel
from graphpool.kernels._triton_decode_attention import _decode_split_kernel
from graphpool.kernels._triton_gemv_rope import _gemv_rope_kernel, gemv_rope_triton
from graphpool.kernels._triton_norm_rope import _rotary_kernel
from graphpool.kernels._triton_sample import _block_sample_kernel, _rows_sample_kernel
from graphpool.kernels.decode_attention import paged_decode_attention
from graphpool.kernels.norm_rope import apply_rotary_and_write_kv
from graphpool.kernels.sample import sample_params, sample_rows


def _variants(*kernels: object) -> int:
    """Compiled variants held by the kernels' in-process caches, over every device."""
    return sum(len(cache[0]) for k in kernels for cache in k.device_caches.values())  # type: ignore[attr-defined]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in a view one element past a 16-byte boundary (as a view into a staged buffer can be)."""
    buf = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


def _same_bits_no_compile(kernels: tuple[object, ...], run: Callable[[bool], list[torch.Tensor]]) -> None:
    aligned = run(False)
    torch.cuda.synchronize()
    before = _variants(*kernels)
    shifted = run(True)
    torch.cuda.synchronize()
    assert _variants(*kernels) == before, "a misaligned metadata view compiled a new variant"
    for a, b in zip(aligned, shifted, strict=True):
        assert torch.equal(a, b)


def test_attention_metadata_at_any_offset() -> None:
    q, k, v, bt, cl = make_case([5, 17, 300], 32, 8, 64)

    def run(shift: bool) -> list[torch.Tensor]:
        bt_, cl_ = (_misaligned(bt), _misaligned(cl)) if shift else (bt, cl)
        return [paged_decode_attention(q, k, v, bt_, cl_, 0.125, 1024)]

    _same_bits_no_compile((_decode_split_kernel, _decode_merge_kernel), run)


def test_rotary_and_gemv_rope_positions_and_slots_at_any_offset() -> None:
    hq, hkv, dim, kdim, tokens = 32, 8, 64, 2048, 3
    gen = torch.Generator(device="cuda").manual_seed(0)
    freqs = torch.outer(torch.arange(4096.0), 500000.0 ** -(torch.arange(0, dim, 2) / dim)).cuda()
    cos, sin = freqs.cos(), freqs.sin()
    pos = torch.tensor([3, 700, 4000], device="cuda")
    slots = torch.tensor([17, 40, 101], device="cuda")
    qkv = torch.randn(tokens, (hq + 2 * hkv) * dim, device="cuda", generator=gen).bfloat16()
    w = (torch.randn((hq + 2 * hkv) * dim, kdim, device="cuda", generator=gen) / kdim**0.5).bfloat16()
    x = torch.randn(1, kdim, device="cuda", generator=gen).bfloat16()

    def rotary(shift: bool) -> list[torch.Tensor]:
        p, s = (_misaligned(pos), _misaligned(slots)) if shift else (pos, slots)
        kc, vc = (torch.zeros(8, 16, hkv, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        q3, k3, v3 = qkv.split((hq * dim, hkv * dim, hkv * dim), -1)
        qr, kr = apply_rotary_and_write_kv(p, q3.view(tokens, hq, dim), k3.view(tokens, hkv, dim),
                                           v3.view(tokens, hkv, dim), cos, sin, kc, vc, s)  # fmt: skip
        return [qr, kr, kc, vc]

    def fused(shift: bool) -> list[torch.Tensor]:
        p, s = (_misaligned(pos[:1]), _misaligned(slots[:1])) if shift else (pos[:1].clone(), slots[:1].clone())
        kc, vc = (torch.zeros(8, 16, hkv, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        return [gemv_rope_triton(x, w, None, p, cos, sin, kc, vc, s, (hq, hkv, dim)), kc, vc]

    _same_bits_no_compile((_rotary_kernel,), rotary)
    _same_bits_no_compile((_gemv_rope_kernel,), fused)


def test_draw_parameters_at_any_offset() -> None:
    logits = torch.randn(3, 50000, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    packed = sample_params([1, 2, 3], [0.7, 0.0, 1.0], [0, 40, 0], [0.9, 1.0, 1.0], [0.0, 0.0, 0.05])
    params = torch.tensor(packed, dtype=torch.int64, device="cuda")

    def run(shift: bool) -> list[torch.Tensor]:
        out = sample_rows(logits, _misaligned(params) if shift else params)
        assert out is not None
        return [out]

    _same_bits_no_compile((_block_sample_kernel, _rows_sample_kernel), run)
