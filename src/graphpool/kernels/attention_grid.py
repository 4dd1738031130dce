"""The decode attention's launch shape, chosen on the host from ints only (kv heads, the length bound, the SM
count, the batch where the bits allow it), so a captured graph's grid is fixed at capture: tokens per split,
the split kernel's pipeline depth. No triton here: the CPU tests and the
benchmarks import it without a GPU."""

from __future__ import annotations

import functools

import torch

# NOTE: these shape the grid, not correctness; benchmarks/attention_kernel.py is where to tune them.
BLOCK_N = 64  # context tokens per inner-loop tile
MAX_SPLITS = 64  # caps the merge kernel's tile ([MAX_SPLITS, head_dim] fp32)
MIN_SPLIT_LEN = 256  # keeps the partial-output traffic a few percent of the K/V bytes at large batches
FULL_KV_HEADS = 8  # a model with fewer kv heads gets proportionally shorter splits, down to FEW_HEADS_SPLIT_LEN
FEW_HEADS_SPLIT_LEN = 128
PROGRAMS_PER_SM = 2  # target occupancy of a batch-of-one grid
LARGE_GRID_PROGRAMS_PER_SM = 8  # past this many split programs per SM, a shallower K/V pipeline (below)
LARGE_GRID_STAGES = 2
DEFAULT_NUM_SMS = 132  # used when there is no CUDA device (interpreter runs)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _num_sms(index)


def choose_split_len(num_kv_heads: int, len_bound: int, num_sms: int, block_n: int = BLOCK_N) -> int:
    """Tokens per split, a multiple of ``block_n``: enough splits to fill the GPU at batch size 1, at most
    MAX_SPLITS, at least `min_split_len` tokens.

    NOTE: deliberately independent of the batch size, so a row's output is bitwise the same whatever batch
    (or padding) it runs in: eager and graph steps agree exactly when they pass the same ``max_len_bound``.
    """
    target_splits = max(1, min(MAX_SPLITS, -(-PROGRAMS_PER_SM * num_sms // max(1, num_kv_heads))))
    split_len = max(min_split_len(num_kv_heads), block_n, -(-len_bound // target_splits), -(-len_bound // MAX_SPLITS))
    return -(-split_len // block_n) * block_n


def min_split_len(num_kv_heads: int) -> int:
    """MIN_SPLIT_LEN scaled by num_kv_heads / FULL_KV_HEADS, within [FEW_HEADS_SPLIT_LEN, MIN_SPLIT_LEN]: with
    few kv heads a short context at batch size 1 is otherwise a handful of programs, each looping over its
    split; at large batches the same token count makes about as many programs as 8 heads' longer splits."""
    return max(FEW_HEADS_SPLIT_LEN, min(MIN_SPLIT_LEN, MIN_SPLIT_LEN * num_kv_heads // FULL_KV_HEADS))


def choose_num_stages(programs: int, num_sms: int) -> int | None:
    """The split kernel's software-pipeline depth: LARGE_GRID_STAGES once the grid has more than
    LARGE_GRID_PROGRAMS_PER_SM programs per SM, else None (triton's default, 3): the large grids gain, the
    small ones would lose (docs/kernels.md); the ``attn_stages`` switch. It may follow the batch: the depth
    changes when tiles load, not the arithmetic, so a row's bits stay the same (the GPU test checks it)."""
    return LARGE_GRID_STAGES if programs > LARGE_GRID_PROGRAMS_PER_SM * num_sms else None
