"""Sampling from a batch of logits: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from graphpool.engine.sequence import Sequence


class Sampler:
    """`sample(logits [bs, vocab], seqs) -> next token ids [bs] int64` (on the logits' device).

    Logits may be in the model's dtype: an all-greedy batch takes the argmax as it is (an upcast is exact,
    so the argmax is the same) and allocates nothing more; sampling upcasts to float32 first.

    Sampling uses the exponential-race form (argmax of p / E with E ~ Exp(1)), which needs one random number
    per vocab entry and lets each seeded request draw them from its own generator: a seeded request's output
    does not depend on the rest of the batch.
    """

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        return gen

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        greedy_tokens = logits.argmax(dim=-1)
        if all(s.params.temperature == 0 for s in seqs):
            return greedy_tokens
        logits = logits.float()
        params = [s.params for s in seqs]
        # NOTE: greedy rows get temperature 1 here and take the argmax below, so they stay exact.
        temps = torch.tensor([p.temperature or 1.0 for p in params], dtype=torch.float32)
        scaled = logits / temps.to(logits.device, non_blocking=True).unsqueeze(1)
        probs = self._filtered_probs(scaled, [p.top_k for p in params], [p.top_p for p in params])
        noise = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
        if unseeded:
            noise[unseeded] = torch.empty(
                (len(unseeded), probs.shape[1]), device=probs.device
            ).exponential_(generator=self.generator)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                noise[i].exponential_(generator=s.generator)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([p.temperature == 0 for p in params]).to(logits.device, non_blocking=True)
        return torch.where(is_greedy, greedy_tokens, sampled)

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
        """Softmax after top-k and top-p filtering (rows with k=0 and p=1 are left whole)."""
        use_k, use_p = any(k > 0 for k in top_k), any(p < 1.0 for p in top_p)
        if not (use_k or use_p):
            return torch.softmax(logits, dim=-1)
        vocab = logits.shape[1]
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # [bs, vocab]
        if use_k:
            k = torch.tensor([kk if kk > 0 else vocab for kk in top_k], device=logits.device)
            ranks = torch.arange(vocab, device=logits.device)
            sorted_logits = sorted_logits.masked_fill(ranks.unsqueeze(0) >= k.unsqueeze(1), float("-inf"))
        if use_p:
            p = torch.tensor(top_p, dtype=torch.float32, device=logits.device)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            # NOTE: drop a token once the mass before it already reaches top_p (the top token always stays).
            before = sorted_probs.cumsum(dim=-1) - sorted_probs
            sorted_logits = sorted_logits.masked_fill(before >= p.unsqueeze(1), float("-inf"))
        probs_sorted = torch.softmax(sorted_logits, dim=-1)
        return torch.empty_like(probs_sorted).scatter_(1, order, probs_sorted)
