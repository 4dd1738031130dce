"""Triton argmax over the rows of a `[bs, vocab]` tensor (imported lazily: GPU only).

torch's argmax of a decode step's logits takes far longer than its bytes need (docs/kernels.md). Two launches
instead: stage 1, grid
`(bs, cdiv(vocab, BLOCK))`, each program reduces BLOCK entries of a row to (max, its first index, the first
NaN's index); stage 2, grid `(bs,)`, reduces a row's blocks. torch's semantics: the first index of the
maximum, and a NaN counts as the maximum (its first index wins).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

BLOCK = 1024  # entries a stage-1 program reduces
NONE = tl.constexpr(2**62)  # "no index": above every real one


@triton.jit
def store_block_argmax(x, offs, mask, out, val_ptr, idx_ptr, nan_ptr, BLOCK: tl.constexpr):
    """Stage 1's reduction of one block of a row (`x` float32 at `offs`, `mask` the row's entries), stored at
    `out`: its maximum, that maximum's first index, and its first NaN's index (NONE where none)."""
    is_nan = mask & (x != x)
    m = tl.max(tl.where(is_nan, float("-inf"), x), 0)
    none = tl.full([BLOCK], NONE, tl.int64)
    first = tl.min(tl.where(mask & (x == m), offs.to(tl.int64), none), 0)
    first_nan = tl.min(tl.where(is_nan, offs.to(tl.int64), none), 0)
    tl.store(val_ptr + out, m)
    tl.store(idx_ptr + out, first)
    tl.store(nan_ptr + out, first_nan)


@triton.jit
def _block_argmax_kernel(x_ptr, val_ptr, idx_ptr, nan_ptr, stride_x, n_cols, n_blocks, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=float("-inf")).to(tl.float32)
    store_block_argmax(x, offs, mask, row * n_blocks + blk, val_ptr, idx_ptr, nan_ptr, BLOCK)


@triton.jit
def reduce_blocks(val_ptr, idx_ptr, nan_ptr, base, offs, mask):
    """Stage 2's reduction of one row's blocks (stored from `base`, `mask` the row's `offs`): its index."""
    vals = tl.load(val_ptr + base + offs, mask=mask, other=float("-inf"))
    idxs = tl.load(idx_ptr + base + offs, mask=mask, other=NONE)
    nans = tl.load(nan_ptr + base + offs, mask=mask, other=NONE)
    m = tl.max(vals, 0)
    first = tl.min(tl.where(mask & (vals == m), idxs, NONE), 0)
    first_nan = tl.min(nans, 0)
    return tl.where(first_nan < NONE, first_nan, first)


@triton.jit
def _rows_argmax_kernel(val_ptr, idx_ptr, nan_ptr, out_ptr, n_blocks, BLOCKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCKS)
    tl.store(out_ptr + row, reduce_blocks(val_ptr, idx_ptr, nan_ptr, row * n_blocks, offs, offs < n_blocks))


def reduce_rows(x: torch.Tensor, block: int, stage1: Callable[..., None], stage2: Callable[..., None] | None = None,
                extra: int = 0) -> torch.Tensor:
    """The two stages' host side for `x [bs, n]` -> int64 `[bs]`: `stage1(x, vals, idxs, nans, n_blocks, *more)`
    launches the block kernel of grid `(bs, n_blocks)`, then `_rows_argmax_kernel` reduces each row's blocks, or
    `stage2(x, vals, idxs, nans, out, n_blocks, *more)` does; `more`: `extra` float32 `[bs, n_blocks]` buffers."""
    bs, n = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(bs, dtype=torch.int64, device=x.device)
    if bs == 0:
        return out
    n_blocks = triton.cdiv(n, block)
    # NOTE: separate allocations, not views of one: a view's start would move with the batch, and Triton
    # compiles anew for each pointer alignment it sees
    vals = torch.empty((bs, n_blocks), dtype=torch.float32, device=x.device)
    idxs = torch.empty((bs, n_blocks), dtype=torch.int64, device=x.device)
    nans = torch.empty((bs, n_blocks), dtype=torch.int64, device=x.device)
    more = [torch.empty((bs, n_blocks), dtype=torch.float32, device=x.device) for _ in range(extra)]
    stage1(x, vals, idxs, nans, n_blocks, *more)
    if stage2 is not None:
        stage2(x, vals, idxs, nans, out, n_blocks, *more)
    else:
        _rows_argmax_kernel[(bs,)](vals, idxs, nans, out, n_blocks, BLOCKS=triton.next_power_of_2(n_blocks),
                                   num_warps=4)
    return out


def argmax_rows_triton(x: torch.Tensor, *, block: int = BLOCK) -> torch.Tensor:
    """`x [bs, n]` (n >= 1) -> int64 `[bs]`: per row, torch.argmax(x, -1)'s index."""

    def stage1(x: torch.Tensor, vals: torch.Tensor, idxs: torch.Tensor, nans: torch.Tensor, n_blocks: int) -> None:
        _block_argmax_kernel[(x.shape[0], n_blocks)](x, vals, idxs, nans, x.stride(0), x.shape[1], n_blocks,
                                                     BLOCK=block, num_warps=4)

    return reduce_rows(x, block, stage1)
