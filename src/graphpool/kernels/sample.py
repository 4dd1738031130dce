"""One draw per row of a `[bs, vocab]` logits tensor at each row's temperature (0: the argmax), from each
row's Philox seed: Triton on CUDA (`_triton_sample.py`), None where it cannot run (the caller's torch
sampler then draws)."""

from __future__ import annotations

import numpy as np
import torch

from graphpool.kernels._dispatch import triton_impl


def sample_params(seeds: list[int], temperatures: list[float]) -> list[int]:
    """The kernel's per-row parameters as one int64 list: the seeds (< 2**63), then the temperatures'
    float32 bits."""
    bits = np.asarray(temperatures, dtype=np.float32).view(np.int32).astype(np.int64)
    return [*seeds, *bits.tolist()]


def sample_rows(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor | None:
    """`x [bs, n]`, `params` (`sample_params`, int64 on x's device) -> int64 `[bs]`; None off CUDA or
    without Triton."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"sample_rows needs [rows, n >= 1], got {tuple(x.shape)}")
    if params.shape != (2 * x.shape[0],) or params.dtype != torch.int64:
        raise ValueError(f"sample_rows needs int64 params [2 * rows], got {params.dtype} {tuple(params.shape)}")
    impl = triton_impl("_triton_sample") if x.is_cuda else None
    if impl is None:
        return None
    return impl.sample_rows_triton(x, params)
