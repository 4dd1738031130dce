"""Triton sampling of a `[bs, vocab]` logits tensor in two launches (imported lazily: GPU only).

A row with temperature t > 0 takes argmax(x / t + G), G a Gumbel draw per entry from Philox keyed by the
row's seed (Gumbel-max: the distribution softmax(x / t), which the torch sampler draws from by its inverse
CDF); a row with t == 0 takes argmax(x), torch's index (the first maximum, a NaN as the
maximum). Stage 1, grid `(bs, cdiv(vocab, BLOCK))`, reduces BLOCK entries of a row to (max, first index,
first NaN); stage 2 is the row argmax's (`_triton_argmax`). The eager sampler launches about a dozen ops
and three host copies for the same draw; this is one host copy and two launches.

Rows with a cut (top-k, top-p, min-p: each keeps the tokens whose y = x / t lies above some value, so their
meet does too) are drawn by rejection, with no sort: stage 1 also stores each block's max and exp-sum of y,
and stage 2 (one program a row) checks the Gumbel draw j against the cut in one pass over the row (how many
tokens lie above y_j, and their probability mass); a token outside is rejected with every token at or below
it, and the next draw is among the tokens above it (a fresh Gumbel draw over the row). That is a draw from
softmax(y) renormalised over the kept tokens, and the first draw is kept with probability at least top_p.
Where a row has both top-k and top-p, top-p takes the top-k's renormalised mass (the torch draw's order): the
k-th largest y is found first by bisection over y's order-preserving integer keys, from the k-th largest of the
blocks' maxima up.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphpool.kernels._triton_argmax import NONE, reduce_blocks, reduce_rows, store_block_argmax

BLOCK = 1024
ROW_BLOCK = 2048  # entries a stage-2 pass over a cut row takes at a time


@triton.jit
def _temperature(params_ptr, row, n_rows):
    return tl.load(params_ptr + n_rows + row).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _cut_of(params_ptr, row, n_rows, n_cols):
    """A row's (k, p, min_p): k = n_cols + 1 where top-k is off, p >= 1 where top-p is; and whether any is on."""
    k = tl.load(params_ptr + 2 * n_rows + row)
    p = tl.load(params_ptr + 3 * n_rows + row).to(tl.int32).to(tl.float32, bitcast=True)
    min_p = tl.load(params_ptr + 4 * n_rows + row).to(tl.int32).to(tl.float32, bitcast=True)
    has_k = (k > 0) & (k < n_cols)
    # NOTE: p off is inf, not 1: a rounded sum of the mass above a token must never reach it
    return tl.where(has_k, k, n_cols + 1), tl.where(p < 1, p, float("inf")), min_p, has_k | (p < 1) | (min_p > 0)


# NOTE: the row count varies with the batch: not specialized on, so one compile serves every batch size; nor the
# parameters' alignment (docs/kernels.md, "One compile per variant")
@triton.jit(do_not_specialize=["n_rows"], do_not_specialize_on_alignment=["params_ptr"])
def _block_sample_kernel(x_ptr, params_ptr, val_ptr, idx_ptr, nan_ptr, max_ptr, sum_ptr, stride_x, n_rows, n_cols,
                         n_blocks, BLOCK: tl.constexpr, CUT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=float("-inf")).to(tl.float32)
    seed = tl.load(params_ptr + row)
    temp = _temperature(params_ptr, row, n_rows)
    if temp > 0:
        x = x / temp
        if CUT:
            m = tl.max(x, 0)
            s = tl.sum(tl.where(mask & (x > float("-inf")), tl.exp(x - m), 0.0), 0)
            tl.store(max_ptr + row * n_blocks + blk, m)
            tl.store(sum_ptr + row * n_blocks + blk, s)
        u = tl.rand(seed, offs)
        # NOTE: u == 0 gives -inf (never drawn); u < 1 always, so the draw is finite
        x = x - tl.log(-tl.log(u))
    store_block_argmax(x, offs, mask, row * n_blocks + blk, val_ptr, idx_ptr, nan_ptr, BLOCK)


@triton.jit
def _key(y):
    """float32 -> int32 keys in y's order (-0.0 just below +0.0)."""
    bits = y.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _unkey(key):
    """`_key`'s inverse: the float32 of a key."""
    return tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _chunk(x_row, temp, start, n_cols, ROW_BLOCK: tl.constexpr):
    """A stage-2 pass's entries from `start`: their offsets, mask and y (-inf past the row)."""
    offs = start + tl.arange(0, ROW_BLOCK)
    mask = offs < n_cols
    return offs, mask, tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32) / temp


