"""A request's fixed change to its logits: OpenAI's `logit_bias` (a number added at some tokens) and vLLM's
`allowed_token_ids` (every other token at -inf). Built once a request, on the device, and applied by the sampler
to the float32 copy it changes anyway (penalties, min_tokens, grammars)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphpool.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class LogitBias:
    bias_ids: torch.Tensor | None  # [n] int64
    bias_values: torch.Tensor | None  # [n] float32
    allowed: torch.Tensor | None  # [m] int64: the only tokens left

    @classmethod
    def build(cls, params: SamplingParams, device: torch.device) -> LogitBias:
        bias = params.logit_bias or {}
        ids = torch.tensor(list(bias), dtype=torch.int64, device=device) if bias else None
        values = torch.tensor(list(bias.values()), dtype=torch.float32, device=device) if bias else None
        allowed = params.allowed_token_ids
        return cls(ids, values, None if allowed is None else torch.tensor(allowed, dtype=torch.int64, device=device))

    def apply(self, row: torch.Tensor) -> None:
        """Changes one row of float32 logits in place: the allowed tokens kept, then the biases added."""
        if self.allowed is not None:
            kept = row.index_select(0, self.allowed)
            row.fill_(float("-inf"))
            row.index_copy_(0, self.allowed, kept)
        if self.bias_ids is not None and self.bias_values is not None:
            row.index_add_(0, self.bias_ids, self.bias_values)


def apply_logit_bias(logits: torch.Tensor, biases: list[LogitBias], rows: list[int]) -> None:
    """Each listed row of `logits` (float32, changed in place) through its request's LogitBias."""
    for row, bias in zip(rows, biases, strict=True):
        bias.apply(logits[row])
