"""Fused RMSNorm (+ residual add) and rotary embedding (+ KV cache write), each with a torch reference.

Semantics follow the Llama reference models: the residual add in the activation dtype; RMSNorm statistics in
float32, the normalized row rounded to the activation dtype before the weight multiplies it; neox-style
(half-split) rotary over a float32 cos/sin cache ``[max_positions, head_dim // 2]``, computed in float32.
All functions are CUDA-graph capturable (no host syncs; outputs sized from input shapes).
"""

from __future__ import annotations

import torch

from graphpool.kernels._dispatch import triton_impl


def _check_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(residual.shape)}, {residual.dtype}"
        )


def rms_norm_unchecked(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The RMSNorm formula without input checks (the model's torch ops call it every layer, every step). A
    float32 weight (Gemma's 1 + w) multiplies in float32 and the product is rounded to x's dtype, as the
    kernel does; a weight in x's dtype multiplies in it (the cast is then a no-op)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h.to(x.dtype)).to(x.dtype)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_norm(x, weight, None)
    return rms_norm_unchecked(x, weight, eps).to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual``; returns ``(rms_norm(s), s)``."""
    _check_norm(x, weight, residual)
    s = x + residual
    return rms_norm_ref(s, weight, eps), s


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, pdl: bool = True) -> torch.Tensor:
    """RMSNorm over the last dim of ``x [..., hidden]``: one Triton kernel on CUDA, the reference elsewhere;
    `pdl` (the ``pdl`` switch): the kernel lets a PDL-launched GEMV after it start early."""
    impl = triton_impl("_triton_norm_rope") if x.is_cuda else None
    if impl is None:
        return rms_norm_ref(x, weight, eps)
    _check_norm(x, weight, None)
    return impl.rms_norm_triton(x, weight, eps, None, pdl=pdl)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, pdl: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm in one kernel: returns ``(rms_norm(x + residual), x + residual)``; `pdl` as
    `rms_norm`'s."""
    impl = triton_impl("_triton_norm_rope") if x.is_cuda else None
    if impl is None:
        return add_rms_norm_ref(x, residual, weight, eps)
    _check_norm(x, weight, residual)
    out, new_residual = impl.rms_norm_triton(x, weight, eps, residual, pdl=pdl)
    assert new_residual is not None
    return out, new_residual


def _check_rope(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q, k must be [T, heads, head_dim], got {tuple(q.shape)} and {tuple(k.shape)}")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [T={q.shape[0]}], got {tuple(positions.shape)}")
    if q.shape[2] % 2 != 0 or cos.dim() != 2 or cos.shape[1] * 2 != q.shape[2] or cos.shape != sin.shape:
        raise ValueError(
            f"cos/sin must be [max_positions, {q.shape[2] // 2}], got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )


def rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of ``x [T, heads, D]`` by float32 ``cos, sin [T, 1, D/2]`` (no input checks)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def _rotary_unchecked(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    c = cos[positions].float().unsqueeze(1)  # [T, 1, D/2]
    s = sin[positions].float().unsqueeze(1)
    return rotate_ref(q, c, s), rotate_ref(k, c, s)


def apply_rotary_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_rope(positions, q, k, cos, sin)
    return _rotary_unchecked(positions, q, k, cos, sin)


def write_kv_ref(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store k, v ``[T, Hkv, D]`` at flat slots ``slot_mapping [T]`` int64 (in place, no input checks)."""
    heads, dim = k_cache.shape[-2:]
    k_cache.view(-1, heads, dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, heads, dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def rotary_and_write_kv_unchecked(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rotary_and_write_kv_ref` without input checks (the model's torch ops call it every layer)."""
    q_rot, k_rot = _rotary_unchecked(positions, q, k, cos, sin)
    write_kv_ref(k_cache, v_cache, slot_mapping, k_rot, v)
    return q_rot, k_rot


def apply_rotary_and_write_kv_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_rope(positions, q, k, cos, sin)
    return rotary_and_write_kv_unchecked(positions, q, k, v, cos, sin, k_cache, v_cache, slot_mapping)


def apply_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary on ``q [T, Hq, D]`` and ``k [T, Hkv, D]`` at ``positions [T]`` (one kernel on CUDA)."""
    impl = triton_impl("_triton_norm_rope") if q.is_cuda else None
    if impl is None:
        return apply_rotary_ref(positions, q, k, cos, sin)
    _check_rope(positions, q, k, cos, sin)
    return impl.rotary_triton(positions, q, k, cos, sin, None)


def apply_rotary_and_write_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary on q and k, and the rotated k and v stored at ``slot_mapping [T]`` (flat slots) of the caches.

    Caches are ``[num_blocks, block_size, Hkv, D]``; returns ``(q_rot, k_rot)``. One kernel on CUDA.
    """
    if v.shape != k.shape:
        raise ValueError(f"v must match k {tuple(k.shape)}, got {tuple(v.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"caches must be [num_blocks, block_size, {k.shape[1]}, {k.shape[2]}]")
    if slot_mapping.shape != (q.shape[0],):
        raise ValueError(f"slot_mapping must be [T={q.shape[0]}], got {tuple(slot_mapping.shape)}")
    impl = triton_impl("_triton_norm_rope") if q.is_cuda else None
    if impl is None:
        return apply_rotary_and_write_kv_ref(positions, q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    _check_rope(positions, q, k, cos, sin)
    return impl.rotary_triton(positions, q, k, cos, sin, (v, k_cache, v_cache, slot_mapping))