@triton.jit
def _bounds(key, valid, mid):
    """Over the valid keys: how many lie at or above mid, the least of those and the greatest below mid."""
    above = valid & (key >= mid)
    return (tl.sum(above.to(tl.int64), 0), tl.min(tl.where(above, key, 2**31), 0),
            tl.max(tl.where(valid & (key < mid), key, -(2**31) - 1), 0))


@triton.jit
def _narrow(lo, hi, k, count, least, greatest):
    """One bisection step (lo keeps count(key >= lo) >= k, hi count(key >= hi) < k), each end moved to the
    nearest key on its side: with bf16 ties the k-th largest rarely has exactly k at or above it, and the
    jumps end the search once no key lies between the ends."""
    if count >= k:
        lo = least
        if count == k:  # NOTE: exactly k at or above: the least of them is the k-th largest
            hi = least + 1
    else:
        hi = greatest + 1
    return lo, hi


@triton.jit
def _kth_of_blocks(bmax, valid, k):
    """The k-th largest key among the blocks' maxima (a lower bound of the row's k-th largest: they are k of
    its entries), the key of -inf where fewer than k blocks."""
    key = _key(bmax).to(tl.int64)
    valid = valid & (bmax == bmax)
    lo = _key(tl.full([], float("-inf"), tl.float32)).to(tl.int64)
    hi = tl.max(tl.where(valid, key, lo), 0) + 1
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        count, least, greatest = _bounds(key, valid, mid)
        lo, hi = _narrow(lo, hi, k, count, least, tl.maximum(greatest, lo))
    return lo


@triton.jit
def _kth_largest(x_row, temp, k, lo, m, n_cols, ROW_BLOCK: tl.constexpr):
    """The k-th largest y of a row (as a key) by bisection between `lo` (a key with at least k at or above it)
    and the row's max m, a pass over the row a step."""
    hi = _key(m).to(tl.int64) + 1
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        count = tl.zeros([], tl.int64)
        least = tl.full([], 2**31, tl.int64)
        greatest = lo
        for start in range(0, n_cols, ROW_BLOCK):
            _, mask, y = _chunk(x_row, temp, start, n_cols, ROW_BLOCK)
            c, lst, gst = _bounds(_key(y).to(tl.int64), mask & (y == y), mid)
            count += c
            least = tl.minimum(least, lst)
            greatest = tl.maximum(greatest, gst)
        lo, hi = _narrow(lo, hi, k, count, least, greatest)
    return lo


@triton.jit
def _above(x_row, temp, yj, m, n_cols, ROW_BLOCK: tl.constexpr):
    """How many tokens of a row lie above y_j, and their mass sum(exp(y - m))."""
    count = tl.zeros([], tl.int64)
    mass = tl.zeros([], tl.float32)
    for start in range(0, n_cols, ROW_BLOCK):
        _, mask, y = _chunk(x_row, temp, start, n_cols, ROW_BLOCK)
        gt = mask & (y > yj)
        count += tl.sum(gt.to(tl.int64), 0)
        mass += tl.sum(tl.where(gt, tl.exp(y - m), 0.0), 0)
    return count, mass


@triton.jit
def _draw_above(x_row, temp, seed, rnd, yj, floor, n_cols, ROW_BLOCK: tl.constexpr):
    """A Gumbel-max draw among the tokens above y_j and at or above `floor`: its index (-1 where none) and its y
    as this pass computed it (the next check compares against that value, so the loop climbs strictly)."""
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], -1, tl.int64)
    best_y = yj
    for start in range(0, n_cols, ROW_BLOCK):
        offs, mask, y = _chunk(x_row, temp, start, n_cols, ROW_BLOCK)
        u = tl.rand(seed, offs + rnd * n_cols)
        score = tl.where(mask & (y > yj) & (y >= floor), y - tl.log(-tl.log(u)), float("-inf"))
        m = tl.max(score, 0)
        first = tl.min(tl.where(score == m, offs.to(tl.int64), NONE), 0)
        if m > best:
            best = m
            best_idx = first
            best_y = tl.max(tl.where(offs.to(tl.int64) == first, y, float("-inf")), 0)
    return best_idx, best_y


