"""The argmax of each row of a `[bs, vocab]` tensor, the decode step's greedy token: torch.argmax's result (the
first index of the maximum; a NaN counts as the maximum). On CUDA two Triton launches (`_triton_argmax.py`
says why), meant for inside the decode step, where a graph holds them and their host cost is gone (the
``step_argmax`` switch); torch's reductions elsewhere."""

from __future__ import annotations

import torch

from graphpool.kernels._dispatch import triton_impl


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """`x [bs, n]` -> int64 `[bs]`."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows needs [rows, n >= 1], got {tuple(x.shape)}")
    impl = triton_impl("_triton_argmax") if x.is_cuda else None
    if impl is None:
        # NOTE: max's indices are argmax's (the first maximum, a NaN as the maximum), and on the CPU 2-4.5x
        # faster at 1-16 rows of a 49,152 vocabulary in bfloat16 (docs/benchmarks.md, "Sampling on the CPU")
        return x.max(dim=-1).indices if x.device.type == "cpu" else x.argmax(dim=-1)
    return impl.argmax_rows_triton(x)
