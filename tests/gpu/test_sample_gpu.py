"""The sampling kernel and the sampler's use of it on the GPU: draws follow softmax(x / t) (chi-square over
20,000 rows of distinct seeds, bf16 and float32 logits, a 128,256-wide row), temperature-0 rows are torch's
argmax; rows with top-k, top-p and min-p follow the kept tokens' renormalised softmax (the torch draw's cut),
on a 128,256-wide row too; in the engine's Sampler a seeded row's tokens depend only on its own seed and
position, whichever rows (top-p ones included) share its batch; allowed tokens and logit biases hold for the
kernel draw too."""

from __future__ import annotations

import pytest
import torch

from graphpool.engine.draw import nucleus
from graphpool.engine.host_copy import to_device
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.sequence import Sequence
from graphpool.kernels.sample import sample_params, sample_rows

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _params(seeds: list[int], temps: list[float]) -> torch.Tensor:
    return to_device(sample_params(seeds, temps), torch.int64, CUDA)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_draws_follow_the_tempered_softmax(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    row = (torch.randn(50, generator=gen) * 2).to(dtype)
    n, t = 20_000, 0.8
    tokens = sample_rows(row.to(CUDA).expand(n, 50), _params(list(range(n)), [t] * n))
    assert tokens is not None
    counts = torch.bincount(tokens.cpu(), minlength=50).double()
    expected = torch.softmax(row.double() / t, -1) * n
    keep = expected >= 5  # chi-square cells with enough expected draws; the rest pooled
    obs = torch.cat([counts[keep], counts[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < 3 * len(obs), (chi2, len(obs))  # far below at p = 0.001 for these degrees of freedom


def _chi2(counts: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    keep = expected >= 5  # chi-square cells with enough expected draws; the rest pooled
    obs = torch.cat([counts[keep], counts[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    return float(((obs - exp) ** 2 / exp.clamp(min=1e-9)).sum()), len(obs)


@pytest.mark.parametrize("cut", [(0, 0.9, 0.0), (10, 1.0, 0.0), (20, 0.8, 0.0), (0, 1.0, 0.05), (15, 0.95, 0.02)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cut_draws_follow_the_kept_tokens_softmax(cut: tuple[int, float, float], dtype: torch.dtype) -> None:
    k, p, min_p = cut
    gen = torch.Generator().manual_seed(1)
    row = (torch.randn(64, generator=gen) * 2).to(dtype)
    n, t = 20_000, 0.8
    params = to_device(sample_params(list(range(n)), [t] * n, [k] * n, [p] * n, [min_p] * n), torch.int64, CUDA)
    tokens = sample_rows(row.to(CUDA).expand(n, 64), params)
    assert tokens is not None
    y = row.double() / t
    vals, ids, _ = nucleus(y[None], [k], [p], 64)
    kept = vals[0] > float("-inf")
    if min_p > 0:
        kept &= (vals[0] - y.max()).exp() >= min_p
    expected = torch.zeros(64, dtype=torch.float64)
    expected[ids[0][kept]] = torch.softmax(vals[0][kept], -1) * n
    counts = torch.bincount(tokens.cpu(), minlength=64).double()
    assert counts[expected == 0].sum() == 0
    chi2, cells = _chi2(counts[expected > 0], expected[expected > 0])
    assert chi2 < 3 * cells, (chi2, cells)


def test_cut_draws_on_wide_rows_stay_in_the_nucleus() -> None:
    gen = torch.Generator(device=CUDA).manual_seed(3)
    x = torch.randn(64, 128_256, device=CUDA, dtype=torch.bfloat16, generator=gen)
    x[:, 1000] = x[:, 90_000] = 20.0  # two tokens holding all but ~2e-4 of the mass: top-p 0.5 keeps them alone
    n = x.shape[0]
    params = to_device(sample_params(list(range(n)), [1.0] * n, [0] * n, [0.5] * n, [0.0] * n), torch.int64, CUDA)
    got = sample_rows(x, params)
    assert got is not None and set(got.tolist()) == {1000, 90_000}
    # rows whose nucleus is wide (N(0, 9) logits: a top-p set of thousands of tokens), each cut mix: every draw
    # lies at or above the least y the torch draw keeps in its row (bf16 ties there may go either way)
    wide = torch.randn(32, 128_256, device=CUDA, dtype=torch.bfloat16, generator=gen) * 3
    ks, ps = [0, 50, 0, 20] * 8, [0.9, 1.0, 0.5, 0.8] * 8
    drawn = sample_rows(wide, to_device(sample_params(list(range(32)), [0.8] * 32, ks, ps, [0.0] * 32),
                                        torch.int64, CUDA))
    y = wide.float() / 0.8
    vals, _, _ = nucleus(y, ks, ps, wide.shape[1])
    least = vals.masked_fill(vals == float("-inf"), float("inf")).amin(-1)
    assert drawn is not None
    assert bool((y.gather(1, drawn[:, None]).squeeze(1) >= least).all()), (y.gather(1, drawn[:, None]), least)
    flat = torch.zeros(4, 128_256, device=CUDA)
    flat[:, 5] = 1.0  # a flat row: top-k 3 keeps token 5 and two of the ties; top-p 1e-6 token 5 alone
    cuts = sample_params([1, 2, 3, 4], [1.0] * 4, [3, 3, 0, 1], [1.0, 1.0, 1e-6, 1.0], [0.0] * 4)
    drawn = sample_rows(flat, to_device(cuts, torch.int64, CUDA))
    assert drawn is not None and drawn[2:].tolist() == [5, 5] and all(0 <= t < 128_256 for t in drawn.tolist())


def test_wide_rows_greedy_exact_and_draws_near_the_top() -> None:
    x = torch.randn(8, 128_256, device=CUDA, dtype=torch.bfloat16) * 4
    x[1, 100] = x[1, 128_000] = 60.0  # a tie across blocks: the first
    x[2, 77] = float("nan")
    got = sample_rows(x, _params(list(range(8)), [0.0] * 8))
    assert got is not None and torch.equal(got, x.argmax(-1))
    cold = sample_rows(x, _params(list(range(8)), [1e-4] * 8))  # next to no temperature: a top token again
    # NOTE: a top token, not the argmax: bf16 values of 128k draws tie at the top of a row now and then
    assert cold is not None and torch.equal(x[3:].gather(1, cold[3:, None]).squeeze(1), x[3:].amax(-1))


def _seq(rid: str, **kw: object) -> Sequence:
    params = SamplingParams(max_tokens=8, **kw)  # type: ignore[arg-type]
    gen = torch.Generator(device=CUDA).manual_seed(params.seed) if params.seed is not None else None
    return Sequence(rid, [1, 2, 3], params, frozenset(), gen)


def test_a_seeded_row_draws_alone_what_it_draws_in_any_batch() -> None:
    sampler = Sampler(CUDA, 0, draw=sample_rows)
    logits = torch.randn(4, 32_000, device=CUDA)
    seeded = _seq("s", temperature=1.0, seed=1234)
    alone = sampler.sample(logits[:1], [seeded]).item()
    others = [_seq("a", temperature=0.9), _seq("b", temperature=0.7, top_p=0.9), _seq("c", temperature=0)]
    batch = sampler.sample(logits, [seeded, *others])
    assert batch[0].item() == alone
    assert batch[3].item() == logits[3].argmax().item()
    walk = []  # NOTE: each position of the same request draws from its own key
    for _ in range(10):
        walk.append(sampler.sample(logits[:1], [seeded]).item())
        seeded.token_ids.append(walk[-1])
    assert walk[0] == alone and len(set(walk)) > 1
    draws = {sampler.sample(logits[:1], [_seq("s", temperature=1.0, seed=s)]).item() for s in range(40)}
    assert len(draws) > 20  # distinct seeds, distinct draws over a flat-ish 32k row


def test_allowed_tokens_and_biases_hold_for_the_kernel_draw() -> None:
    from graphpool.engine.logit_bias import LogitBias

    sampler = Sampler(CUDA, 0, draw=sample_rows)
    logits = torch.randn(64, 32_000, device=CUDA)
    logits[:, 7] = logits[:, 31_999] = 0.0  # with the bias: 7 drawn about a quarter of the time
    seqs = []
    for i in range(64):  # temperature-only rows: the kernel draws them
        seq = _seq(f"r{i}", temperature=1.0, seed=i, allowed_token_ids=[7, 31_999], logit_bias={7: -1.0})
        seq.logit_bias = LogitBias.build(seq.params, CUDA)
        seqs.append(seq)
    drawn = sampler.sample(logits, seqs).tolist()
    assert set(drawn) <= {7, 31_999} and len(set(drawn)) == 2
    forced = _seq("f", temperature=0, logit_bias={5: 100.0})
    forced.logit_bias = LogitBias.build(forced.params, CUDA)
    assert sampler.sample(logits[:1], [forced]).item() == 5
