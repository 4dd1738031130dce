"""One draw per row of a `[bs, vocab]` logits tensor at each row's temperature (0: the argmax), from each
row's Philox seed, with each row's top-k, top-p and min-p cut: Triton on CUDA (`_triton_sample.py`), None where
it cannot run (the caller's torch sampler then draws)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphpool.kernels._dispatch import triton_impl

PARAM_COLUMNS = 5  # a row's parameters where every cut column is present: seed, temperature, top-k, top-p, min-p


def _float_bits(values: Sequence[float]) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.int32).astype(np.int64).tolist()


def sample_params(seeds: list[int], temperatures: list[float], top_k: list[int] | None = None,
                  top_p: list[float] | None = None, min_p: list[float] | None = None,
                  every_cut: bool = False) -> list[int]:
    """The kernel's per-row parameters as one int64 list: the seeds (< 2**63), then the temperatures' float32
    bits; where some row has a cut (top-k > 0, top-p < 1, min-p > 0), or `every_cut` (a captured step's fixed
    layout), then every row's top-k and its top-p's and min-p's float32 bits (the cuts given as all three lists
    or none)."""
    packed = [*seeds, *_float_bits(temperatures)]
    cuts = (top_k, top_p, min_p)
    if all(c is None for c in cuts):
        return packed
    if any(c is None or len(c) != len(seeds) for c in cuts):
        raise ValueError("sample_params takes top_k, top_p and min_p together, one value a row")
    ks, ps, mins = top_k or [], top_p or [], min_p or []
    if not every_cut and not any(k > 0 for k in ks) and not any(p < 1 for p in ps) and not any(m > 0 for m in mins):
        return packed
    return [*packed, *ks, *_float_bits(ps), *_float_bits(mins)]


def sample_rows(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor | None:
    """`x [bs, n]`, `params` (`sample_params`, int64 on x's device) -> int64 `[bs]`; None off CUDA or
    without Triton."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"sample_rows needs [rows, n >= 1], got {tuple(x.shape)}")
    if params.dim() != 1 or params.shape[0] not in (2 * x.shape[0], 5 * x.shape[0]) or params.dtype != torch.int64:
        raise ValueError(f"sample_rows needs int64 params [2 * rows] or [5 * rows], got {params.dtype} "
                         f"{tuple(params.shape)}")
    impl = triton_impl("_triton_sample") if x.is_cuda else None
    if impl is None:
        return None
    return impl.sample_rows_triton(x, params)
