"""The torch draw's top-k / top-p cut among a row's largest logits equals the cut over its whole vocabulary;
rows whose cut lies past the candidates are named and drawn again among more; a batch of plain and filtered
rows draws each as alone."""

from __future__ import annotations

import pytest
import torch

from graphpool.engine import draw
from graphpool.engine.draw import draw_rows, nucleus

VOCAB = 5000


def _logits(rows: int, seed: int, scale: float = 4.0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def _flat(seed: int) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 0.01


def _kept(vals: torch.Tensor, ids: torch.Tensor) -> list[set[int]]:
    return [set(ids[r][vals[r] > float("-inf")].tolist()) for r in range(vals.shape[0])]


def test_the_cut_among_candidates_equals_the_whole_rows() -> None:
    x = _logits(8, 0)
    x[5] = _flat(9)  # its top-p cut lies past 256 tokens
    top_k = [0, 40, 0, 300, 7, 0, 0, 1]
    top_p = [0.9, 1.0, 0.5, 0.95, 0.99, 0.9, 1.0, 0.3]
    vals, ids, short = nucleus(x, top_k, top_p, candidates=VOCAB)
    whole = _kept(vals, ids)
    assert vals.shape[1] == VOCAB and short == []
    assert len(whole[5]) > 256 and len(whole[1]) == 40 and len(whole[3]) <= 300 and whole[7] == {int(x[7].argmax())}
    assert len(whole[6]) == VOCAB  # neither cut: every token stays
    vals, ids, short = nucleus(x, top_k, top_p, candidates=256)
    assert vals.shape[1] == 300  # the largest top-k widens the candidates
    assert short == [5, 6]  # the flat row, and the row without a cut
    among = _kept(vals, ids)
    assert [among[i] for i in (0, 1, 2, 3, 4, 7)] == [whole[i] for i in (0, 1, 2, 3, 4, 7)]


def test_rows_that_all_have_a_top_k_are_cut_among_their_k_largest() -> None:
    x = _logits(3, 5)
    x[1] = _flat(6)
    top_k, top_p = [20, 5, 40], [0.8, 0.99, 1.0]
    vals, ids, short = nucleus(x, top_k, top_p, candidates=VOCAB)  # any device: CUDA passes the vocabulary
    assert vals.shape[1] == 40 and short == []
    whole = _kept(*nucleus(torch.cat([x, x[:1]]), [*top_k, 0], [*top_p, 1.0], candidates=VOCAB)[:2])
    assert _kept(vals, ids) == whole[:3] and len(whole[1]) == 5 and len(whole[2]) == 40


@pytest.mark.parametrize("vocab_candidates", [False, True])
def test_candidates_and_whole_rows_draw_the_same_tokens(monkeypatch: pytest.MonkeyPatch,
                                                        vocab_candidates: bool) -> None:
    x = _logits(64, 1)
    x[10], x[11] = _flat(3), _flat(4)  # drawn again over the whole row
    u = torch.rand(64, 1, generator=torch.Generator().manual_seed(2))
    top_k, top_p, min_p = [0, 50] * 32, [0.9] * 64, [0.0, 0.05] * 32
    want = [int(draw_rows(x[i : i + 1], u[i : i + 1], top_k[i : i + 1], top_p[i : i + 1], min_p[i : i + 1]))
            for i in range(64)]
    if vocab_candidates:
        monkeypatch.setattr(draw, "TOP_CANDIDATES", VOCAB)
    assert draw_rows(x, u, top_k, top_p, min_p).tolist() == want


def test_a_mixed_batch_draws_each_row_as_alone() -> None:
    x = _logits(6, 3)
    u = torch.rand(6, 1, generator=torch.Generator().manual_seed(4))
    top_k, top_p, min_p = [0, 20, 0, 0, 5, 0], [1.0, 1.0, 0.8, 1.0, 0.9, 1.0], [0.0, 0.0, 0.0, 0.1, 0.0, 0.0]
    batch = draw_rows(x, u, top_k, top_p, min_p)
    alone = [int(draw_rows(x[i : i + 1], u[i : i + 1], top_k[i : i + 1], top_p[i : i + 1], min_p[i : i + 1]))
             for i in range(6)]
    assert batch.tolist() == alone
    probs = torch.softmax(x, -1)
    assert alone[1] in set(x[1].topk(20).indices.tolist()) and alone[4] in set(x[4].topk(5).indices.tolist())
    assert probs[3, alone[3]] >= 0.1 * probs[3].max()
