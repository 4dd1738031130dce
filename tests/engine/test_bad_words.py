"""vLLM's `bad_words`: the words' token sequences (as written and after a space), the ban of the token that would
complete one, and the engine on the default model (CPU), synchronous and with async scheduling through the pool's
stand-in capturer (a word of several tokens keeps the lookahead off)."""

from __future__ import annotations

import pytest
import torch

from graphpool import LLM, SamplingParams
from graphpool.engine.bad_words import bad_word_ids, banned_tokens, needs_history
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.guided import GuidedDecoding
from graphpool.engine.sampling_params import InvalidParam
from graphpool.engine.sequence import Sequence
from graphpool.pool.testing import EagerCapturer

PROMPT = "The capital of France is"


def test_a_word_is_banned_once_its_other_tokens_are_there() -> None:
    seq = Sequence("r", [1, 2], SamplingParams(), frozenset(), None)
    seq.bad_words = ((7,), (3, 4, 5))
    assert banned_tokens(seq) == [7] and needs_history(seq)
    seq.token_ids += [3, 4]
    assert banned_tokens(seq) == [7, 5]
    seq.token_ids += [9]
    assert banned_tokens(seq) == [7]
    for bad in ([""], ["  "], "Paris", [3]):
        with pytest.raises(InvalidParam):
            SamplingParams(bad_words=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidParam, match="guided"):
        SamplingParams(bad_words=["x"], guided=GuidedDecoding("json_object"))


def test_the_engine_never_writes_a_bad_word(default_model) -> None:
    tok = default_model[2]
    ids = bad_word_ids(["Paris"], tok)
    assert tuple(tok.encode(" Paris", add_special_tokens=False)) in ids and len(ids) == 2

    def run(**kw: object) -> list[str]:
        config = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=48, graph_warmup="none", **kw)
        llm = LLM.from_engine(LLMEngine(config, loaded=default_model, capturer=EagerCapturer() if kw else None))
        params = [SamplingParams(temperature=0, max_tokens=12, bad_words=words) for words in (None, ["Paris"])]
        params.append(SamplingParams(temperature=1.0, seed=5, max_tokens=12, bad_words=["Paris", "France"]))
        return [o.text for o in llm.generate([PROMPT] * 3, params, use_tqdm=False)]

    plain, banned, sampled = run()
    assert "Paris" in plain and "Paris" not in banned and not {"Paris", "France"} & set(sampled.split())
    assert run(async_scheduling=True) == [plain, banned, sampled]
    out = torch.tensor(tok.encode(banned, add_special_tokens=False))
    assert not any(out[i:i + len(w)].tolist() == list(w) for w in ids for i in range(len(out)))
