"""vLLM's sampling extensions: `min_tokens`, `min_p`, `include_stop_str_in_output`, `skip_special_tokens`;
the sampler on hand-made logits, then the engine on the default model (CPU)."""

from __future__ import annotations

import pytest
import torch

from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import InvalidParam
from graphpool.engine.sequence import Sequence

EOS = 3
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
PROMPT = "The capital of France is"


def _seq(rid: str, n_out: int, stop_ids: frozenset[int] = frozenset({EOS}), seed: int | None = None,
         **params: object) -> Sequence:
    gen = None
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
    seq = Sequence(rid, [1, 2], SamplingParams(**params), stop_ids, gen)  # type: ignore[arg-type]
    seq.token_ids.extend([5] * n_out)
    return seq


def test_params_are_validated() -> None:
    for kw, param in (({"min_tokens": 5, "max_tokens": 4}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
                      ({"min_p": 1.5}, "min_p"), ({"min_p": float("nan")}, "min_p"),
                      ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
                      ({"skip_special_tokens": None}, "skip_special_tokens")):
        with pytest.raises(InvalidParam) as info:
            SamplingParams(**kw)  # type: ignore[arg-type]
        assert info.value.param == param


def test_min_tokens_masks_the_stop_ids_until_reached() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.zeros(3, 8)
    logits[:, EOS] = 10.0  # EOS is every row's argmax
    logits[:, 6] = 5.0  # then 6
    logits[:, 7] = 4.0  # then 7 (a stop_token_id of the second row)
    seqs = [
        _seq("held", 1, temperature=0, max_tokens=8, min_tokens=2),  # 1 output < 2: EOS is masked
        _seq("held2", 0, frozenset({EOS, 6}), temperature=0, max_tokens=8, min_tokens=1),
        _seq("reached", 2, temperature=0, max_tokens=8, min_tokens=2),
    ]
    before = logits.clone()
    assert sampler.sample(logits, seqs).tolist() == [6, 7, EOS]
    assert torch.equal(logits, before)  # the caller's buffer is untouched
    sampled = [_seq(f"s{i}", 0, seed=i, temperature=1.0, max_tokens=8, min_tokens=1) for i in range(32)]
    assert EOS not in sampler.sample(torch.zeros(32, 8), sampled).tolist()


def test_min_p_keeps_only_tokens_near_the_top_one() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(400, 1)

    def draws(min_p: float) -> set[int]:
        seqs = [_seq(f"r{i}", 0, seed=i, temperature=1.0, min_p=min_p) for i in range(400)]
        return set(sampler.sample(logits, seqs).tolist())

    assert draws(0.0) == {0, 1, 2, 3}
    assert draws(0.5) == {0, 1}  # 0.3 >= 0.5 * 0.5 > 0.15
    assert draws(1.0) == {0}


@pytest.fixture(scope="module")
def llm(default_model) -> LLM:
    config = EngineConfig(device="cpu", max_model_len=256, num_kv_blocks=64)
    return LLM.from_engine(LLMEngine(config, loaded=default_model))


def _greedy(**kw: object) -> SamplingParams:
    return SamplingParams(temperature=0, **kw)  # type: ignore[arg-type]


def test_min_tokens_goes_past_the_eos_greedy_would_stop_at(llm: LLM) -> None:
    short = llm.chat(CHAT, _greedy(max_tokens=64), use_tqdm=False)[0]
    assert short.finish_reason == "stop" and short.token_ids[-1] in llm.engine.eos_token_ids
    k = len(short.token_ids)
    longer = llm.chat(CHAT, _greedy(max_tokens=k + 6, min_tokens=k + 3), use_tqdm=False)[0]
    assert longer.token_ids[:k - 1] == short.token_ids[:-1]  # the same greedy path up to the EOS...
    assert longer.token_ids[k - 1] not in llm.engine.eos_token_ids  # ...where the EOS was held back
    assert len(longer.token_ids) >= k + 3
    assert not set(longer.token_ids[:k + 3]) & set(llm.engine.eos_token_ids)


def test_min_tokens_holds_stop_strings_back_too(llm: LLM) -> None:
    text = llm.generate(PROMPT, _greedy(max_tokens=12), use_tqdm=False)[0].text
    word = text.split()[0]
    stopped = llm.generate(PROMPT, _greedy(max_tokens=12, stop=["never there", word]), use_tqdm=False)[0]
    assert stopped.finish_reason == "stop" and stopped.text == text[:text.index(word)]
    assert stopped.outputs[0].stop_reason == word  # vLLM's: the stop string that ended it
    held = llm.generate(PROMPT, _greedy(max_tokens=12, stop=[word], min_tokens=12), use_tqdm=False)[0]
    assert held.text == text and held.finish_reason == "length" and held.stop_reason is None
    greedy = llm.generate(PROMPT, _greedy(max_tokens=12), use_tqdm=False)[0].token_ids
    by_id = llm.generate(PROMPT, _greedy(max_tokens=12, stop_token_ids=[greedy[2]]), use_tqdm=False)[0]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == greedy[2] and by_id.token_ids == greedy[:3]


def test_include_stop_str_in_output_keeps_the_stop_string_and_token(llm: LLM) -> None:
    text = llm.generate(PROMPT, _greedy(max_tokens=12), use_tqdm=False)[0].text
    word = text.split()[1]
    kept = llm.generate(PROMPT, _greedy(max_tokens=12, stop=[word], include_stop_str_in_output=True),
                        use_tqdm=False)[0]
    assert kept.finish_reason == "stop" and kept.text == text[:text.index(word) + len(word)]
    plain = llm.chat(CHAT, _greedy(max_tokens=64), use_tqdm=False)[0]
    eos_text = llm.tokenizer.decode(plain.token_ids[-1:], skip_special_tokens=False)
    with_eos = llm.chat(CHAT, _greedy(max_tokens=64, include_stop_str_in_output=True, skip_special_tokens=False),
                        use_tqdm=False)[0]
    assert with_eos.text == plain.text + eos_text and eos_text.startswith("<|")


def test_skip_special_tokens_false_keeps_special_tokens_in_the_text(llm: LLM) -> None:
    k = len(llm.chat(CHAT, _greedy(max_tokens=64), use_tqdm=False)[0].token_ids)
    params = {"max_tokens": k + 4, "ignore_eos": True}  # past the EOS, which is then an ordinary token
    skipped = llm.chat(CHAT, _greedy(**params), use_tqdm=False)[0]
    kept = llm.chat(CHAT, _greedy(skip_special_tokens=False, **params), use_tqdm=False)[0]
    assert skipped.token_ids == kept.token_ids
    eos_text = llm.tokenizer.decode(kept.token_ids[k - 1:k], skip_special_tokens=False)
    assert eos_text in kept.text and eos_text not in skipped.text
    assert kept.text == llm.tokenizer.decode(kept.token_ids, skip_special_tokens=False)


def test_min_p_one_samples_like_greedy(llm: LLM) -> None:
    greedy = llm.generate(PROMPT, _greedy(max_tokens=10), use_tqdm=False)[0]
    for seed in (1, 2):
        out = llm.generate(PROMPT, SamplingParams(temperature=1.0, min_p=1.0, seed=seed, max_tokens=10),
                           use_tqdm=False)[0]
        assert out.token_ids == greedy.token_ids
    loose = [llm.generate(PROMPT, SamplingParams(temperature=1.5, seed=s, max_tokens=10), use_tqdm=False)[0]
             for s in (1, 2)]
    assert any(o.token_ids != greedy.token_ids for o in loose)  # the seeds do sample without min_p


def test_min_tokens_with_every_token_a_stop_token_is_refused(llm: LLM) -> None:
    """Nothing would be left to sample (the draw over an all -inf row took token 0); without min_tokens the
    first token simply stops the request."""
    vocab = llm.engine.model_config.vocab_size
    every = list(range(vocab))
    with pytest.raises(InvalidParam, match="whole vocabulary"):
        llm.generate(PROMPT, _greedy(max_tokens=3, min_tokens=2, stop_token_ids=every), use_tqdm=False)
    out = llm.generate(PROMPT, _greedy(max_tokens=3, stop_token_ids=every), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and len(out.token_ids) == 1
