"""The argmax of each row of a `[bs, vocab]` tensor (the sampler's greedy pick and its exponential race):
torch.argmax's result (the first index of the maximum; a NaN counts as the maximum), by two Triton launches on
CUDA while staged (`kernels/staging.py`; `_triton_argmax.py` says why), torch.argmax elsewhere."""

from __future__ import annotations

import torch

from graphpool.kernels._dispatch import triton_impl
from graphpool.kernels.staging import staged_kernels_on


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """`x [bs, n]` -> int64 `[bs]`."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows needs [rows, n >= 1], got {tuple(x.shape)}")
    impl = triton_impl("_triton_argmax") if x.is_cuda and staged_kernels_on("argmax") else None
    if impl is None:
        return x.argmax(dim=-1)
    return impl.argmax_rows_triton(x)
