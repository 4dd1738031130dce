"""vLLM's sampling extensions over HTTP (`min_tokens`, `min_p`, `include_stop_str_in_output`,
`skip_special_tokens`, sent with the openai client's `extra_body`): the server gives `LLM.generate` /
`LLM.chat`'s output for the same SamplingParams. The real default model on CPU, on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.server.main import serve_in_thread

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
N = 12


@dataclass
class Served:
    base_url: str
    model: str
    greedy_text: str
    stop_word: str
    expected: dict[str, Any]  # case -> LLM's output

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def served(default_model) -> Iterator[Served]:
    config = EngineConfig(device="cpu", max_model_len=256, max_num_seqs=8, num_kv_blocks=64)
    llm = LLM.from_engine(LLMEngine(config, loaded=default_model))
    greedy_text = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=N), use_tqdm=False)[0].text
    word = greedy_text.split()[1]
    short = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)[0]
    k = len(short.token_ids)
    expected = {
        "short": short,
        "min_tokens": llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=k + 6, min_tokens=k + 3),
                               use_tqdm=False)[0],
        "eos_kept": llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=64, include_stop_str_in_output=True,
                                                  skip_special_tokens=False), use_tqdm=False)[0],
    }
    with serve_in_thread(llm.engine) as (url, _):
        yield Served(url, llm.engine.model_name, greedy_text, word, expected)


def test_min_tokens_on_chat(served: Served) -> None:
    short, longer = served.expected["short"], served.expected["min_tokens"]
    k = len(short.token_ids)
    out = served.client().chat.completions.create(
        model=served.model, messages=CHAT, temperature=0, max_tokens=k + 6, extra_body={"min_tokens": k + 3})
    assert out.choices[0].message.content == longer.text != short.text
    assert out.usage.completion_tokens == len(longer.token_ids) >= k + 3


def test_include_stop_str_in_output_and_skip_special_tokens(served: Served) -> None:
    client = served.client()
    word, text = served.stop_word, served.greedy_text
    for stream in (False, True):
        r = client.completions.create(model=served.model, prompt=PROMPT, temperature=0, max_tokens=N, stop=[word],
                                      stream=stream, extra_body={"include_stop_str_in_output": True})
        chunks = list(r) if stream else [r]
        got = "".join(c.choices[0].text for c in chunks)
        assert got == text[:text.index(word) + len(word)]
        assert chunks[-1].choices[0].model_extra["stop_reason"] == word  # vLLM's field: the stop string
    kept = served.expected["eos_kept"]
    out = client.chat.completions.create(
        model=served.model, messages=CHAT, temperature=0, max_tokens=64,
        extra_body={"include_stop_str_in_output": True, "skip_special_tokens": False})
    assert out.choices[0].message.content == kept.text != served.expected["short"].text


def test_min_p_one_is_greedy_and_ranges_are_checked(served: Served) -> None:
    client = served.client()
    out = client.completions.create(model=served.model, prompt=PROMPT, temperature=1.0, seed=3, max_tokens=N,
                                    extra_body={"min_p": 1.0})
    assert out.choices[0].text == served.greedy_text
    for body, param in (({"min_p": 1.5}, "min_p"), ({"min_tokens": -1}, "min_tokens"),
                        ({"min_tokens": N + 1}, "min_tokens"), ({"skip_special_tokens": "no"}, "skip_special_tokens")):
        r = httpx.post(f"{served.base_url}/v1/completions", timeout=60,
                       json={"prompt": PROMPT, "max_tokens": N, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


def test_logit_bias_and_allowed_token_ids(served: Served) -> None:
    client = served.client()
    out = client.completions.create(model=served.model, prompt=PROMPT, temperature=0, max_tokens=4,
                                    logit_bias={"42": 100}, logprobs=0)
    assert out.choices[0].logprobs.tokens == [out.choices[0].logprobs.tokens[0]] * 4
    assert httpx.post(f"{served.base_url}/detokenize", json={"tokens": [42] * 4}).json()["prompt"] == out.choices[0].text
    drawn = client.completions.create(model=served.model, prompt=PROMPT, temperature=1.5, seed=1, max_tokens=8,
                                      logprobs=0, extra_body={"allowed_token_ids": [42, 300], "ignore_eos": True})
    texts = {httpx.post(f"{served.base_url}/detokenize", json={"tokens": [t]}).json()["prompt"] for t in (42, 300)}
    assert len(drawn.choices[0].logprobs.tokens) == 8 and set(drawn.choices[0].logprobs.tokens) <= texts
    for body, param, says in (({"logit_bias": {"x1": 1}}, "logit_bias", "token ids"),
                              ({"logit_bias": {"1" * 5000: 1}}, "logit_bias", "token ids"),
                              ({"logit_bias": {"1": 100.5}}, "logit_bias", "[-100, 100]"),
                              ({"logit_bias": {"999999": 1}}, "logit_bias", "outside the vocabulary"),
                              ({"allowed_token_ids": []}, "allowed_token_ids", "non-empty"),
                              ({"allowed_token_ids": [1], "response_format": {"type": "json_object"}},
                               "allowed_token_ids", "guided")):
        r = httpx.post(f"{served.base_url}/v1/completions", timeout=60,
                       json={"prompt": PROMPT, "max_tokens": N, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param and says in r.json()["error"]["message"], \
            (body, r.text)


def test_truncate_prompt_tokens(served: Served) -> None:
    client = served.client()
    text = "Tell me: " + PROMPT
    last = httpx.post(f"{served.base_url}/tokenize", json={"prompt": text}).json()["tokens"][-5:]
    out = client.completions.create(model=served.model, prompt=text, temperature=0, max_tokens=N, echo=True,
                                    extra_body={"truncate_prompt_tokens": 5})
    alone = client.completions.create(model=served.model, prompt=last, temperature=0, max_tokens=N, echo=True)
    assert out.usage.prompt_tokens == 5 and out.choices[0].text == alone.choices[0].text  # echo: the tokens kept
    chat = client.chat.completions.create(model=served.model, messages=CHAT, temperature=0, max_tokens=4,
                                          extra_body={"truncate_prompt_tokens": 6})
    assert chat.usage.prompt_tokens == 6
    long = client.completions.create(model=served.model, prompt=PROMPT * 100, max_tokens=4,
                                     extra_body={"truncate_prompt_tokens": -1})
    assert long.usage.prompt_tokens == 256 - 4 and long.usage.completion_tokens == 4
    for value in (0, -2, "3"):
        r = httpx.post(f"{served.base_url}/v1/completions", timeout=60,
                       json={"prompt": PROMPT, "max_tokens": N, "truncate_prompt_tokens": value})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", (value, r.text)


def test_bad_words(served: Served) -> None:
    word = served.greedy_text.split()[0]
    out = served.client().completions.create(model=served.model, prompt=PROMPT, temperature=0, max_tokens=N,
                                             extra_body={"bad_words": [word]})
    assert word not in out.choices[0].text and out.choices[0].text != served.greedy_text
    for bad in ("Paris", [""], [1]):
        r = httpx.post(f"{served.base_url}/v1/completions", timeout=60,
                       json={"prompt": PROMPT, "max_tokens": N, "bad_words": bad})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("bad_words"), (bad, r.text)
