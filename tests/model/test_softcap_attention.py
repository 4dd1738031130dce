"""Soft-capped attention (Gemma 2's attn_logit_softcapping) on the model's torch paths: the prefill attention
in tiles of query rows and the CPU decode attention equal a float64 reference, and each other."""

from __future__ import annotations

import pytest
import torch

from graphpool.kernels.decode_attention import paged_decode_attention_ref
from graphpool.model import attn_ops
from graphpool.model.attn_ops import paged_decode_attention_torch, prefill_attention


def _qkv(lens: list[int], hq: int, hkv: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    # scaled up so that scores reach |s| ~ 10: the caps below bend many of them
    return tuple(torch.randn(total, h, dim, generator=gen) * 2 for h in (hq, hkv, hkv))


def naive_causal(q, k, v, lens, scale, softcap) -> torch.Tensor:
    """Float64, one sequence and one query head at a time."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    start = 0
    for n in lens:
        for h in range(q.shape[1]):
            qs, ks, vs = (x[start:start + n, hh].double() for x, hh in ((q, h), (k, h // group), (v, h // group)))
            s = qs @ ks.T * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            out[start:start + n, h] = torch.softmax(s, -1) @ vs
        start += n
    return out


@pytest.mark.parametrize("tile", [None, 7])  # 7 query rows a tile of the 40-token sequence (uneven split)
@pytest.mark.parametrize(("hq", "hkv"), [(4, 2), (3, 3)])
def test_softcap_prefill_equals_float64(tile: int | None, hq: int, hkv: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if tile is not None:
        monkeypatch.setattr(attn_ops, "_TILE_SCORES", tile * hq * 40)
    lens = [40, 1, 13]
    q, k, v = _qkv(lens, hq, hkv, 16)
    out = prefill_attention(q, k, v, lens, 0.25, softcap=2.0)
    torch.testing.assert_close(out.double(), naive_causal(q, k, v, lens, 0.25, 2.0), rtol=1e-5, atol=1e-5)
    plain = prefill_attention(q, k, v, lens, 0.25)
    torch.testing.assert_close(plain.double(), naive_causal(q, k, v, lens, 0.25, 0.0), rtol=1e-5, atol=1e-5)
    assert (out - plain).abs().max() > 0.05  # the cap changed the result


def test_bad_softcap_is_refused_by_prefill() -> None:
    q, k, v = _qkv([4], 2, 2, 8)
    with pytest.raises(ValueError, match="softcap"):
        prefill_attention(q, k, v, [4], 0.25, softcap=-1.0)


def test_decode_rows_equal_the_prefill() -> None:
    """Every token of a prompt as a decode row over the paged cache (the engine's resumed-prefill form), on the
    CPU torch op and the kernels' reference: the soft-capped prefill's output row by row."""
    n, hq, hkv, dim, block = 21, 4, 2, 16, 4
    q, k, v = _qkv([n], hq, hkv, dim, seed=3)
    blocks = -(-n // block)
    k_cache = torch.zeros(1 + blocks, block, hkv, dim)
    v_cache = torch.zeros_like(k_cache)
    k_cache[1:].view(-1, hkv, dim)[:n] = k
    v_cache[1:].view(-1, hkv, dim)[:n] = v
    tables = torch.arange(1, blocks + 1, dtype=torch.int32).repeat(n, 1)
    lens = torch.arange(1, n + 1, dtype=torch.int32)
    want = prefill_attention(q, k, v, [n], 0.3, softcap=1.5)
    for decode in (paged_decode_attention_torch, paged_decode_attention_ref):
        got = decode(q, k_cache, v_cache, tables, lens, 0.3, n, softcap=1.5)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