@triton.jit(do_not_specialize=["n_rows"], do_not_specialize_on_alignment=["params_ptr"])
def _rows_sample_kernel(val_ptr, idx_ptr, nan_ptr, max_ptr, sum_ptr, x_ptr, params_ptr, out_ptr, stride_x, n_rows,
                        n_cols, n_blocks, BLOCKS: tl.constexpr, ROW_BLOCK: tl.constexpr):
    """Stage 2 where some row has a cut: the row argmax's reduction, then the cut rows' rejection."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCKS)
    mask = offs < n_blocks
    base = row * n_blocks
    j = reduce_blocks(val_ptr, idx_ptr, nan_ptr, base, offs, mask)
    temp = _temperature(params_ptr, row, n_rows)
    k, p, min_p, on = _cut_of(params_ptr, row, n_rows, n_cols)
    if (temp > 0) & on:
        bmax = tl.load(max_ptr + base + offs, mask=mask, other=float("-inf"))
        bsum = tl.load(sum_ptr + base + offs, mask=mask, other=0.0)
        m = tl.max(bmax, 0)
        z = tl.sum(tl.where(bmax > float("-inf"), bsum * tl.exp(bmax - m), 0.0), 0)
        x_row = x_ptr + row * stride_x
        if (k <= n_cols) & (p < 1):  # NOTE: top-p of the top-k's mass: the k largest ones'
            # NOTE: from the blocks' maxima, not -inf: the search then spans the few keys near the top
            tk = _kth_largest(x_row, temp, k, _kth_of_blocks(bmax, mask, k), m, n_cols, ROW_BLOCK)
            tau = _unkey(tk)
            count, mass = _above(x_row, temp, tau, m, n_cols, ROW_BLOCK)
            z = mass + (k - count).to(tl.float32) * tl.exp(tau - m)
        floor = tl.where(min_p > 0, m + tl.log(min_p), float("-inf"))
        seed = tl.load(params_ptr + row)
        yj = tl.load(x_row + j).to(tl.float32) / temp
        rnd = 1
        while rnd > 0:
            count, mass = _above(x_row, temp, yj, m, n_cols, ROW_BLOCK)
            if (count < k) & (mass < p * z) & (yj >= floor):
                rnd = 0
            else:  # NOTE: j and every token at or below it are out: draw again among those above
                nxt, y_nxt = _draw_above(x_row, temp, seed, rnd, yj, floor, n_cols, ROW_BLOCK)
                if nxt < 0:  # NOTE: none above (a row of NaN or -inf): j stays
                    rnd = 0
                else:
                    j = nxt
                    yj = y_nxt
                    rnd += 1
    tl.store(out_ptr + row, j)


def sample_rows_triton(x: torch.Tensor, params: torch.Tensor, *, block: int = BLOCK,
                       row_block: int = ROW_BLOCK) -> torch.Tensor:
    """`x [bs, n]` (n >= 1), `params` int64 `[2 * bs]` or `[5 * bs]` on x's device (`sample.sample_params`:
    each row's Philox seed, its temperature as float32 bits, then, where some row has a cut, each row's top-k and
    the float32 bits of its top-p and min-p) -> int64 `[bs]`: the drawn (t > 0) or argmax (t == 0) index of
    each row."""
    bs = x.shape[0]
    cut = params.shape[0] == 5 * bs

    def stage1(x: torch.Tensor, vals: torch.Tensor, idxs: torch.Tensor, nans: torch.Tensor, n_blocks: int,
               *sums: torch.Tensor) -> None:
        bmax, bsum = sums if cut else (vals, vals)  # NOTE: without a cut the kernel stores no block sums
        _block_sample_kernel[(bs, n_blocks)](x, params, vals, idxs, nans, bmax, bsum, x.stride(0), bs, x.shape[1],
                                             n_blocks, BLOCK=block, CUT=cut, num_warps=4)

    def stage2(x: torch.Tensor, vals: torch.Tensor, idxs: torch.Tensor, nans: torch.Tensor, out: torch.Tensor,
               n_blocks: int, bmax: torch.Tensor, bsum: torch.Tensor) -> None:
        _rows_sample_kernel[(bs,)](vals, idxs, nans, bmax, bsum, x, params, out, x.stride(0), bs, x.shape[1],
                                   n_blocks, BLOCKS=triton.next_power_of_2(n_blocks), ROW_BLOCK=row_block,
                                   num_warps=8)

    return reduce_rows(x, block, stage1, stage2, extra=2) if cut else reduce_rows(x, block, stage1)
