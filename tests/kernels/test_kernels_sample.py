"""The decode step's sampling kernel (kernels/sample.py) in the Triton interpreter: temperature-0 rows are
torch's argmax (ties, NaN, -inf, widths past one block), sampled rows follow softmax(x / t) (a chi-square over
draws of distinct seeds), a seed draws the same token again; and its CPU dispatch and parameter packing.
The GPU twin (tests/gpu/test_sample_gpu.py) draws 20,000 rows per check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kernels_decode_attention import run_in_triton_interpreter

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


def test_params_pack_seeds_then_temperature_bits() -> None:
    packed = sample_params([7, 2**63 - 1], [0.0, 0.8])
    assert packed[:2] == [7, 2**63 - 1]
    bits = np.asarray(packed[2:], dtype=np.int64).astype(np.int32).view(np.float32)
    assert bits.tolist() == [0.0, pytest.approx(0.8)]


def test_dispatch_leaves_cpu_to_the_caller_and_refuses_bad_shapes() -> None:
    x = torch.randn(2, 5)
    assert sample_rows(x, torch.tensor(sample_params([1, 2], [1.0, 0.0]))) is None
    with pytest.raises(ValueError, match="rows, n >= 1"):
        sample_rows(torch.randn(3), torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"int64 params \[2 \* rows\]"):
        sample_rows(x, torch.zeros(3, dtype=torch.int64))
