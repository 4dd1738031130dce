"""Every linear layer of the model, and the step's communication points inside the layers.

Under tensor parallelism (`model.parallel.shard_model`) a `ColumnLinear` holds its rank's share of the output
features (q/k/v heads, gate/up: no communication); a `RowLinear` holds its share of the input features and
sums the partial results over the ranks (o_proj, down_proj): the only all-reduces inside the layers. The
vocabulary-parallel embedding and lm head add one all-reduce after the embedding and one gather of the logits.
With one rank (`tp` is `SINGLE`) every collective is the identity.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from graphpool.model.int4 import Int4Blocks, Int4Linear
from graphpool.model.tp_group import SINGLE, TPGroup

LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


class _Linear(nn.Module):
    """`linear` computes ``x @ weight.T + bias`` (`ModelOps.linear`: torch's, or the one-row Triton GEMV)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
        linear: LinearFn = nn.functional.linear,
    ) -> None:
        super().__init__()
        self.linear = linear
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
        return self.linear(x, self.weight, self.bias)

    def use_int4(self, blocks: Int4Blocks) -> None:
        """Multiply by the 4-bit weight `blocks` from now on (model/int4.py); the float weight becomes a
        placeholder of its shape on the meta device: no memory, and any read of it fails loudly."""
        self.linear = Int4Linear(blocks)
        self.weight = nn.Parameter(torch.empty(self.weight.shape, device="meta", dtype=self.weight.dtype),
                                   requires_grad=False)


class ColumnLinear(_Linear):
    """Output features concatenated from several logical projections (e.g. q|k|v): `sizes` their widths."""

    def __init__(
        self,
        in_features: int,
        sizes: tuple[int, ...],
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
        linear: LinearFn = nn.functional.linear,
    ) -> None:
        super().__init__(in_features, sum(sizes), bias, device, dtype, linear)
        self.sizes = sizes

    def shard_slice(self, index: int) -> slice:
        """Rows of the fused weight that hold logical projection `index`."""
        start = sum(self.sizes[:index])
        return slice(start, start + self.sizes[index])


class RowLinear(_Linear):
    """Input features split over the ranks; the output is summed over them. NOTE: a sharded layer's bias is
    kept on rank 0 only (zeros elsewhere), so the sum adds it once."""

    tp: TPGroup = SINGLE

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum (before the all-reduce): for callers that overlap the reduce."""
        return super().forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.partial(x))
