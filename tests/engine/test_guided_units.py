"""Guided decoding's pieces on the default model's tokenizer (no model): `GuidedDecoding`'s checks, the
compiled-grammar cache and its errors, the token mask against what the grammar accepts, and the sampler taking
the masked argmax instead of the decode graph's stale one."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from graphpool.engine.grammar import Grammars, apply_guides
from graphpool.engine.guided import GuidedDecoding
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import InvalidParam, SamplingParams
from graphpool.engine.sequence import Sequence
from graphpool.model.gguf_loader import default_gguf_path, gguf_tokenizer_metadata, open_gguf
from graphpool.model.tokenizer import Tokenizer, hf_tokenizer_from_gguf_metadata

# NOTE: looked up, not imported: xgrammar takes ~1 s to import, at collection in every xdist worker
pytestmark = pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="xgrammar is not installed")
VOCAB = 49152  # the default model's logits width


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    hf = hf_tokenizer_from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(default_gguf_path())))
    if hf is None:
        pytest.skip("this transformers has no GGUF tokenizer converter (< 5.0)")
    return Tokenizer(hf)


@pytest.fixture(scope="module")
def grammars(tokenizer: Tokenizer) -> Grammars:
    return Grammars(tokenizer, VOCAB, tokenizer.eos_token_ids)


@pytest.mark.parametrize(("kind", "spec", "words"), [
    ("xml", "", "must be one of"),
    ("json_object", "{}", "takes no spec"),
    ("regex", "", "non-empty spec"),
    ("json_schema", "[1, 2]", "must be a JSON object"),
    ("json_schema", "{not json", "not valid JSON"),
    ("choice", '["a", 1]', "non-empty JSON list of strings"),
    ("choice", "[]", "non-empty JSON list of strings"),
    ("choice", '"a"', "non-empty JSON list of strings"),
    ("grammar", 'root ::= "\ud800"', "lone UTF-16 surrogate"),
])
def test_a_malformed_spec_is_refused(kind: str, spec: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        GuidedDecoding(kind, spec)  # type: ignore[arg-type]


def test_sampling_params_take_one_guided_constraint_and_refuse_what_contradicts_it() -> None:
    guided = GuidedDecoding("choice", '["a", "b"]')
    assert SamplingParams(guided=guided).guided.choices == ["a", "b"]
    for kwargs, param in (({"ignore_eos": True}, "ignore_eos"), ({"min_tokens": 2}, "min_tokens")):
        with pytest.raises(InvalidParam) as e:
            SamplingParams(guided=guided, **kwargs)
        assert e.value.param == param and "guided" in str(e.value)
    with pytest.raises(InvalidParam) as e:
        SamplingParams(guided={"regex": "a+"})  # type: ignore[arg-type]
    assert e.value.param == "guided"


@pytest.mark.parametrize(("guided", "words"), [
    (GuidedDecoding("regex", "(abc"), "parenthesis"),
    (GuidedDecoding("json_schema", '{"type": "foo"}'), "foo"),
    (GuidedDecoding("grammar", "root ::= "), "EBNF"),
    (GuidedDecoding("grammar", 'start: "a"'), "EBNF"),
])
def test_a_spec_that_does_not_compile_is_an_invalid_guided_param(grammars: Grammars, guided: GuidedDecoding,
                                                                 words: str) -> None:
    with pytest.raises(InvalidParam) as e:
        grammars.compile(guided)
    message = str(e.value)
    assert e.value.param == "guided" and guided.kind in message and words in message
    assert "/project/" not in message and ".cc:" not in message  # the C++ location is left out


def test_compiled_grammars_are_cached_by_spec_and_bounded(tokenizer: Tokenizer) -> None:
    grammars = Grammars(tokenizer, VOCAB, tokenizer.eos_token_ids, cache_size=2)
    a, b, c = (GuidedDecoding("regex", r) for r in ("a+", "b+", "c+"))
    first = grammars.compile(a)
    assert grammars.compile(GuidedDecoding("regex", "a+")) is first  # an equal spec: the same compiled grammar
    grammars.compile(b)
    grammars.compile(c)  # evicts a, the least recently used
    assert grammars.compile(c) is grammars.compile(c) and grammars.compile(a) is not first


def test_a_model_without_tokenizer_refuses_guided_decoding() -> None:
    with pytest.raises(InvalidParam, match="no tokenizer") as e:
        Grammars(None, 128, [0]).compile(GuidedDecoding("regex", "a"))
    assert e.value.param == "guided"


def _allowed(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def test_the_mask_allows_exactly_the_tokens_that_continue_a_choice(grammars: Grammars,
                                                                   tokenizer: Tokenizer) -> None:
    choices = ["yes", "no way"]
    guide = grammars.guide(GuidedDecoding("choice", json.dumps(choices)), tokenizer.eos_token_ids)
    logits = torch.zeros(3, VOCAB + 8)  # wider than the vocabulary: padding ids must be masked too
    apply_guides(logits, [guide], [1])
    assert _allowed(logits[0]) == _allowed(logits[2]) == set(range(VOCAB + 8))  # unguided rows untouched
    want = {t for t in range(VOCAB) if (s := tokenizer.decode([t], skip_special_tokens=False))
            and any(c.startswith(s) for c in choices)}
    assert _allowed(logits[1]) == want and len(want) >= 4
    # "no" accepted: only " way"'s prefixes go on, then nothing but a stop token
    assert not guide.accept(tokenizer.encode("no")[0])
    logits = torch.zeros(1, VOCAB)
    apply_guides(logits, [guide], [0])
    assert all(" way".startswith(tokenizer.decode([t])) for t in _allowed(logits[0]))
    for t in tokenizer.encode(" way"):
        assert not guide.accept(t)
    logits = torch.zeros(1, VOCAB)
    apply_guides(logits, [guide], [0])
    assert _allowed(logits[0]) == set(tokenizer.eos_token_ids)
    assert guide.accept(tokenizer.eos_token_ids[0])  # the stop token ends the grammar


def test_the_sampler_takes_the_masked_argmax(grammars: Grammars, tokenizer: Tokenizer) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, VOCAB)
    stale = logits.argmax(dim=-1)  # before any mask
    seqs = []
    for i in range(2):
        params = SamplingParams(temperature=0, guided=GuidedDecoding("regex", "[0-9]+") if i else None)
        seq = Sequence(f"r{i}", [1, 2, 3], params, frozenset(tokenizer.eos_token_ids), None)
        if params.guided is not None:
            seq.guide = grammars.guide(params.guided, seq.stop_ids)
        seqs.append(seq)
    tokens = Sampler(torch.device("cpu"), 0).sample(logits, seqs).tolist()
    digits = [t for t in range(VOCAB) if (s := tokenizer.decode([t])) and s.isascii() and s.isdigit()]
    assert tokens[0] == int(stale[0])
    assert tokens[1] in digits and tokens[1] == max(digits, key=lambda t: float(logits[1, t]))
    assert tokens[1] != int(stale[1])
