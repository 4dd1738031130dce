"""GGML block formats dequantized with torch ops on the tensor's own device (the raw blocks travel, not floats).

Each function mirrors the `gguf` library's numpy `dequantize_blocks` operation for operation (float32, one rounding
per multiply and per add, no fused multiply-add), so its output is bit-identical to `gguf.quants.dequantize`;
tests/model/test_model_gguf_dequant.py holds every format here to that. Other formats go through the library.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType

Blocks = torch.Tensor  # uint8, (n_blocks, type_size)


def f16_at(blocks: Blocks, start: int) -> torch.Tensor:
    """The float16 scale at byte `start` of every block, as float32 (n_blocks, 1)."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _shifts(values: tuple[int, ...], blocks: Blocks) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=blocks.device)


def split_nibbles(qs: Blocks, group: int) -> torch.Tensor:
    """Each run of `group` bytes as its low nibbles then its high nibbles: (n, bytes // group, 2, group)."""
    q = qs.reshape(qs.shape[0], -1, 1, group) >> _shifts((0, 4), qs).reshape(1, 1, 2, 1)
    return q & 0x0F


def _bits(qh: Blocks, group: int, count: int, width: int) -> torch.Tensor:
    """Each run of `group` bytes as `count` fields of `width` bits, lowest first: (n, bytes // group, count, group)."""
    shifts = _shifts(tuple(range(0, count * width, width)), qh).reshape(1, 1, count, 1)
    return (qh.reshape(qh.shape[0], -1, 1, group) >> shifts) & ((1 << width) - 1)


def _q4_0(b: Blocks) -> torch.Tensor:
    q = split_nibbles(b[:, 2:], 16).reshape(b.shape[0], -1).to(torch.int8) - 8
    return f16_at(b, 0) * q.float()


def _q4_1(b: Blocks) -> torch.Tensor:
    q = split_nibbles(b[:, 4:], 16).reshape(b.shape[0], -1).float()
    return (f16_at(b, 0) * q) + f16_at(b, 2)


def _q5(b: Blocks, qh_at: int) -> torch.Tensor:
    """The 5-bit values of Q5_0 / Q5_1: low nibbles from `qs`, the fifth bit from the 32-bit mask `qh`."""
    n = b.shape[0]
    qh = _bits(b[:, qh_at : qh_at + 4], 1, 8, 1).reshape(n, 32)  # value j: bit j of the little-endian word
    ql = split_nibbles(b[:, qh_at + 4 :], 16).reshape(n, -1)
    return ql | (qh << 4)


def _q5_0(b: Blocks) -> torch.Tensor:
    q = _q5(b, 2).to(torch.int8) - 16
    return f16_at(b, 0) * q.float()


def _q5_1(b: Blocks) -> torch.Tensor:
    return (f16_at(b, 0) * _q5(b, 4).float()) + f16_at(b, 2)


def _q8_0(b: Blocks) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * f16_at(b, 0)


def _q2_k(b: Blocks) -> torch.Tensor:
    n = b.shape[0]
    scales, qs = b[:, : QK_K // 16], b[:, QK_K // 16 : QK_K // 16 + QK_K // 4]
    dl = (f16_at(b, 80) * (scales & 0x0F).float()).reshape(n, QK_K // 16, 1)
    ml = (f16_at(b, 82) * (scales >> 4).float()).reshape(n, QK_K // 16, 1)
    q = _bits(qs, 32, 4, 2).reshape(n, QK_K // 16, 16).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b: Blocks) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, scales = b[:, :32], b[:, 32:96], b[:, 96:108]
    low = _bits(scales[:, :8], 8, 2, 4).reshape(n, 16)
    high = _bits(scales[:, 8:], 4, 4, 2).reshape(n, 16)
    sc = ((low | (high << 4)).to(torch.int8) - 32).float()
    dl = (f16_at(b, 108) * sc).reshape(n, 16, 1)
    ql = _bits(qs, 32, 4, 2).reshape(n, 16, QK_K // 16)
    qh = _bits(hmask, 32, 8, 1).reshape(n, 16, QK_K // 16) ^ 1  # a set mask bit means no offset
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float()
    return (dl * q).reshape(n, QK_K)


def _k_scale_min(scales: Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: the eight 6-bit scales and mins packed into 12 bytes."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def k_scales(b: Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    return (f16_at(b, 0) * sc.float()).reshape(n, -1, 1), (f16_at(b, 2) * mn.float()).reshape(n, -1, 1)


def _q4_k(b: Blocks) -> torch.Tensor:
    n = b.shape[0]
    d, dm = k_scales(b)
    q = split_nibbles(b[:, 16:], 32).reshape(n, -1, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(b: Blocks) -> torch.Tensor:
    n = b.shape[0]
    d, dm = k_scales(b)
    ql = split_nibbles(b[:, 48:], 32).reshape(n, -1, 32)
    qh = _bits(b[:, 16:48], 32, 8, 1).reshape(n, -1, 32)
    return (d * (ql | (qh << 4)).float() - dm).reshape(n, QK_K)


def _q6_k(b: Blocks) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, : QK_K // 2], b[:, QK_K // 2 : QK_K // 2 + QK_K // 4]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (f16_at(b, 208) * scales).reshape(n, QK_K // 16, 1)
    low = split_nibbles(ql, 64).reshape(n, -1, 32)
    high = _bits(qh, 32, 4, 2).reshape(n, -1, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, QK_K // 16, -1).float()
    return (d * q).reshape(n, QK_K)


_Q = GGMLQuantizationType
_BLOCKS: dict[GGMLQuantizationType, Callable[[Blocks], torch.Tensor]] = {
    _Q.Q4_0: _q4_0,
    _Q.Q4_1: _q4_1,
    _Q.Q5_0: _q5_0,
    _Q.Q5_1: _q5_1,
    _Q.Q8_0: _q8_0,
    _Q.Q2_K: _q2_k,
    _Q.Q3_K: _q3_k,
    _Q.Q4_K: _q4_k,
    _Q.Q5_K: _q5_k,
    _Q.Q6_K: _q6_k,
}
_PLAIN = {_Q.F32: torch.float32, _Q.F16: torch.float16, _Q.BF16: torch.bfloat16}
TORCH_TYPES: frozenset[GGMLQuantizationType] = frozenset(_BLOCKS) | frozenset(_PLAIN)


def dequantize(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    """float32 `shape` (row-major, the last dimension the GGUF's first) from the tensor's raw bytes (uint8, any
    device), computed where `raw` lies. `qtype` must be in `TORCH_TYPES`."""
    raw = raw.reshape(-1)
    if qtype in _PLAIN:
        return raw.view(_PLAIN[qtype]).float().reshape(shape)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if shape[-1] % block_size:
        raise ValueError(f"a {qtype.name} row of {shape[-1]} values is not a whole number of {block_size}-value blocks")
    return _BLOCKS[qtype](raw.reshape(-1, type_size)).reshape(shape)
