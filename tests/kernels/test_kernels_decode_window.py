"""Sliding windows (`window` > 0) in the decode attention (the torch reference, the model's torch op, the
Triton kernel in the interpreter) and the prefill attention: the query at position p attends to positions
max(0, p - window + 1) .. p, as transformers' sliding-window mask (kv_idx > q_idx - sliding_window)."""

from __future__ import annotations

import pytest
import torch
from test_kernels_decode_attention import make_case, run_in_triton_interpreter

from graphpool.kernels.decode_attention import paged_decode_attention_ref
from graphpool.model import attn_ops
from graphpool.model.attn_ops import paged_decode_attention_torch, prefill_attention


def naive_window(q, k_cache, v_cache, block_tables, context_lens, scale, window, softcap=0.0) -> torch.Tensor:
    """Float64, token by token: each row's last `window` context positions (all of them for 0)."""
    bs, num_heads, head_dim = q.shape
    block_size, group = k_cache.shape[1], num_heads // k_cache.shape[2]
    out = torch.zeros(bs, num_heads, head_dim, dtype=torch.float64)
    for b in range(bs):
        n = int(context_lens[b])
        ts = range(max(0, n - window) if window else 0, n)
        k = torch.stack([k_cache[int(block_tables[b, t // block_size]), t % block_size] for t in ts]).double()
        v = torch.stack([v_cache[int(block_tables[b, t // block_size]), t % block_size] for t in ts]).double()
        for h in range(num_heads):
            s = (k[:, h // group] @ q[b, h].double()) * scale
            s = softcap * torch.tanh(s / softcap) if softcap else s
            out[b, h] = torch.softmax(s, 0) @ v[:, h // group]
    return out


@pytest.mark.parametrize(("lens", "window", "softcap"), [
    ([1, 5, 8, 9, 40], 8, 0.0),  # shorter than, equal to, one past and far past the window
    ([100, 3, 64], 17, 0.0),  # a window across block boundaries
    ([50, 12], 1, 0.0),  # the current token only
    ([33, 20], 10, 2.0),  # with a soft cap
])
def test_reference_and_torch_op_attend_to_the_window(lens: list[int], window: int, softcap: float) -> None:
    q, k, v, bt, cl = make_case(lens, 8, 2, 32, 8, seed=window)
    want = naive_window(q, k, v, bt, cl, 0.3, window, softcap)
    ref = paged_decode_attention_ref(q, k, v, bt, cl, 0.3, 128, softcap, window)
    torch.testing.assert_close(ref.double(), want, rtol=1e-5, atol=1e-5)
    op = paged_decode_attention_torch(q, k, v, bt, cl, 0.3, 128, softcap, window)
    torch.testing.assert_close(op.double(), want, rtol=1e-5, atol=1e-5)
    full = paged_decode_attention_ref(q, k, v, bt, cl, 0.3, 128, softcap)
    past = [i for i, n in enumerate(lens) if n > window]
    assert (ref[past] - full[past]).abs().amax(dim=(1, 2)).min() > 1e-3  # every row past the window moved
    short = [i for i, n in enumerate(lens) if n <= window]
    torch.testing.assert_close(ref[short], full[short])


def test_torch_op_row_groups_keep_each_rows_window() -> None:
    """On the CPU the torch op groups rows by length (one gather per group): windows stay per row."""
    lens = [3000, 40, 2900, 7, 600]
    q, k, v, bt, cl = make_case(lens, 4, 2, 16, 16, seed=5)
    op = paged_decode_attention_torch(q, k, v, bt, cl, 0.25, 3072, window=24)
    torch.testing.assert_close(op.double(), naive_window(q, k, v, bt, cl, 0.25, 24), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [0, 20])
def test_torch_op_in_bfloat16_on_the_cpu_is_the_attention_within_its_rounding(window: int) -> None:
    """The CPU's bfloat16 path (torch's fused attention, a query head group as its rows) against float64 over
    the same bfloat16 inputs: within what rounding the output to bfloat16 allows."""
    q, k, v, bt, cl = make_case([70, 5, 33, 200], 9, 3, 64, 16, dtype=torch.bfloat16, seed=3)
    op = paged_decode_attention_torch(q, k, v, bt, cl, 0.125, 256, window=window)
    assert op.dtype == torch.bfloat16
    want = naive_window(q, k, v, bt, cl, 0.125, window)
    torch.testing.assert_close(op.double(), want, rtol=2**-7, atol=2**-7)


@pytest.mark.parametrize("window", [-1, 2.5, True])
def test_bad_window_is_refused(window: object) -> None:
    q, k, v, bt, cl = make_case([4], 2, 2, 8)
    with pytest.raises(ValueError, match="window"):
        paged_decode_attention_ref(q, k, v, bt, cl, 1.0, 16, 0.0, window)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        prefill_attention(q, q, q, [1], 1.0, window=window)  # type: ignore[arg-type]


def naive_prefill_window(q, k, v, seq_lens, scale, window, softcap=0.0) -> torch.Tensor:
    out = torch.zeros(q.shape, dtype=torch.float64)
    group, start = q.shape[1] // k.shape[1], 0
    for n in seq_lens:
        pos = torch.arange(n)
        hidden = (pos[None, :] > pos[:, None]) | (pos[None, :] <= pos[:, None] - window)
        for h in range(q.shape[1]):
            s = q[start:start + n, h].double() @ k[start:start + n, h // group].double().T * scale
            s = softcap * torch.tanh(s / softcap) if softcap else s
            out[start:start + n, h] = torch.softmax(s.masked_fill(hidden, float("-inf")), -1) @ v[
                start:start + n, h // group].double()
        start += n
    return out


@pytest.mark.parametrize("tile", [None, 5])  # 5: tiles of a few rows, each with its own first key
@pytest.mark.parametrize(("window", "softcap"), [(6, 0.0), (1, 0.0), (9, 1.5), (64, 0.0)])
def test_prefill_window_equals_float64(tile: int | None, window: int, softcap: float,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if tile is not None:
        monkeypatch.setattr(attn_ops, "_TILE_SCORES", tile * 4 * 2 * window)
    gen = torch.Generator().manual_seed(window)
    lens = [37, 1, 12]
    q, k, v = (torch.randn(sum(lens), h, 16, generator=gen) for h in (4, 2, 2))
    out = prefill_attention(q, k, v, lens, 0.5, softcap=softcap, window=window)
    torch.testing.assert_close(out.double(), naive_prefill_window(q, k, v, lens, 0.5, window, softcap),
                               rtol=1e-5, atol=1e-5)
    if window < 37:
        assert (out - prefill_attention(q, k, v, lens, 0.5, softcap=softcap)).abs().max() > 1e-3


_INTERP_SCRIPT = """
from test_kernels_decode_attention import make_case
from graphpool.kernels._triton_decode_attention import paged_decode_attention_triton
from graphpool.kernels.decode_attention import paged_decode_attention_ref

cases = [
    # lens, Hq, Hkv, D, block_size, bound, split_len, dtype, softcap, window
    ([1, 16, 17, 130, 200], 8, 2, 64, 16, 256, 64, torch.float32, 0.0, 40),  # splits wholly before the window
    ([1, 16, 17, 130, 200], 8, 2, 64, 16, 256, 256, torch.float32, 0.0, 40),  # one split: direct write
    ([0, 70, 129], 4, 4, 32, 8, 192, 64, torch.float16, 0.0, 64),  # a window of exactly one split
    ([90, 33], 8, 4, 32, 8, 128, 64, torch.float32, 3.0, 20),  # with a soft cap
    ([50, 9], 4, 2, 32, 4, 64, 64, torch.float32, 0.0, 1),  # the current token only
]
errors = []
for i, (lens, hq, hkv, d, bsz, bound, split, dtype, cap, window) in enumerate(cases):
    q, k, v, bt, cl = make_case(lens, hq, hkv, d, bsz, dtype=dtype, seed=i)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention_triton(q, k, v, bt, cl, d**-0.5, bound, out=out, split_len=split, softcap=cap,
                                  window=window)
    ref = paged_decode_attention_ref(q, k, v, bt, cl, d**-0.5, bound, cap, window)
    full = paged_decode_attention_ref(q, k, v, bt, cl, d**-0.5, bound, cap)
    errors.append([float((out.double() - r.double()).norm() / r.double().norm()) for r in (ref, full)])
print(json.dumps(errors))
"""


def test_triton_kernel_window_in_interpreter_matches_reference() -> None:
    """The kernel's window against the reference's, and far from full attention (a kernel ignoring it fails)."""
    pytest.importorskip("triton")
    errors = run_in_triton_interpreter(_INTERP_SCRIPT)
    assert len(errors) == 5
    assert all(e < 2e-3 for e, _ in errors), errors
    assert all(moved > 0.05 for _, moved in errors), errors
