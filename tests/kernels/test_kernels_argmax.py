"""The decode step's row argmax (kernels/argmax.py): torch.argmax's index — the first maximum, a NaN as the maximum —
from the two Triton launches in the interpreter, over ties within and across blocks, NaN and -inf rows, widths
that are no multiple of the block, and every float dtype; its dispatch; its sm_90 compile is in
test_kernels_compile_sm90.py."""

from __future__ import annotations

import pytest
import torch
from test_kernels_decode_attention import run_in_triton_interpreter

from graphpool.kernels.argmax import argmax_rows

_SCRIPT = """
from graphpool.kernels._triton_argmax import argmax_rows_triton

gen = torch.Generator().manual_seed(0)
bad = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for bs, n, block in ((1, 1, 16), (3, 1000, 64), (5, 4099, 1024), (2, 300, 16)):
        x = (torch.randn(bs, n, generator=gen) * 3).to(dtype)
        if n >= 300:
            x[0, :] = 1.0  # all tied: index 0
            x[1 % bs, 7] = x[1 % bs, n - 2] = 50.0  # a tie across blocks: the first
            x[-1, 5] = float("nan")  # a NaN is the maximum
            x[-1, n - 1] = float("nan")
        cases = [x, torch.full((2, n), float("-inf"), dtype=dtype)]
        for c in cases:
            got = argmax_rows_triton(c, block=block)
            want = c.argmax(dim=-1)
            if not torch.equal(got, want):
                bad.append([str(dtype), bs, n, block, got.tolist(), want.tolist()])
    empty = argmax_rows_triton(torch.empty(0, 10, dtype=dtype), block=16)
    if empty.shape != (0,) or empty.dtype != torch.int64:
        bad.append(["empty", str(dtype)])
print(json.dumps(bad))
"""


def test_triton_argmax_is_torchs_in_the_interpreter() -> None:
    assert run_in_triton_interpreter(_SCRIPT) == []


def test_dispatch_is_torch_off_cuda_and_refuses_bad_shapes() -> None:
    """Off CUDA the rows' max indices, which are torch.argmax's over the same ties, NaN and -inf rows."""
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = (torch.randn(6, 4099, generator=gen) * 3).to(dtype)
        x[0, :] = 1.0
        x[1, 7] = x[1, 4000] = 50.0
        x[2, 5] = x[2, 4098] = float("nan")
        x[3, :] = float("-inf")
        x[4, 100:] = torch.randint(0, 2, (3999,), generator=gen).to(dtype) + 10  # many ties at the maximum
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
        assert argmax_rows(x)[:5].tolist() == [0, 7, 5, 0, int((x[4] == 11).nonzero()[0])]
    with pytest.raises(ValueError, match="rows, n >= 1"):
        argmax_rows(torch.randn(4))
    with pytest.raises(ValueError, match="rows, n >= 1"):
        argmax_rows(torch.randn(2, 0))
