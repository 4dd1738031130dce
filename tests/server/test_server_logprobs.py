"""`logprobs` / `top_logprobs` and `n` over HTTP through the openai client: OpenAI's shapes on both endpoints,
streamed and collected, with the engine's own values (SamplingParams.logprobs) for the same greedy request;
`n` choices of one prompt (greedy: identical; seeded: choice i as a lone request with seed + i), and a client
that hangs up frees all of them. The real default model on CPU, on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.logprobs import TokenLogprob
from graphpool.server.main import serve_in_thread
from server_checks import scrape, wait_kv_idle

PROMPT = "The capital of France is"
OTHER = "def fibonacci(n):"
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
N = 10
TOL = 1e-4


@dataclass
class Served:
    base_url: str
    model: str
    reference: list[TokenLogprob]  # the engine's greedy logprobs for PROMPT, 4 top each
    greedy: dict[str, str]  # prompt -> greedy text

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def served(default_model) -> Iterator[Served]:
    config = EngineConfig(device="cpu", max_model_len=256, max_num_seqs=8, num_kv_blocks=96)
    engine = LLMEngine(config, loaded=default_model)
    engine.add_request("ref", PROMPT, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, logprobs=4))
    final = None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.finished), final)
    assert final is not None and final.logprobs is not None
    llm = LLM.from_engine(engine)
    greedy = {p: llm.generate(p, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True), use_tqdm=False)[0].text
              for p in (PROMPT, OTHER)}
    with serve_in_thread(engine) as (url, _):
        yield Served(url, engine.model_name, final.logprobs, greedy)


def _completion(served: Served, stream: bool, extra: dict | None = None, **kw):
    return served.client().completions.create(model=served.model, prompt=PROMPT, temperature=0, max_tokens=N,
                                              stream=stream, extra_body={"ignore_eos": True, **(extra or {})}, **kw)


def test_completion_logprobs_are_the_engines(served: Served) -> None:
    r = _completion(served, False, logprobs=4)
    lp = r.choices[0].logprobs
    assert lp is not None and r.usage.completion_tokens == N == len(lp.tokens) == len(lp.token_logprobs)
    assert lp.token_logprobs == pytest.approx([t.logprob for t in served.reference], abs=TOL)
    assert lp.text_offset[0] == 0
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(N)]
    for token, value, top, ref in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, served.reference, strict=True):
        assert len(top) == 4  # greedy: the sampled token is the top one, so no fifth entry
        assert max(top.values()) == pytest.approx(value) and top[token] == pytest.approx(value)
        assert sorted(top.values(), reverse=True) == pytest.approx([v for _, v in ref.top], abs=TOL)
    # streamed: the chunks' logprobs add up to the same lists
    chunks = [c.choices[0] for c in _completion(served, True, logprobs=4) if c.choices]
    tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    values = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
    assert tokens == lp.tokens and values == pytest.approx(lp.token_logprobs, abs=TOL) and offsets == lp.text_offset
    assert "".join(c.text for c in chunks) == r.choices[0].text == served.greedy[PROMPT]
    # logprobs=0: the sampled token alone; none asked: null
    zero = _completion(served, False, logprobs=0).choices[0].logprobs
    assert zero is not None and all(len(top) == 1 for top in zero.top_logprobs)
    assert _completion(served, False).choices[0].logprobs is None


def test_chat_logprobs_shape_streamed_and_collected(served: Served) -> None:
    client = served.client()
    kw = {"model": served.model, "messages": CHAT, "temperature": 0, "max_tokens": N, "logprobs": True,
          "extra_body": {"ignore_eos": True}}
    r = client.chat.completions.create(top_logprobs=3, **kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == N
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob) and entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8") == entry.token
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs),
                                                                  reverse=True)
    streamed = [e for c in client.chat.completions.create(stream=True, top_logprobs=3, **kw)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=TOL)
    bare = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert [e.top_logprobs for e in bare] == [[]] * N
    assert [e.logprob for e in bare] == pytest.approx([e.logprob for e in content], abs=TOL)
    assert client.chat.completions.create(**{**kw, "logprobs": False}).choices[0].logprobs is None


def test_return_tokens_as_token_ids_names_tokens_by_id(served: Served) -> None:
    ids = [t.token_id for t in served.reference]
    lp = _completion(served, False, {"return_tokens_as_token_ids": True}, logprobs=2).choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in ids]
    assert all(set(top) == {f"token_id:{t}" for t, _ in ref.top[:2]} for top, ref in zip(lp.top_logprobs,
                                                                                          served.reference, strict=True))
    texts = _completion(served, False, logprobs=0).choices[0].logprobs.tokens
    chat = served.client().chat.completions.create(
        model=served.model, messages=CHAT, temperature=0, max_tokens=N, logprobs=True, top_logprobs=1,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}).choices[0].logprobs.content
    assert all(e.token.startswith("token_id:") and e.top_logprobs[0].token == e.token for e in chat)
    assert texts == _completion(served, False, logprobs=0).choices[0].logprobs.tokens  # the shared cache unchanged
    assert texts[0] == served.greedy[PROMPT][:len(texts[0])]


def test_refusals_name_the_field(served: Served) -> None:
    chat = {"messages": CHAT, "max_tokens": 2}
    cases = [
        ("/v1/chat/completions", {**chat, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 3}, "best_of"),
        ("/v1/completions", {"prompt": "hi", "best_of": 2}, "best_of"),
    ]
    with httpx.Client(base_url=served.base_url, timeout=60) as http:
        for path, body, param in cases:
            r = http.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        assert http.post("/v1/completions", json={"prompt": "hi", "n": 2, "best_of": 2, "max_tokens": 1}
                         ).status_code == 200


def test_n_greedy_choices_are_identical_and_prompts_fan_out(served: Served) -> None:
    client = served.client()
    r = client.completions.create(model=served.model, prompt=[PROMPT, OTHER], n=2, temperature=0, max_tokens=N,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [served.greedy[PROMPT]] * 2 + [served.greedy[OTHER]] * 2
    one = client.completions.create(model=served.model, prompt=[PROMPT, OTHER], temperature=0, max_tokens=1)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # each prompt counted once
    assert r.usage.completion_tokens == 4 * N
    chat = client.chat.completions.create(model=served.model, messages=CHAT, n=3, temperature=0, max_tokens=N)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert len({c.message.content for c in chat.choices}) == 1 and chat.choices[0].message.content


def test_n_seeded_choices_are_lone_requests_with_derived_seeds(served: Served) -> None:
    client = served.client()
    kw = {"model": served.model, "prompt": PROMPT, "temperature": 1.0, "max_tokens": N,
          "extra_body": {"ignore_eos": True}}
    r = client.completions.create(n=3, seed=40, **kw)
    alone = [client.completions.create(seed=40 + i, **kw).choices[0].text for i in range(3)]
    assert [c.text for c in r.choices] == alone
    assert len(set(alone)) > 1
    # streamed chat: per-choice deltas, each choice as the collected one
    ckw = {"model": served.model, "messages": CHAT, "temperature": 1.0, "max_tokens": N, "n": 2, "seed": 9}
    collected = client.chat.completions.create(**ckw)
    texts, roles, reasons = ["", ""], [0, 0], [None, None]
    for c in client.chat.completions.create(stream=True, **ckw):
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            roles[ch.index] += ch.delta.role == "assistant"
            reasons[ch.index] = ch.finish_reason or reasons[ch.index]
    assert texts == [c.message.content for c in collected.choices] and roles == [1, 1]
    assert reasons == [c.finish_reason for c in collected.choices]


def test_a_hang_up_frees_all_n(served: Served) -> None:
    idle = wait_kv_idle(served.base_url)
    aborted = ("graphpool_requests_finished_total", (("reason", "abort"),))
    body = {"prompt": "Write a long story about a dragon.", "max_tokens": 200, "ignore_eos": True, "n": 4,
            "stream": True, "logprobs": 2}
    with httpx.Client(base_url=served.base_url, timeout=60) as http, \
            http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        seen: set[int] = set()
        while len(seen) < 4:  # every choice has made a token
            line = next(lines)
            if line.startswith("data: {"):
                seen.add(json.loads(line[6:])["choices"][0]["index"])
        busy = scrape(served.base_url)
        assert busy[("graphpool_requests_running", ())] == 4
    after = wait_kv_idle(served.base_url)
    assert after[("graphpool_kv_blocks_free", ())] == idle[("graphpool_kv_blocks_free", ())]
    assert after[aborted] - idle.get(aborted, 0) == 4
