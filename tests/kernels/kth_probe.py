"""A probe kernel for the interpreter tests: the draw's k-th-largest search (`_kth_largest`) alone, a row a
program."""

import triton
import triton.language as tl

from graphpool.kernels._triton_sample import _kth_largest, _kth_of_blocks, _unkey


@triton.jit
def kth_kernel(x_ptr, k_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, BLOCKS: tl.constexpr, ROW_BLOCK: tl.constexpr):
    """Each row's k-th largest as a float, searched from the k-th largest of its BLOCK-wide blocks' maxima (a
    row of at most BLOCKS blocks) up to +inf (above every non-NaN entry)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    offs = tl.arange(0, BLOCKS)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    blocks = tl.max(tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf")), 1)
    k = tl.load(k_ptr + row)
    lo = _kth_of_blocks(blocks, tl.arange(0, BLOCKS) * BLOCK < n_cols, k)
    key = _kth_largest(x_row, 1.0, k, lo, tl.full([], float("inf"), tl.float32), n_cols, ROW_BLOCK)
    tl.store(out_ptr + row, _unkey(key))
