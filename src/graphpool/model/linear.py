"""Every linear layer of the model, and the step's communication points.

NOTE: this is the one place tensor parallelism will touch. A `ColumnLinear` splits its output features
across ranks (q/k/v, gate/up: no communication); a `RowLinear` splits its input features and sums the
partial results with an all-reduce (o_proj, down_proj): the only communication points inside the layers. (A
vocabulary-parallel embedding and lm head, in `LlamaModel`, would add one all-reduce after the embedding and
one gather of the logits.) Today everything runs on one rank and `all_reduce` is the identity.
"""

from __future__ import annotations

import torch
from torch import nn


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of `x` across tensor-parallel ranks (identity with one rank)."""
    return x


class _Linear(nn.Module):
    def __init__(
        self, in_features: int, out_features: int, bias: bool, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        # NOTE: uninitialised on purpose: the loader (or random init) fills every parameter on the device.
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device, dtype=dtype), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype), requires_grad=False)
            if bias
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class ColumnLinear(_Linear):
    """Output features concatenated from several logical projections (e.g. q|k|v): `sizes` their widths."""

    def __init__(
        self,
        in_features: int,
        sizes: tuple[int, ...],
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(in_features, sum(sizes), bias, device, dtype)
        self.sizes = sizes

    def shard_slice(self, index: int) -> slice:
        """Rows of the fused weight that hold logical projection `index`."""
        start = sum(self.sizes[:index])
        return slice(start, start + self.sizes[index])


class RowLinear(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x))
