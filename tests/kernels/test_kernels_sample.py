"""The decode step's sampling kernel (kernels/sample.py) in the Triton interpreter: temperature-0 rows are
torch's argmax (ties, NaN, -inf, widths past one block), sampled rows follow softmax(x / t) (a chi-square over
draws of distinct seeds), a seed draws the same token again; rows with top-k, top-p and min-p draw only kept
tokens (the torch draw's cut: top-p over the top-k's mass, ties at the k-th value) and, over a chi-square, in
their renormalised proportions; and its CPU dispatch and parameter packing. The GPU twin
(tests/gpu/test_sample_gpu.py) draws 20,000 rows per check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kernels_decode_attention import run_in_triton_interpreter

from graphpool.engine.draw import nucleus
from graphpool.kernels.sample import sample_params, sample_rows

_SCRIPT = """
from graphpool.kernels._triton_sample import sample_rows_triton
from graphpool.kernels.sample import sample_params

def params(seeds, temps):
    return torch.tensor(sample_params(seeds, temps), dtype=torch.int64)

gen = torch.Generator().manual_seed(0)
bad = []
for dtype in (torch.float32, torch.bfloat16):
    x = (torch.randn(4, 300, generator=gen) * 3).to(dtype)
    x[0, :] = 1.0  # all tied: index 0
    x[1, 7] = x[1, 290] = 50.0  # a tie across blocks: the first
    x[2, 5] = x[2, 299] = float("nan")  # a NaN is the maximum
    x[3, :] = float("-inf")
    got = sample_rows_triton(x, params([1, 2, 3, 4], [0.0] * 4), block=64)
    if not torch.equal(got, x.argmax(dim=-1)):
        bad.append(["greedy", str(dtype), got.tolist()])
row = torch.tensor([0.0, 0.5, 1.0, -0.5])
n = 400
x = row.expand(n, 4).contiguous()
tokens = sample_rows_triton(x, params(list(range(1, n + 1)), [0.7] * n), block=4)
again = sample_rows_triton(x[:50], params(list(range(1, 51)), [0.7] * 50), block=4)
counts = torch.bincount(tokens, minlength=4).tolist()
wide = torch.randn(3, 1000, generator=gen)
picks = [sample_rows_triton(wide, params([9, 9, 10], [1.0, 1.0, 1.0]), block=128).tolist() for _ in range(2)]
print(json.dumps({"bad": bad, "counts": counts, "same_again": torch.equal(again, tokens[:50]), "picks": picks}))
"""


def test_sampling_kernel_in_the_interpreter() -> None:
    out = run_in_triton_interpreter(_SCRIPT)
    assert out["bad"] == []
    expected = torch.softmax(torch.tensor([0.0, 0.5, 1.0, -0.5]) / 0.7, -1) * 400
    chi2 = float(((torch.tensor(out["counts"], dtype=torch.float32) - expected) ** 2 / expected).sum())
    assert chi2 < 16.3, (out["counts"], expected.tolist())  # 3 degrees of freedom, p = 0.001
    assert out["same_again"]
    first, second = out["picks"]
    assert first == second and first[0] == first[1]  # a seed draws the same token, whatever its row
    assert all(0 <= t < 1000 for t in first)


_CUT_SCRIPT = """
from graphpool.kernels._triton_sample import sample_rows_triton
from graphpool.kernels.sample import sample_params

gen = torch.Generator().manual_seed(1)
cuts = [(0, 0.6, 0.0), (3, 1.0, 0.0), (5, 0.5, 0.0), (0, 1.0, 0.2), (4, 0.9, 0.1), (1, 1.0, 0.0), (0, 1e-6, 0.0),
        (2, 0.99, 0.0), (0, 1.0, 1.0)]
rows = []
for i in range(36):
    x = torch.randn(21, generator=gen) * 2
    if i % 4 == 3:
        x[[2, 9, 17]] = x.max() - 0.5  # three tied values at the second place
    rows.append(x)
