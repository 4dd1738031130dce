"""Sampling from a batch of logits: penalties, greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch

from graphpool.engine.bad_words import banned_tokens
from graphpool.engine.draw import draw_rows
from graphpool.engine.grammar import apply_guides
from graphpool.engine.host_copy import HostStaging, to_device
from graphpool.engine.logit_bias import apply_logit_bias
from graphpool.engine.logprobs import StepLogprobs, TokenLogprob, gather_logprobs
from graphpool.engine.penalties import TokenCounts, apply_penalties, apply_penalties_sparse
from graphpool.engine.sequence import Sequence
from graphpool.kernels.sample import PARAM_COLUMNS, sample_params
from graphpool.model.ops import argmax_torch

_MASK63 = (1 << 63) - 1


class Sampler:
    """`sample(logits [bs, vocab], seqs) -> next token ids [bs] int64` (on the logits' device).

    Logits may be in the model's dtype: an all-greedy batch takes `argmax` of them as they are (an upcast is
    exact, so the argmax is the same; the engine passes its model's `step_argmax`) and allocates nothing more.

    A torch draw takes one U[0, 1) number a row and picks the token whose cumulative probability (float64)
    first passes it (the inverse CDF), so each seeded request draws from its own stream and its output does not
    depend on the rest of the batch. With a `draw` (the engine's on CUDA: ModelOps.step_sample,
    kernels/sample.py, Gumbel-max over Philox: the same distribution, top-k, top-p and min-p by rejection) every
    row draws there, keyed per row and step: by the request's seed and its token count when seeded, else from
    the sampler's own stream; without a `draw` (or where it returns None) every row draws in torch, from the
    request's generator (seeded) or the sampler's.

    A decode step of few rows may draw in the step itself (decode_step.decode_sampled): `step_draw` gives it the
    very parameters the draw here would take, and `sample` takes its tokens as they are (`drawn`) where no row's
    logits change first.

    Rows with penalties get them applied (float32, on a copy: the logits may be a graph's output buffer)
    before the greedy argmax or the draw, then their `logit_bias` / `allowed_token_ids` and `bad_words`;
    `release(seq)` frees a finished request's token counts. A batch without penalties does no penalty work at
    all. Rows short of their `min_tokens` get -inf at their stop ids on the same copy (with the tokens their
    bad words ban, one indexed write), and guided rows (engine/grammar.py) -inf at every token their grammar
    disallows next; `min_p` drops low-probability tokens before the draw (one vectorised mask).
    `sample_step` also gathers the logprobs of the rows that ask for them, from the unchanged logits.
    """

    def __init__(self, device: torch.device, seed: int,
                 argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 draw: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None) -> None:
        self.device = device
        self.staging = HostStaging(device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.rng = random.Random(seed)  # the kernel's Philox keys of unseeded rows
        self.argmax = argmax or argmax_torch
        self.draw = draw  # the kernel draw (ModelOps.step_sample); None: every row in torch
        self.token_counts = TokenCounts(device)

    def make_generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        return gen

    def release(self, seq: Sequence) -> None:
        self.token_counts.release(seq)

    def step_draw(self, seqs: list[Sequence]) -> np.ndarray | None:
        """The rows' kernel-draw parameters [rows, PARAM_COLUMNS] int64 (kernels/sample.py's: key, temperature bits,
        top-k, top-p bits, min-p bits), for a decode step that draws its tokens itself (decode_step.decode_sampled):
        the very draw `sample` would make from the step's logits. None where `sample` would not take such tokens
        as they are: no kernel draw, or a row whose logits it changes first (penalties, bias, bans, a guide)."""
        if self.draw is None or not self._plain(seqs):
            return None
        params = [s.params for s in seqs]
        # NOTE: an argmax step (every row greedy) takes no key from the sampler's stream
        keys = [0] * len(seqs) if all(p.temperature == 0 for p in params) else self._keys(seqs)
        packed = sample_params(keys, [p.temperature for p in params], [p.top_k for p in params],
                               [p.top_p for p in params], [p.min_p for p in params], every_cut=True)
        return np.asarray(packed, dtype=np.int64).reshape(PARAM_COLUMNS, len(seqs)).T

    def sample_step(self, logits: torch.Tensor, seqs: list[Sequence],
                    drawn: torch.Tensor | None = None) -> tuple[torch.Tensor, StepLogprobs | None]:
        """`sample`, and the logprobs (on the device) of the rows whose params ask for them, else None."""
        tokens = self.sample(logits, seqs, drawn)
        return tokens, gather_logprobs(logits, [s.params.logprobs for s in seqs], tokens)

    def sample_to_host(self, logits: torch.Tensor, seqs: list[Sequence],
                       drawn: torch.Tensor | None = None) -> tuple[list[int], dict[int, TokenLogprob]]:
        """`sample_step` with its results on the host (one sync): the tokens, and row -> logprob where asked."""
        tokens, logprobs = self.sample_step(logits, seqs, drawn)
        if logprobs is not None:
            logprobs = logprobs.start_copy(pin=self.device.type == "cuda")
        host = tokens.tolist()
        return host, logprobs.by_row(host) if logprobs is not None else {}

    @staticmethod
    def _plain(seqs: list[Sequence]) -> bool:
        """Whether no row's logits change before the draw (`sample`'s first check)."""
        return not any(s.params.has_penalties or s.guide is not None or s.logit_bias is not None or s.bad_words
                       or _held(s) for s in seqs)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], drawn: torch.Tensor | None = None) -> torch.Tensor:
        """Next token ids; `drawn`: the tokens the step drew from `step_draw`'s parameters, taken as they are."""
        if drawn is not None:
            return drawn
        if self._plain(seqs):
            return self._choose(logits, seqs)
        penalised = [i for i, s in enumerate(seqs) if s.params.has_penalties]
        held = [i for i, s in enumerate(seqs) if _held(s)]
        guided = [i for i, s in enumerate(seqs) if s.guide is not None]
        biased = [i for i, s in enumerate(seqs) if s.logit_bias is not None]
        barred = [i for i, s in enumerate(seqs) if s.bad_words]
        # NOTE: a float32 copy: the logits may be a graph's output buffer.
        full = logits.to(torch.float32, copy=True)
        if penalised:
            index, rows = self._penalise(full, logits, [seqs[i] for i in penalised], penalised)
        if biased:
            apply_logit_bias(full, [seqs[i].logit_bias for i in biased], biased)  # type: ignore[misc]
        if barred or held:  # NOTE: the rows short of min_tokens lose their stop ids
            vocab = full.shape[1]
            _ban(full, [(i, t) for i in barred for t in banned_tokens(seqs[i])]
                 + [(i, t) for i in held for t in seqs[i].stop_ids if t < vocab])
        if guided:
            apply_guides(full, [seqs[i].guide for i in guided], guided)  # type: ignore[misc]
        tokens = self._choose(full, seqs)
        if penalised:
            self.token_counts.add(rows, tokens.index_select(0, index))
        return tokens

    def _penalise(self, full: torch.Tensor, logits: torch.Tensor, pen_seqs: list[Sequence],
                  penalised: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Applies the penalties to `full`'s `penalised` rows; returns those rows' index and count rows."""
        rows = self.token_counts.rows(pen_seqs, logits.shape[1])
        index = torch.tensor(penalised, dtype=torch.int64).to(logits.device, non_blocking=True)
        penalties = [s.params for s in pen_seqs]
        if self.token_counts.seen is not None:  # the CPU: at the seen tokens only
            count_rows = [s.penalty_row for s in pen_seqs]
            apply_penalties_sparse(full, penalised, count_rows, self.token_counts,  # type: ignore[arg-type]
                                   [p.presence_penalty for p in penalties], [p.frequency_penalty for p in penalties],
                                   [p.repetition_penalty for p in penalties])
            return index, rows

        def column(name: str, off: float) -> torch.Tensor | None:
            values = [getattr(p, name) for p in penalties]
            if all(v == off for v in values):
                return None
            return torch.tensor(values, dtype=torch.float32).to(logits.device, non_blocking=True)

        rows_logits = apply_penalties(
            logits.index_select(0, index).float(),
            self.token_counts.counts.index_select(0, rows),
            self.token_counts.prompt.index_select(0, rows),
            presence=column("presence_penalty", 0.0),
            frequency=column("frequency_penalty", 0.0),
            repetition=column("repetition_penalty", 1.0),
        )
        full.index_copy_(0, index, rows_logits)
        return index, rows

    def _choose(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [s.params for s in seqs]
        if all(p.temperature == 0 for p in params):
            return self.argmax(logits)
        tokens = None
        if self.draw is not None:
            keys = self._keys(seqs)
            temps = [p.temperature for p in params]
            # NOTE: the cut columns only where some row has a cut: most batches skip three list builds a step
            args = (sample_params(keys, temps, [p.top_k for p in params], [p.top_p for p in params],
                                  [p.min_p for p in params])
                    if any(p.has_cut for p in params) else sample_params(keys, temps))
            tokens = self.draw(logits, self.staging.to_device(np.asarray(args, dtype=np.int64))[0])
        return tokens if tokens is not None else self._draw_torch(logits, seqs)

    def _keys(self, seqs: list[Sequence]) -> list[int]:
        """Each row's Philox key for this step: a seeded request's from its seed and token count, else the next
        of the sampler's own stream."""
        return [self.rng.getrandbits(63) if s.params.seed is None else _step_key(s.params.seed, s.num_output_tokens)
                for s in seqs]

    def _draw_torch(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The torch sampler: each row's draw, or its argmax at temperature 0."""
        params = [s.params for s in seqs]
        greedy = [p.temperature == 0 for p in params]
        greedy_tokens = self.argmax(logits) if any(greedy) else None  # NOTE: kernel-path rows never are
        logits = logits.float()
        # NOTE: greedy rows get temperature 1 here and take the argmax below, so they stay exact.
        temps = to_device([p.temperature or 1.0 for p in params], torch.float32, logits.device)
        scaled = logits / temps.unsqueeze(1)
        sampled = draw_rows(scaled, self._uniforms(seqs, scaled.device), [p.top_k for p in params],
                            [p.top_p for p in params], [p.min_p for p in params])
        if greedy_tokens is None:
            return sampled
        return torch.where(to_device(greedy, torch.bool, logits.device), greedy_tokens, sampled)

    def _uniforms(self, seqs: list[Sequence], device: torch.device) -> torch.Tensor:
        """[bs, 1] U[0, 1) draws: a seeded row's from its own generator, the others' from the sampler's."""
        u = torch.empty((len(seqs), 1), device=device)
        if any(s.generator is None for s in seqs):
            u.uniform_(generator=self.generator)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                u[i].uniform_(generator=s.generator)
        return u


def _held(seq: Sequence) -> bool:
    """Whether the row is short of its min_tokens, so its stop ids are banned this step. NOTE: num_output_tokens
    counts async scheduling's placeholder, so it is the count before this token."""
    return seq.num_output_tokens < seq.params.min_tokens and bool(seq.stop_ids)


def _ban(logits: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """-inf at each (row, token) of `pairs`: one indexed write for them all."""
    if pairs:
        index = to_device([p for pair in pairs for p in pair], torch.int64, logits.device).view(-1, 2)
        logits[index[:, 0], index[:, 1]] = float("-inf")


def _step_key(seed: int, index: int) -> int:
    """A seeded request's Philox key for its `index`-th output token (splitmix64 of the pair, 63 bits)."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & _MASK63
