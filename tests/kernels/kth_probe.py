"""A probe kernel for the interpreter tests: the draw's k-th-largest search (`_kth_largest`) alone, a row a
program."""

import triton
import triton.language as tl

from graphpool.kernels._triton_sample import _kth_largest


@triton.jit
def kth_kernel(x_ptr, k_ptr, out_ptr, n_cols, ROW_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    tl.store(out_ptr + row, _kth_largest(x_ptr + row * n_cols, 1.0, tl.load(k_ptr + row), n_cols, ROW_BLOCK))