x = torch.stack(rows)
k, p, mp = (list(c) for c in zip(*[cuts[i % len(cuts)] for i in range(36)]))
temps = [0.7 if i % 5 else 1.3 for i in range(36)]
params = torch.tensor(sample_params(list(range(100, 136)), temps, k, p, mp))
CHI_CUTS = __CHI_CUTS__
picks = [sample_rows_triton(x, params, block=8, row_block=8).tolist(),
         sample_rows_triton(x[:9].half(), torch.tensor(sample_params(list(range(9)), temps[:9], k[:9], p[:9], mp[:9])),
                            block=8, row_block=8).tolist()]  # NOTE: one row of each cut in float16
row = torch.tensor([2.0, 1.6, 1.0, 0.2, -1.0, 0.5])
n = 120
chi = [sample_rows_triton(row.expand(n, 6).contiguous(),
                          torch.tensor(sample_params(list(range(n)), [1.0] * n, [top_k] * n, [top_p] * n, [0.0] * n)),
                          block=8, row_block=8).tolist() for top_k, top_p in CHI_CUTS]
print(json.dumps({"x": x.tolist(), "x16": x[:9].half().float().tolist(), "cuts": [k, p, mp], "temps": temps,
                  "picks": picks, "chi": chi}))
"""
CHI_CUTS = [(0, 0.85), (4, 0.8)]  # each keeps 4 and 3 of the row below: top-p alone, then of the top-k's mass


def _kept(row: torch.Tensor, k: int, p: float, min_p: float) -> set[int]:
    """The torch draw's kept tokens of one row (ties at the k-th value: every tied token may be the one kept)."""
    vals, ids, _ = nucleus(row[None], [k], [p], row.shape[0])
    kept = {int(i) for i, v in zip(ids[0], vals[0], strict=True) if v > float("-inf")}
    if min_p > 0:
        kept = {i for i in kept if torch.exp(row[i] - row.max()) >= min_p}
    if 0 < k < row.shape[0]:
        kth = row.sort(descending=True).values[k - 1]
        if any(row[i] == kth for i in kept):  # NOTE: the kept token at the k-th value may be any of its ties
            kept |= {i for i in range(row.shape[0]) if row[i] == kth}
    return kept


def test_cut_rows_draw_only_kept_tokens_in_their_proportions_in_the_interpreter() -> None:
    out = run_in_triton_interpreter(_CUT_SCRIPT.replace("__CHI_CUTS__", repr(CHI_CUTS)))
    k, p, mp = out["cuts"]
    for xs, picks in ((out["x"], out["picks"][0]), (out["x16"], out["picks"][1])):
        for i, (x, tok) in enumerate(zip(xs, picks, strict=True)):
            kept = _kept(torch.tensor(x) / out["temps"][i], k[i], p[i], mp[i])
            assert tok in kept, (i, tok, kept, (k[i], p[i], mp[i]))
    row = torch.tensor([2.0, 1.6, 1.0, 0.2, -1.0, 0.5])
    for (top_k, top_p), draws, size in zip(CHI_CUTS, out["chi"], (4, 3), strict=True):
        kept = sorted(_kept(row, top_k, top_p, 0.0))
        counts = torch.bincount(torch.tensor(draws), minlength=6).double()
        assert counts[[i for i in range(6) if i not in kept]].sum() == 0
        expected = torch.softmax(row[kept].double(), -1) * len(draws)
        chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
        # 3 and 2 degrees of freedom, p = 0.001
        assert len(kept) == size and chi2 < (16.3 if size == 4 else 13.8), (top_k, counts.tolist(), expected.tolist())


_LAYOUT_SCRIPT = """
from graphpool.kernels._triton_sample import sample_rows_triton
from graphpool.kernels.sample import sample_params

gen = torch.Generator().manual_seed(2)
n = 6
x = torch.randn(n, 300, generator=gen) * 2
seeds, temps = list(range(40, 40 + n)), [0.0, 0.7, 1.0, 0.0, 1.3, 0.5]
plain = sample_rows_triton(x, torch.tensor(sample_params(seeds, temps)), block=64)
every = sample_params(seeds, temps, [0] * n, [1.0] * n, [0.0] * n, every_cut=True)
cut = sample_rows_triton(x, torch.tensor(every), block=64)
# NOTE: a captured step's static input holds each row's five parameters together: transposed in the step
by_row = torch.tensor(every).view(5, n).t().contiguous()
moved = sample_rows_triton(x, by_row.t().reshape(-1), block=64)
print(json.dumps({"plain": plain.tolist(), "cut": cut.tolist(), "moved": moved.tolist()}))
"""


