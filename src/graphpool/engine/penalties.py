"""Repetition, frequency and presence penalties over a batch, with per-request token counts on the device."""

from __future__ import annotations

import torch

from graphpool.engine.sequence import Sequence

MIN_ROWS = 8


def apply_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    presence: torch.Tensor | None,
    frequency: torch.Tensor | None,
    repetition: torch.Tensor | None,
) -> torch.Tensor:
    """Penalised copy of `logits` [n, vocab] (float32). `counts` [n, vocab]: each token's count in the output
    so far; `prompt_mask` [n, vocab]: tokens of the prompt; the penalties are [n] (None: off for every row).

    repetition (Hugging Face's RepetitionPenaltyLogitsProcessor over prompt + output): a seen token's logit
    is multiplied by the penalty if negative, divided by it otherwise. Then OpenAI's
    `logit - count * frequency - (count > 0) * presence`, over the output only.
    """
    out = logits
    seen_output = counts > 0
    if repetition is not None:
        r = repetition.unsqueeze(1)
        penalised = torch.where(out < 0, out * r, out / r)
        out = torch.where(seen_output | prompt_mask, penalised, out)
    if frequency is not None:
        out = out - counts.to(out.dtype) * frequency.unsqueeze(1)
    if presence is not None:
        out = out - seen_output.to(out.dtype) * presence.unsqueeze(1)
    return out


def apply_penalties_sparse(logits: torch.Tensor, index: list[int], rows: list[int], counts: TokenCounts,
                           presence: list[float], frequency: list[float], repetition: list[float]) -> None:
    """`apply_penalties` in place on `logits`' rows `index` (count rows `rows`), at each row's seen tokens only
    (`counts.seen`: the CPU's host record), with the same float operations in the same order, so the same
    values; a dense pass over a 152k vocabulary takes milliseconds a row there."""
    for b, r, pres, freq, rep in zip(index, rows, presence, frequency, repetition, strict=True):
        ids = torch.tensor(list(counts.seen[r]), dtype=torch.int64)
        vals = logits[b, ids]
        if rep != 1.0:
            vals = torch.where(vals < 0, vals * rep, vals / rep)
        if freq != 0.0 or pres != 0.0:
            count = counts.counts[r, ids].to(vals.dtype)
            vals = vals - count * freq
            vals = vals - (count > 0).to(vals.dtype) * pres
        logits[b, ids] = vals


class TokenCounts:
    """One row per live request with penalties: generated-token counts (int32) and the prompt's tokens (bool),
    [rows, vocab] on the device. Rows are handed out at a request's first sampled step, updated with one
    indexed add per step, and reused once the request is released; the matrices grow by doubling.

    Memory: 5 bytes per vocab entry per concurrent penalised request (about 0.6 MiB at a 128k vocab).
    On the CPU each row also keeps its seen token ids (prompt and output) on the host, for
    `apply_penalties_sparse`.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.counts = torch.zeros((0, 0), dtype=torch.int32, device=device)
        self.prompt = torch.zeros((0, 0), dtype=torch.bool, device=device)
        self._free: list[int] = []
        self.seen: dict[int, set[int]] | None = {} if device.type == "cpu" else None

    @property
    def capacity(self) -> int:
        return self.counts.shape[0]

    def rows(self, seqs: list[Sequence], vocab: int) -> torch.Tensor:
        """The rows of `seqs` (given one on first sight) as a device tensor."""
        new = [s for s in seqs if s.penalty_row is None]
        if new:
            self._assign(new, vocab)
        return torch.tensor([s.penalty_row for s in seqs], dtype=torch.int64).to(
            self.device, non_blocking=True
        )

    def add(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        ones = torch.ones_like(rows, dtype=torch.int32)
        self.counts.index_put_((rows, tokens), ones, accumulate=True)
        if self.seen is not None:
            for r, t in zip(rows.tolist(), tokens.tolist(), strict=True):
                self.seen[r].add(t)

    def release(self, seq: Sequence) -> None:
        if seq.penalty_row is not None:
            self._free.append(seq.penalty_row)
            seq.penalty_row = None

    def _assign(self, seqs: list[Sequence], vocab: int) -> None:
        if self.counts.shape[1] not in (0, vocab):
            raise ValueError(f"logits have {vocab} columns, token counts {self.counts.shape[1]}")
        missing = len(seqs) - len(self._free)
        if missing > 0:
            self._grow(max(MIN_ROWS, 2 * self.capacity, self.capacity + missing), vocab)
        for s in seqs:
            s.penalty_row = self._free.pop()
        rows = torch.tensor([s.penalty_row for s in seqs], dtype=torch.int64, device=self.device)
        self.counts.index_fill_(0, rows, 0)
        self.prompt.index_fill_(0, rows, False)
        prompt_rows = [s.penalty_row for s in seqs for _ in s.prompt_token_ids]
        prompt_ids = [t for s in seqs for t in s.prompt_token_ids]
        self.prompt[self._long(prompt_rows), self._long(prompt_ids)] = True
        if self.seen is not None:
            for s in seqs:
                self.seen[s.penalty_row] = set(s.prompt_token_ids)  # type: ignore[index]
        # NOTE: normally empty; a request's output so far counts when its row is (re)made.
        out_rows = [s.penalty_row for s in seqs for _ in s.output_token_ids]
        out_ids = [t for s in seqs for t in s.output_token_ids]
        if out_ids:
            self.add(self._long(out_rows), self._long(out_ids))

    def _grow(self, capacity: int, vocab: int) -> None:
        old = self.capacity
        counts = torch.zeros((capacity, vocab), dtype=torch.int32, device=self.device)
        prompt = torch.zeros((capacity, vocab), dtype=torch.bool, device=self.device)
        if old:
            counts[:old] = self.counts
            prompt[:old] = self.prompt
        self.counts, self.prompt = counts, prompt
        self._free.extend(range(capacity - 1, old - 1, -1))

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)
