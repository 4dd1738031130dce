"""Triton kernels for RMSNorm (+ residual add) and rotary (+ KV cache write); imported lazily (GPU only).

One program per token row in both kernels: the rotary program covers every q and k head of its token, so a
layer's rope (and, fused, its two cache writes) is one launch instead of about ten small torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphpool.kernels.pdl import pdl_on, pdl_trigger


@triton.jit
def residual_sum(x, r):
    """``x + r`` in fp32, rounded to x's dtype, as ``x + residual`` in torch is."""
    return (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)


@triton.jit
def rms_norm_row(x, w_ptr, cols, mask, n_cols, eps):
    """fp32 ``w * rms_norm(x)`` of one row `x` (the activation dtype; the weight at `w_ptr + cols`, loaded after
    the statistics): fp32 statistics, the normed row rounded to x's dtype before the weight, as the torch
    reference. The norm kernel and the GEMVs' folded norm use it."""
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / n_cols
    h = (xf * tl.rsqrt(var + eps)).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    return w.to(tl.float32) * h.to(tl.float32)


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, rout_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL_TRIGGER: tl.constexpr,
):  # fmt: skip
    pdl_trigger(PDL_TRIGGER)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = residual_sum(x, tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0))
        tl.store(rout_ptr + row * stride_ro + cols, x, mask=mask)
    y = rms_norm_row(x, w_ptr, cols, mask, n_cols, eps)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, *, pdl: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`pdl`: trigger a PDL-launched kernel after this one, where the device has PDL (the ``pdl`` switch)."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    r2 = new_residual = None
    if residual is not None:
        r2 = residual.reshape(-1, hidden)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        new_residual = torch.empty_like(out)
    rows = x2.shape[0]
    if rows > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            x2, r2 if r2 is not None else x2, weight.contiguous(), out,
            new_residual if new_residual is not None else out,
            x2.stride(0), r2.stride(0) if r2 is not None else 0, out.stride(0),
            new_residual.stride(0) if new_residual is not None else 0,
            hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, PDL_TRIGGER=pdl_on(x.device, pdl),
            num_warps=min(16, max(1, block // 512)),
        )  # fmt: skip
    out = out.view(x.shape)
    return out, (new_residual.view(x.shape) if new_residual is not None else None)


@triton.jit
def rotate_pair(x1, x2, c, s):
    """The neox rotation of fp32 pairs ``(x1, x2)`` by ``(c, s)``, its contractions written out: left to the
    compiler, the same expressions became ``fma(s, x1, c * x2)`` here and ``fma(c, x2, s * x1)`` in the fused
    qkv kernel, one fp32 ulp apart at times, and so now and then one bf16 ulp."""
    return tl.fma(x1, c, -(x2 * s)), tl.fma(x2, c, x1 * s)


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, c, s, t, stride_st, stride_sh, stride_dt, stride_dh,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    heads = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, BLOCK_HALF)
    mask = (heads < NUM_HEADS)[:, None] & (offs < HALF)[None, :]
    src = src_ptr + t * stride_st + heads[:, None] * stride_sh + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    r1, r2 = rotate_pair(x1, x2, c[None, :], s[None, :])
    o1, o2 = r1.to(dst_ptr.dtype.element_ty), r2.to(dst_ptr.dtype.element_ty)
    dst = dst_ptr + t * stride_dt + heads[:, None] * stride_dh + offs[None, :]
    tl.store(dst, o1, mask=mask)
    tl.store(dst + HALF, o2, mask=mask)
    return o1, o2, heads, offs, mask


# NOTE: no variant per alignment of the step's metadata views (docs/kernels.md, "One compile per variant")
@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, stride_sin,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_vt, stride_vh,
    stride_kcb, stride_kco, stride_kch, stride_vcb, stride_vco, stride_vch,
    HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr, WRITE_KV: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    c = tl.load(cos_ptr + pos * stride_cos + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_sin + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr, qo_ptr, c, s, t, stride_qt, stride_qh, stride_qot, stride_qoh, HQ, HALF, BLOCK_HQ, BLOCK_HALF
    )
    k1, k2, heads, offs, mask = _rotate_heads(
        k_ptr, ko_ptr, c, s, t, stride_kt, stride_kh, stride_kot, stride_koh, HKV, HALF, BLOCK_HKV, BLOCK_HALF
    )
    if WRITE_KV:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        blk = slot // BLOCK_SIZE
        off = slot % BLOCK_SIZE
        kc = kc_ptr + blk * stride_kcb + off * stride_kco + heads[:, None] * stride_kch + offs[None, :]
        tl.store(kc, k1.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(kc + HALF, k2.to(kc_ptr.dtype.element_ty), mask=mask)
        vs = v_ptr + t * stride_vt + heads[:, None] * stride_vh + offs[None, :]
        vc = vc_ptr + blk * stride_vcb + off * stride_vco + heads[:, None] * stride_vch + offs[None, :]
        tl.store(vc, tl.load(vs, mask=mask, other=0.0).to(vc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc + HALF, tl.load(vs + HALF, mask=mask, other=0.0).to(vc_ptr.dtype.element_ty), mask=mask)


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def rotary_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_write: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated ``(q, k)``; with ``kv_write = (v, k_cache, v_cache, slot_mapping)`` also stores k_rot and v."""
    q, k, cos, sin = _unit_last(q), _unit_last(k), _unit_last(cos), _unit_last(sin)
    tokens, hq, dim = q.shape
    hkv = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if tokens == 0:
        return q_out, k_out
    if kv_write is not None:
        v, k_cache, v_cache, slots = kv_write
        v = _unit_last(v)
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
            raise ValueError("the Triton rotary kernel needs caches with a unit last stride")
        block_size = k_cache.shape[1]
        kc_strides, vc_strides = k_cache.stride()[:3], v_cache.stride()[:3]
    else:
        v, k_cache, v_cache, slots = k, k_out, k_out, positions  # placeholders, never touched
        block_size = 1
        kc_strides = vc_strides = (0, 0, 0)
    _rotary_kernel[(tokens,)](
        positions, q, k, cos, sin, q_out, k_out,
        v, k_cache, v_cache, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), v.stride(0), v.stride(1),
        *kc_strides, *vc_strides,
        HQ=hq, HKV=hkv, HALF=dim // 2,
        BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HKV=triton.next_power_of_2(hkv),
        BLOCK_HALF=triton.next_power_of_2(dim // 2), BLOCK_SIZE=block_size, WRITE_KV=kv_write is not None,
        num_warps=4,
    )  # fmt: skip
    return q_out, k_out
