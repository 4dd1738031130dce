"""OpenAI's `logit_bias` and vLLM's `allowed_token_ids`: the sampler on hand-made logits, then the engine on the
default model (CPU), synchronous and with async scheduling through the pool's stand-in capturer."""

from __future__ import annotations

import pytest
import torch

from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.logit_bias import LogitBias
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import InvalidParam
from graphpool.engine.sequence import Sequence
from graphpool.pool.testing import EagerCapturer

EOS = 3
PROMPT = "The capital of France is"


def _seq(rid: str, n_out: int = 0, seed: int | None = None, **params: object) -> Sequence:
    seq = Sequence(rid, [1, 2], SamplingParams(**params), frozenset({EOS}),  # type: ignore[arg-type]
                   None if seed is None else torch.Generator().manual_seed(seed))
    seq.token_ids.extend([5] * n_out)
    if seq.params.has_logit_bias:
        seq.logit_bias = LogitBias.build(seq.params, torch.device("cpu"))
    return seq


@pytest.mark.parametrize(("kw", "says"), [
    ({"logit_bias": {1: 101.0}}, "in \\[-100, 100\\]"),
    ({"logit_bias": {1: float("nan")}}, "finite"),
    ({"logit_bias": {-1: 1.0}}, "token ids"),
    ({"logit_bias": {"1": 1.0}}, "token ids"),
    ({"logit_bias": [1]}, "map token ids"),
    ({"allowed_token_ids": []}, "non-empty"),
    ({"allowed_token_ids": [1, -2]}, "non-empty list of token ids"),
])
def test_params_are_validated(kw: dict, says: str) -> None:
    with pytest.raises(InvalidParam, match=says) as info:
        SamplingParams(**kw)
    assert info.value.param == next(iter(kw))
    assert not SamplingParams(logit_bias={}).has_logit_bias and SamplingParams(allowed_token_ids=[4]).has_logit_bias


def test_bias_and_allowed_tokens_change_the_choice_not_the_callers_logits() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.zeros(5, 8)
    logits[:, 6], logits[:, 7], logits[:, EOS] = 5.0, 4.0, 3.0
    seqs = [
        _seq("plain", temperature=0),
        _seq("lifted", temperature=0, logit_bias={2: 6.0}),  # 0 + 6 > 5
        _seq("sunk", temperature=0, logit_bias={6: -100.0}),
        _seq("allowed", temperature=0, allowed_token_ids=[1, EOS]),
        _seq("held", temperature=0, min_tokens=1, max_tokens=4, allowed_token_ids=[1, EOS]),  # EOS held back
    ]
    before = logits.clone()
    assert sampler.sample(logits, seqs).tolist() == [6, 2, 7, EOS, 1]
    assert torch.equal(logits, before)
    drawn = [_seq(f"s{i}", seed=i, temperature=1.0, allowed_token_ids=[0, 4, 4]) for i in range(64)]
    assert set(sampler.sample(torch.zeros(64, 8), drawn).tolist()) == {0, 4}
    top = [_seq(f"k{i}", seed=i, temperature=1.0, top_k=2, logit_bias={1: 100.0}) for i in range(16)]
    assert set(sampler.sample(logits[:1].repeat(16, 1), top).tolist()) <= {1, 6}


@pytest.fixture(scope="module")
def llm(default_model) -> LLM:
    return LLM.from_engine(LLMEngine(EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=48),
                                     loaded=default_model))


def test_the_engine_follows_the_bias_and_the_allowed_tokens(llm: LLM) -> None:
    greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0].token_ids
    forced = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6, logit_bias={42: 100.0}),
                          use_tqdm=False)[0].token_ids
    assert forced == [42] * 6
    banned = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6, logit_bias={greedy[0]: -100.0}),
                          use_tqdm=False)[0].token_ids
    assert banned[0] != greedy[0] and greedy[0] not in banned
    allowed = [11, 42, 300, greedy[0]]
    sampled = llm.generate([PROMPT] * 4, [SamplingParams(temperature=1.2, seed=s, max_tokens=8, ignore_eos=True,
                                                         allowed_token_ids=allowed) for s in range(4)],
                           use_tqdm=False)
    assert all(set(o.token_ids) <= set(allowed) for o in sampled)
    vocab = llm.engine.model_config.vocab_size
    for kw, param in (({"logit_bias": {vocab: 1.0}}, "logit_bias"), ({"allowed_token_ids": [1, vocab]},
                                                                      "allowed_token_ids"),
                      ({"allowed_token_ids": sorted(llm.engine.eos_token_ids), "min_tokens": 1}, "allowed_token_ids")):
        with pytest.raises(InvalidParam) as info:
            llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4, **kw), use_tqdm=False)
        assert info.value.param == param
    assert not llm.engine.has_unfinished_requests()


def test_async_scheduling_and_graphs_give_the_synchronous_tokens(default_model) -> None:
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias={42: 9.0, 7: -5.0}),
              SamplingParams(temperature=0.9, seed=3, max_tokens=8, ignore_eos=True, allowed_token_ids=[5, 42, 99]),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]

    def run(**kw: object) -> list[list[int]]:
        config = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=48, graph_warmup="none", **kw)
        engine = LLMEngine(config, loaded=default_model, capturer=EagerCapturer() if kw else None)
        outs = LLM.from_engine(engine).generate([PROMPT] * 3, params, use_tqdm=False)
        return [o.token_ids for o in outs]

    sync = run()
    assert run(async_scheduling=True) == sync
    assert set(sync[1]) <= {5, 42, 99}
