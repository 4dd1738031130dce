"""The torch draw of sampled rows: top-k then top-p as each row's kept tokens, min-p, and one U[0, 1) number a
row located in the kept tokens' cumulative probabilities (the inverse CDF).

Where every row has a top-k, the cut is looked for among its k largest logits (`topk`, on any device). Else,
on the CPU, among its `TOP_CANDIDATES` largest (a full sort of a 49,152-entry row takes ~4 ms there), and over
the whole row only for rows whose cut lies past them; that check reads a value on the host, which on CUDA
would wait for the step, so the GPU sorts whole rows.
"""

from __future__ import annotations

import torch

from graphpool.engine.host_copy import to_device

TOP_CANDIDATES = 256


def draw_rows(scaled: torch.Tensor, u: torch.Tensor, top_k: list[int], top_p: list[float],
              min_p: list[float]) -> torch.Tensor:
    """One token id per row of `scaled` (float32 [n, vocab] logits over temperature) from `u` ([n, 1])."""
    is_cut = [k > 0 or p < 1 for k, p in zip(top_k, top_p, strict=True)]
    filtered = [i for i, cut in enumerate(is_cut) if cut]
    if not filtered or len(filtered) == len(top_k):
        return _draw(scaled, u, min_p, (top_k, top_p) if filtered else None)
    tokens = torch.empty(len(top_k), dtype=torch.int64, device=scaled.device)
    plain = [i for i, cut in enumerate(is_cut) if not cut]
    for group, cut in ((plain, None), (filtered, ([top_k[i] for i in filtered], [top_p[i] for i in filtered]))):
        index = to_device(group, torch.int64, scaled.device)
        drawn = _draw(scaled.index_select(0, index), u.index_select(0, index), [min_p[i] for i in group], cut)
        tokens.index_copy_(0, index, drawn)
    return tokens


def _draw(x: torch.Tensor, u: torch.Tensor, min_p: list[float],
          cut: tuple[list[int], list[float]] | None) -> torch.Tensor:
    if cut is None:
        return _pick(x, u, min_p, None)
    return _draw_cut(x, u, min_p, *cut, candidates=TOP_CANDIDATES if x.device.type == "cpu" else x.shape[1])


def _draw_cut(x: torch.Tensor, u: torch.Tensor, min_p: list[float], top_k: list[int], top_p: list[float],
              candidates: int) -> torch.Tensor:
    vals, ids, short = nucleus(x, top_k, top_p, candidates)
    tokens = _pick(vals, u, min_p, ids)
    if short:  # NOTE: rows whose cut lies past the candidates (flat ones) again, over their whole vocabulary
        index = to_device(short, torch.int64, x.device)
        wider = _draw_cut(x.index_select(0, index), u.index_select(0, index), [min_p[i] for i in short],
                          [top_k[i] for i in short], [top_p[i] for i in short], x.shape[1])
        tokens.index_copy_(0, index, wider)
    return tokens


def _pick(x: torch.Tensor, u: torch.Tensor, min_p: list[float], ids: torch.Tensor | None) -> torch.Tensor:
    probs = torch.softmax(x, dim=-1)
    if any(m > 0 for m in min_p):
        # NOTE: the inverse CDF scales u by what is left, so the kept probabilities need no renormalising.
        floor = probs.amax(dim=-1, keepdim=True) * to_device(min_p, torch.float32, x.device).unsqueeze(1)
        probs = probs.masked_fill(probs < floor, 0.0)
    picked = inverse_cdf(probs, u)
    return picked if ids is None else ids.gather(1, picked.unsqueeze(1)).squeeze(1)


def nucleus(x: torch.Tensor, top_k: list[int], top_p: list[float],
            candidates: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Each row's largest logits in descending order, -inf where top-k (k <= 0: off) then top-p (of the top-k's
    renormalised mass; p >= 1: off) drop them, their token ids, and the rows whose cut may lie past them. As
    many as the largest k where every row has a top-k, else `candidates` (at least the largest k, at most the
    vocabulary: then no row is past them)."""
    vocab = x.shape[1]
    ks = [k if 0 < k < vocab else vocab for k in top_k]
    # NOTE: where every row has a top-k its kept tokens lie among the largest k (on any device: no check needed)
    width = max(ks) if max(ks) < vocab else min(vocab, max([candidates, *(k for k in ks if k < vocab)]))
    uncertain = max(ks) > width  # some row's cut may lie past the candidates (only where width < vocab)
    vals, ids = x.topk(width, dim=-1)
    k = to_device(ks, torch.int64, x.device).unsqueeze(1)
    kept = torch.arange(width, device=x.device) < k
    short = k > width if uncertain else None
    if any(p < 1 for p in top_p):
        p = to_device([p if p < 1 else float("inf") for p in top_p], torch.float32, x.device).unsqueeze(1)
        masked = vals.masked_fill(~kept, float("-inf"))
        # the normaliser after top-k: the candidates' where they hold all k kept tokens, else the whole row's
        norm = masked.logsumexp(dim=-1, keepdim=True)
        if uncertain:
            norm = torch.where(k <= width, norm, x.logsumexp(dim=-1, keepdim=True))
        probs = (masked - norm).exp()
        mass = probs.cumsum(dim=-1)
        # NOTE: a token goes once the mass before it reaches top_p; the top token always stays
        kept &= (mass - probs) < p
        kept[:, 0] = True
        if short is not None:
            short &= mass[:, -1:] < p
    rows = short.flatten().nonzero().flatten().tolist() if short is not None else []
    return vals.masked_fill(~kept, float("-inf")), ids, rows


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Each row's index whose cumulative probability first passes u * (its row's total): float64 sums, so even
    a 256,000-entry vocabulary rounds each token's share by ~1e-13; `right=True`, so an entry of probability 0
    is never the one (u * total < total as u < 1). The clamp only keeps a NaN row's index in range."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    picked = torch.searchsorted(cdf, u.double() * cdf[:, -1:], right=True).squeeze(1)
    return picked.clamp_(max=probs.shape[1] - 1)
