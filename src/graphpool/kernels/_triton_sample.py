"""Triton sampling of a `[bs, vocab]` logits tensor in two launches (imported lazily: GPU only).

A row with temperature t > 0 takes argmax(x / t + G), G a Gumbel draw per entry from Philox keyed by the
row's seed (Gumbel-max: the distribution softmax(x / t), which the torch sampler draws from by its inverse
CDF); a row with t == 0 takes argmax(x), torch's index (the first maximum, a NaN as the
maximum). Stage 1, grid `(bs, cdiv(vocab, BLOCK))`, reduces BLOCK entries of a row to (max, first index,
first NaN); stage 2 is the row argmax's (`_triton_argmax`). The eager sampler launches about a dozen ops
and three host copies for the same draw; this is one host copy and two launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphpool.kernels._triton_argmax import reduce_rows, store_block_argmax

BLOCK = 1024


# NOTE: the row count varies with the batch: not specialized on, so one compile serves every batch size
@triton.jit(do_not_specialize=["n_rows"])
def _block_sample_kernel(x_ptr, params_ptr, val_ptr, idx_ptr, nan_ptr, stride_x, n_rows, n_cols, n_blocks,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=float("-inf")).to(tl.float32)
    seed = tl.load(params_ptr + row)
    temp = tl.load(params_ptr + n_rows + row).to(tl.int32).to(tl.float32, bitcast=True)
    if temp > 0:
        u = tl.rand(seed, offs)
        # NOTE: u == 0 gives -inf (never drawn); u < 1 always, so the draw is finite
        x = x / temp - tl.log(-tl.log(u))
    store_block_argmax(x, offs, mask, row * n_blocks + blk, val_ptr, idx_ptr, nan_ptr, BLOCK)


def sample_rows_triton(x: torch.Tensor, params: torch.Tensor, *, block: int = BLOCK) -> torch.Tensor:
    """`x [bs, n]` (n >= 1), `params` int64 `[2 * bs]` on x's device (each row's Philox seed, then each row's
    temperature as float32 bits) -> int64 `[bs]`: the sampled (t > 0) or argmax (t == 0) index of each row."""

    def stage1(x: torch.Tensor, vals: torch.Tensor, idxs: torch.Tensor, nans: torch.Tensor, n_blocks: int) -> None:
        bs = x.shape[0]
        _block_sample_kernel[(bs, n_blocks)](x, params, vals, idxs, nans, x.stride(0), bs, x.shape[1], n_blocks,
                                             BLOCK=block, num_warps=4)

    return reduce_rows(x, block, stage1)
