"""The argmax of each row of a `[bs, vocab]` tensor (the decode step's greedy token, the sampler's exponential
race): torch.argmax's result (the first index of the maximum; a NaN counts as the maximum). On CUDA two Triton
launches (`_triton_argmax.py` says why) inside the decode step (``GRAPHPOOL_KERNELS_OFF=step_argmax`` turns them
off there), where a graph holds them and their host cost is gone; in the sampler, outside any graph, while
staged (``GRAPHPOOL_STAGED_KERNELS=argmax``: there the two launches' host cost loses to torch's one); torch.argmax
elsewhere."""

from __future__ import annotations

import torch

from graphpool.kernels._dispatch import triton_impl
from graphpool.kernels.staging import kernel_on, staged_kernels_on


def argmax_rows(x: torch.Tensor, *, in_step: bool = False) -> torch.Tensor:
    """`x [bs, n]` -> int64 `[bs]`. `in_step`: called inside the decode step (a CUDA graph captures it)."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows needs [rows, n >= 1], got {tuple(x.shape)}")
    on = kernel_on("step_argmax") if in_step else staged_kernels_on("argmax")
    impl = triton_impl("_triton_argmax") if x.is_cuda and on else None
    if impl is None:
        return x.argmax(dim=-1)
    return impl.argmax_rows_triton(x)
