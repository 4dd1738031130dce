"""Per-token logprobs (`SamplingParams.logprobs`): gathered on the device from a step's logits for the rows that
asked, copied to the host with the step's tokens, and turned into `TokenLogprob`s there.

The values are those of the model's raw output: `log_softmax(logits)` before penalties, min_tokens' stop
masking, temperature, top-k/top-p and min_p (vLLM's default, `logprobs_mode="raw_logprobs"`), so they do not
depend on how the token was drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphpool.engine.host_copy import to_device


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's logprob and the `logprobs` most likely tokens at its position (most likely
    first, as (token id, logprob)); `rank`: the token's 1-based rank in the vocabulary by logprob (ties count
    ahead), given for prompt tokens (engine/prompt_logprobs.py) and None for sampled ones."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    rank: int | None = None


@dataclass
class StepLogprobs:
    """A step's logprobs for the rows that asked, on the device until `to_host` (or already on the host)."""

    rows: list[int]  # batch rows, in the order of the tensors' rows
    ks: list[int]  # each of those rows' number of top logprobs
    values: torch.Tensor  # [len(rows), 1 + k] float32: the sampled token's logprob, then the top k
    top_ids: torch.Tensor  # [len(rows), k] int64

    def start_copy(self, pin: bool) -> StepLogprobs:
        """Their copy to the host (asynchronous into pinned memory on CUDA: complete once the stream is)."""
        if not pin:
            return StepLogprobs(self.rows, self.ks, self.values.cpu(), self.top_ids.cpu())
        values = torch.empty(self.values.shape, dtype=self.values.dtype, pin_memory=True)
        top_ids = torch.empty(self.top_ids.shape, dtype=self.top_ids.dtype, pin_memory=True)
        values.copy_(self.values, non_blocking=True)
        top_ids.copy_(self.top_ids, non_blocking=True)
        return StepLogprobs(self.rows, self.ks, values, top_ids)

    def by_row(self, tokens: list[int]) -> dict[int, TokenLogprob]:
        """Batch row -> its token's logprob (host tensors: after `start_copy` and the step's sync)."""
        values, ids = self.values.tolist(), self.top_ids.tolist()
        out = {}
        for row, k, vals, top in zip(self.rows, self.ks, values, ids, strict=True):
            out[row] = TokenLogprob(tokens[row], vals[0], tuple(zip(top[:k], vals[1:k + 1], strict=True)))
        return out


def gather_logprobs(logits: torch.Tensor, asks: list[int | None], tokens: torch.Tensor) -> StepLogprobs | None:
    """The logprobs of `tokens` (the step's choices, on the device) and the top k of the rows that asked (`asks`:
    each row's `SamplingParams.logprobs`), from the step's raw `logits`; None when no row asked (then this costs
    nothing)."""
    rows = [i for i, k in enumerate(asks) if k is not None]
    if not rows:
        return None
    ks = [asks[i] or 0 for i in rows]
    if len(rows) < len(asks):
        index = to_device(rows, torch.int64, logits.device)
        logits, tokens = logits.index_select(0, index), tokens.index_select(0, index)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, tokens.view(-1, 1))
    k = max(ks)
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (chosen[:, :0], tokens.view(-1, 1)[:, :0])
    return StepLogprobs(rows, ks, torch.cat([chosen, top_values], dim=1), top_ids)
