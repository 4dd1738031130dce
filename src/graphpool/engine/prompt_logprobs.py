"""Prompt logprobs (`SamplingParams.prompt_logprobs`): the logprob of every prompt token after the first, read
from the logits of the position before it, in the prefill that runs the prompt anyway.

The scheduler marks each prefill chunk's positions whose rows score a prompt token (`PromptSpan`: only for
requests that ask, only prompt positions, only those not scored yet, so a prompt prefilled again after a
preemption is not scored twice). The runner takes those rows (the eager prefill's hidden rows, through the
LM head here; a prefill through a decode graph has every row's logits already) and `score_rows` turns them
into each row's logprob of the next prompt token, its rank and the top k, on the device, a piece of rows at a
time so that a long chunk never holds [rows, vocab] float32 at once. The engine copies the result to the host
in the step's sync and appends it to the sequences (`PromptScores.add_to_sequences`).

A request whose prompt logprobs are not complete reuses no cached prefix blocks (`wants_prompt_logprobs`):
a cached position's logits are never computed. Its own blocks are cached for later requests as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from graphpool.engine.host_copy import to_device
from graphpool.engine.logprobs import TokenLogprob

_PIECE_ENTRIES = 1 << 24  # logits entries scored at once (64 MiB of float32)


@dataclass(frozen=True)
class PromptSpan:
    """Positions [start, end) of a chunk whose rows score prompt tokens start + 1 .. end; `k` top logprobs."""

    start: int
    end: int
    k: int


class _Chunk(Protocol):
    """What scoring reads of a prefill chunk (the scheduler's `PrefillChunk`, or a tensor-parallel view)."""

    @property
    def seq(self) -> Any: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def prompt_logprobs(self) -> PromptSpan | None: ...


def wants_prompt_logprobs(seq: Any) -> bool:
    """Whether `seq` asks for prompt logprobs that it does not have all of yet."""
    k = seq.params.prompt_logprobs
    return k is not None and len(seq.prompt_logprobs) < seq.num_prompt_tokens - 1


def prompt_span(seq: Any, start: int, end: int) -> PromptSpan | None:
    """The positions of a chunk [start, end) of `seq` that score prompt tokens not scored yet, or None."""
    k = seq.params.prompt_logprobs
    if k is None:
        return None
    lo, hi = max(start, len(seq.prompt_logprobs)), min(end, seq.num_prompt_tokens - 1)
    return PromptSpan(lo, hi, k) if lo < hi else None


def span_rows(chunks: Sequence[_Chunk], first: int) -> list[int]:
    """The rows of the chunks' span positions when each chunk's tokens [start, end) are consecutive rows, the
    chunks one after the other from row `first` on."""
    rows: list[int] = []
    base = first
    for c in chunks:
        span = c.prompt_logprobs
        if span is not None:
            rows.extend(range(base + span.start - c.start, base + span.end - c.start))
        base += c.end - c.start
    return rows


@dataclass
class PromptScores:
    """A step's prompt logprobs, on the device until `start_copy` (row order: `chunks`' spans, in order)."""

    chunks: list[Any]  # the chunks with a span
    values: torch.Tensor  # [rows, 1 + k] float32: the prompt token's logprob, then the top k
    ranks: torch.Tensor  # [rows] int64
    top_ids: torch.Tensor  # [rows, k] int64

    def start_copy(self, pin: bool) -> PromptScores:
        """Their copy to the host (asynchronous into pinned memory: complete once the stream is)."""
        if not pin:
            return PromptScores(self.chunks, self.values.cpu(), self.ranks.cpu(), self.top_ids.cpu())
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (self.values, self.ranks, self.top_ids)]
        for dst, src in zip(host, (self.values, self.ranks, self.top_ids), strict=True):
            dst.copy_(src, non_blocking=True)
        return PromptScores(self.chunks, *host)

    def add_to_sequences(self) -> None:
        """Append each row's `TokenLogprob` to its sequence's `prompt_logprobs` (host tensors)."""
        values, ranks, ids = self.values.tolist(), self.ranks.tolist(), self.top_ids.tolist()
        row = 0
        for c in self.chunks:
            span, seq = c.prompt_logprobs, c.seq
            # NOTE: spans are scheduled from what the sequence holds, and prefill steps complete in order
            assert len(seq.prompt_logprobs) == span.start, "prompt logprobs out of order"
            for p in range(span.start, span.end):
                top = tuple(zip(ids[row][:span.k], values[row][1:span.k + 1], strict=True))
                seq.prompt_logprobs.append(TokenLogprob(seq.token_ids[p + 1], values[row][0], top, ranks[row]))
                row += 1


def score_rows(rows: torch.Tensor, chunks: Sequence[_Chunk], vocab: int,
               head: Callable[[torch.Tensor], torch.Tensor] | None) -> PromptScores:
    """The spans' rows (hidden rows when `head` maps them to logits, else logits) -> their prompt tokens'
    logprobs (log_softmax in float32 over the whole vocabulary), ranks and top k."""
    scored = [c for c in chunks if c.prompt_logprobs is not None]
    targets = [c.seq.token_ids[p + 1] for c in scored
               for p in range(c.prompt_logprobs.start, c.prompt_logprobs.end)]  # type: ignore[union-attr]
    k = max(c.prompt_logprobs.k for c in scored)  # type: ignore[union-attr]
    target_t = to_device(targets, torch.int64, rows.device).view(-1, 1)
    piece = max(1, _PIECE_ENTRIES // vocab)
    values, ranks, top_ids = [], [], []
    for lo in range(0, rows.shape[0], piece):
        logits = rows[lo:lo + piece]
        logits = head(logits) if head is not None else logits
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen = logprobs.gather(1, target_t[lo:lo + piece])
        ranks.append((logprobs >= chosen).sum(dim=1))
        top_v, top_i = logprobs.topk(k, dim=-1)
        values.append(torch.cat([chosen, top_v], dim=1))
        top_ids.append(top_i)
    return PromptScores(scored, torch.cat(values), torch.cat(ranks), torch.cat(top_ids))
