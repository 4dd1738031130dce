"""A probe kernel for the interpreter tests: the draw's k-th-largest search (`_kth_largest`) alone, a row a
program."""

import triton
import triton.language as tl

from graphpool.kernels._triton_sample import _kth_largest


@triton.jit
def kth_kernel(x_ptr, k_ptr, out_ptr, n_cols, ROW_BLOCK: tl.constexpr):
    """Each row's k-th largest as a float (its max is above every non-NaN entry: +inf serves)."""
    row = tl.program_id(0).to(tl.int64)
    top = tl.full([], float("inf"), tl.float32)
    key = _kth_largest(x_ptr + row * n_cols, 1.0, tl.load(k_ptr + row), top, n_cols, ROW_BLOCK)
    tl.store(out_ptr + row, tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.int32).to(tl.float32, bitcast=True))
