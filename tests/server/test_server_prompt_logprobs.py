"""The prompt's logprobs over HTTP through the openai client: completions' `echo` with `logprobs` (the prompt's
tokens lead the lists, the first one's logprob null, offsets over prompt and completion; streamed, the echo
chunk carries them) and vLLM's `prompt_logprobs` on both endpoints (per choice; a chat response's once), with
transformers' values for the same tokens. The real default model on the CPU, its prompts prefilled in chunks
of 8 tokens with prefix caching on (a repeated request is scored again, not served from the cache); n > 1
and the 400s naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.server.main import serve_in_thread

PROMPT = "The capital of France is Paris, and the capital of Italy is"
OTHER = "def fibonacci(n):"
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
N = 6
TOL = 2e-3


@dataclass
class Served:
    base_url: str
    model: str
    tokenizer: object
    hf_model: torch.nn.Module

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0)

    def reference(self, ids: list[int]) -> torch.Tensor:
        """transformers' log_softmax at prompt positions 0 .. n-2 (each scores the next prompt token)."""
        with torch.no_grad():
            logits = self.hf_model(input_ids=torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits[:-1], dim=-1)


@pytest.fixture(scope="module")
def served(default_model, hf_default_model) -> Iterator[Served]:
    config = EngineConfig(device="cpu", max_model_len=256, max_num_seqs=8, num_kv_blocks=96,
                          max_num_batched_tokens=8, enable_prefix_caching=True)
    engine = LLMEngine(config, loaded=default_model)
    with serve_in_thread(engine) as (url, _):
        yield Served(url, engine.model_name, default_model[2], hf_default_model)


def _text(served: Served, token_id: int) -> str:
    return served.tokenizer.decode([token_id], skip_special_tokens=False)  # type: ignore[attr-defined]


def _echo(served: Served, stream: bool, **kw):
    return served.client().completions.create(model=served.model, prompt=PROMPT, temperature=0, max_tokens=N,
                                              echo=True, logprobs=3, stream=stream,
                                              extra_body={"ignore_eos": True}, **kw)


def test_echo_with_logprobs_leads_with_the_prompts(served: Served) -> None:
    ids = served.tokenizer.encode(PROMPT)  # type: ignore[attr-defined]
    n = len(ids)
    ref = served.reference(ids)
    r = _echo(served, False)
    plain = served.client().completions.create(model=served.model, prompt=PROMPT, temperature=0, max_tokens=N,
                                               logprobs=3, extra_body={"ignore_eos": True}).choices[0]
    choice = r.choices[0]
    lp = choice.logprobs
    assert choice.text == PROMPT + plain.text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n + N
    assert lp.tokens[:n] == [_text(served, t) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:n] == pytest.approx([ref[p, ids[p + 1]].item() for p in range(n - 1)], abs=TOL)
    for p in range(1, n):
        top = lp.top_logprobs[p]
        assert lp.tokens[p] in top and len(top) in (3, 4) and top[lp.tokens[p]] == lp.token_logprobs[p]
        assert max(top.values()) == pytest.approx(ref[p - 1].max().item(), abs=TOL)
    # the offsets run over the prompt's tokens, then the completion's
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n + N)]
    assert lp.tokens[n:] == plain.logprobs.tokens
    assert lp.token_logprobs[n:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)
    # again: the prompt is in the prefix cache, yet scored whole
    again = _echo(served, False).choices[0].logprobs
    assert again.tokens == lp.tokens and again.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    # streamed: the echo chunk carries the prompt's logprobs; the chunks add up to the collected lists
    chunks = [c.choices[0] for c in _echo(served, True) if c.choices]
    assert chunks[0].text == PROMPT and chunks[0].logprobs.tokens == lp.tokens[:n]
    assert chunks[0].logprobs.token_logprobs[0] is None
    tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    values = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset
    assert values[0] is None and values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    assert "".join(c.text for c in chunks) == choice.text