def test_the_cut_layout_without_cuts_draws_what_the_plain_one_does_in_the_interpreter() -> None:
    """A captured step draws with every cut column present (decode_step.decode_sampled, its parameters row by row
    and transposed): rows without a cut draw the very tokens of the two-column layout the sampler sends."""
    out = run_in_triton_interpreter(_LAYOUT_SCRIPT)
    assert out["plain"] == out["cut"] == out["moved"]


_KTH_SCRIPT = """
from kth_probe import kth_kernel

gen = torch.Generator().manual_seed(2)
rows = [torch.randn(37, generator=gen) * 4 for _ in range(6)]
rows[1][[3, 8, 30]] = rows[1].max()  # three tied at the top
rows[2][::2] = 0.0  # half the row one value
rows[2][[1, 5]] = -0.0
rows[3][[0, 7, 9]] = float("-inf")
rows[4][[2, 11]] = float("nan")
rows[5] = torch.full((37,), float("nan"))
x = torch.stack(rows).contiguous()
ks = [1, 2, 19, 37, 36, 5] + [3, 4, 20, 36, 37, 1]
x = torch.cat([x, x]).contiguous()
out = torch.empty(12)
kth_kernel[(12,)](x, torch.tensor(ks), out, 37, BLOCK=4, BLOCKS=16, ROW_BLOCK=16)
print(json.dumps({"x": x.tolist(), "k": ks, "kth": out.tolist()}))
"""


def test_kth_largest_by_bisection_in_the_interpreter() -> None:
    """The k-th largest y of each row (NaN left out), searched from its blocks' maxima up: ties, signed zeros,
    -inf, NaN, rows over several chunks, k both within and past the 10 blocks."""
    out = run_in_triton_interpreter(_KTH_SCRIPT)
    for row, k, got in zip(out["x"], out["k"], out["kth"], strict=True):
        values = sorted((v for v in row if v == v), reverse=True)
        if k <= len(values):  # NOTE: fewer non-NaN entries than k: only the row's draw matters (no cut found)
            assert got == values[k - 1], (k, got, values)


def test_params_pack_seeds_then_temperature_bits() -> None:
    packed = sample_params([7, 2**63 - 1], [0.0, 0.8])
    assert packed[:2] == [7, 2**63 - 1]
    bits = np.asarray(packed[2:], dtype=np.int64).astype(np.int32).view(np.float32)
    assert bits.tolist() == [0.0, pytest.approx(0.8)]
    assert sample_params([7, 8], [0.5, 0.8], [0, -1], [1.0, 1.0], [0.0, 0.0]) == sample_params([7, 8], [0.5, 0.8])
    cut = sample_params([7, 8], [0.5, 0.8], [0, 40], [0.9, 1.0], [0.0, 0.05])
    floats = np.asarray(cut[6:], dtype=np.int64).astype(np.int32).view(np.float32)
    assert cut[:4] == sample_params([7, 8], [0.5, 0.8]) and cut[4:6] == [0, 40]
    assert floats.tolist() == [pytest.approx(0.9), 1.0, 0.0, pytest.approx(0.05)]
    with pytest.raises(ValueError, match="together"):
        sample_params([7], [0.5], [3], None, [0.0])


def test_dispatch_leaves_cpu_to_the_caller_and_refuses_bad_shapes() -> None:
    x = torch.randn(2, 5)
    assert sample_rows(x, torch.tensor(sample_params([1, 2], [1.0, 0.0]))) is None
    with pytest.raises(ValueError, match="rows, n >= 1"):
        sample_rows(torch.randn(3), torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"int64 params \[2 \* rows\] or \[5 \* rows\]"):
        sample_rows(x, torch.zeros(3, dtype=torch.int64))