def _check_field(served: Served, field: list, ids: list[int], k: int) -> None:
    ref = served.reference(ids)
    assert len(field) == len(ids) and field[0] is None
    for p, entry in enumerate(field[1:]):
        token = ids[p + 1]
        assert str(token) in entry and len(entry) in (k, k + 1)
        mine = entry[str(token)]
        assert mine["logprob"] == pytest.approx(ref[p, token].item(), abs=TOL)
        assert mine["decoded_token"] == _text(served, token)
        assert int((ref[p] > ref[p, token] + TOL).sum()) + 1 <= mine["rank"]
        assert mine["rank"] <= int((ref[p] >= ref[p, token] - TOL).sum())
        ranked = sorted(entry.items(), key=lambda kv: kv[1]["rank"])[:k]
        assert [v["rank"] for _, v in ranked] == list(range(1, k + 1))
        assert [v["logprob"] for _, v in ranked] == pytest.approx(ref[p, [int(t) for t, _ in ranked]].tolist(),
                                                                  abs=TOL)


def test_prompt_logprobs_per_choice_on_completions(served: Served) -> None:
    client = served.client()
    r = client.completions.create(model=served.model, prompt=[PROMPT, OTHER], n=2, temperature=0, max_tokens=3,
                                  extra_body={"prompt_logprobs": 2})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for i, prompt in enumerate((PROMPT, OTHER)):
        ids = served.tokenizer.encode(prompt)  # type: ignore[attr-defined]
        for choice in r.choices[2 * i:2 * i + 2]:
            assert choice.logprobs is None  # not asked
            _check_field(served, choice.model_extra["prompt_logprobs"], ids, 2)
    first, second = (c.model_extra["prompt_logprobs"] for c in r.choices[:2])
    assert [e and sorted(e) for e in first] == [e and sorted(e) for e in second]
    assert [v["logprob"] for e in first[1:] for v in e.values()] == pytest.approx(
        [v["logprob"] for e in second[1:] for v in e.values()], abs=1e-5)
    # without the field, none is sent
    bare = client.completions.create(model=served.model, prompt=PROMPT, max_tokens=1)
    assert "prompt_logprobs" not in (bare.choices[0].model_extra or {})
    zero = client.completions.create(model=served.model, prompt=OTHER, max_tokens=1,
                                     extra_body={"prompt_logprobs": 0}).choices[0].model_extra["prompt_logprobs"]
    assert all(len(e) == 1 for e in zero[1:])


def test_prompt_logprobs_once_on_chat(served: Served) -> None:
    r = served.client().chat.completions.create(model=served.model, messages=CHAT, n=2, temperature=0,
                                                max_tokens=3, extra_body={"prompt_logprobs": 1})
    ids = served.tokenizer.apply_chat_template(CHAT)  # type: ignore[attr-defined]
    assert r.usage.prompt_tokens == len(ids)
    _check_field(served, r.model_extra["prompt_logprobs"], ids, 1)
    assert all("prompt_logprobs" not in (c.model_extra or {}) for c in r.choices)


def test_refusals_name_the_field(served: Served) -> None:
    chat = {"messages": CHAT, "max_tokens": 2}
    done = {"prompt": "hi", "max_tokens": 2}
    cases = [
        ("/v1/completions", {**done, "prompt_logprobs": -1}, "prompt_logprobs"),
        ("/v1/completions", {**done, "prompt_logprobs": 21}, "prompt_logprobs"),
        ("/v1/completions", {**done, "prompt_logprobs": "many"}, "prompt_logprobs"),
        ("/v1/completions", {**done, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ("/v1/completions", {**done, "echo": True, "logprobs": 21}, "logprobs"),
        ("/v1/chat/completions", {**chat, "prompt_logprobs": 30}, "prompt_logprobs"),
        ("/v1/chat/completions", {**chat, "prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
    ]
    with httpx.Client(base_url=served.base_url, timeout=60) as http:
        for path, body, param in cases:
            r = http.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
