"""What OpenAI/vLLM clients send beyond one prompt: prompt lists, token-id prompts, penalties, models.retrieve;
and what the server must refuse with a 400 naming the field (lone surrogates, seeds torch cannot take,
stop_token_ids outside the vocabulary). The real default model on CPU, served over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
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

MAX_MODEL_LEN = 256
PROMPTS = ["The capital of France is", "1, 2, 1, 2, 1, 2, 1, 2,", "Once upon a time"]
N = 12
PENALTIES = {"presence_penalty": 1.5, "frequency_penalty": 1.0, "repetition_penalty": 1.3}
CHAT = [{"role": "user", "content": "Count from 1 to 20."}]
SURROGATE = "a\ud800b"


@dataclass
class Served:
    base_url: str
    model: str
    vocab: int
    ids: list[list[int]]  # PROMPTS tokenized
    greedy: list[str]  # PROMPTS, greedy
    greedy_tokens: int  # completion tokens of all PROMPTS, greedy
    penalised: list[str]  # PROMPTS, greedy with PENALTIES
    chat_greedy: str
    chat_penalised: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def served(default_model) -> Iterator[Served]:
    config = EngineConfig(device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=16, num_kv_blocks=96)
    llm = LLM.from_engine(LLMEngine(config, loaded=default_model))
    greedy = SamplingParams(temperature=0, max_tokens=N)
    penalised = SamplingParams(temperature=0, max_tokens=N, **PENALTIES)
    # NOTE: one prompt at a time (batch composition cannot matter for greedy rows, but keep it simple).
    outs = [llm.generate(p, greedy, use_tqdm=False)[0] for p in PROMPTS]
    texts = [o.text for o in outs]
    pen = [llm.generate(p, penalised, use_tqdm=False)[0].text for p in PROMPTS]
    chat = llm.chat(CHAT, greedy, use_tqdm=False)[0].text
    chat_pen = llm.chat(CHAT, penalised, use_tqdm=False)[0].text
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    vocab = llm.engine.model_config.vocab_size
    _engine_refusals(llm, vocab)
    with serve_in_thread(llm.engine) as (base_url, _):
        num = sum(len(o.token_ids) for o in outs)
        yield Served(base_url, llm.engine.model_name, vocab, ids, texts, num, pen, chat, chat_pen)


def _engine_refusals(llm: LLM, vocab: int) -> None:
    """The Python API refuses what the server refuses, with a ValueError naming the field."""
    with pytest.raises(ValueError, match="prompt holds a lone UTF-16 surrogate") as info:
        llm.generate(SURROGATE, use_tqdm=False)
    assert info.value.param == "prompt"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"messages\[1\]\.content holds a lone"):
        llm.chat([{"role": "system", "content": "hi"}, {"role": "user", "content": SURROGATE}], use_tqdm=False)
    with pytest.raises(ValueError, match="stop_token_ids") as info:
        llm.engine.add_request("x", [1, 2], SamplingParams(stop_token_ids=[3, vocab]))
    assert info.value.param == "stop_token_ids"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="seed"):
        llm.generate("hi", SamplingParams(seed=2**70), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def _local_port(r: httpx.Response) -> int:
    return r.extensions["network_stream"].get_extra_info("socket").getsockname()[1]


def test_lone_surrogate_is_a_400_and_the_connection_survives(served: Served) -> None:
    # NOTE: raw bytes: the JSON escape "\ud800" as a client sends it (json.dumps writes it the same way).
    bodies = [
        ("/v1/completions", {"prompt": SURROGATE, "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"prompt": ["ok", SURROGATE], "max_tokens": 2}, "prompt[1]"),
        ("/v1/completions", {"prompt": "ok", "stop": [SURROGATE], "max_tokens": 2}, "stop"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": SURROGATE}]}, "messages[0].content"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]},
         "messages[0].content"),
        ("/v1/completions", {"model": SURROGATE, "prompt": "ok"}, "model"),
    ]  # fmt: skip
    with httpx.Client(base_url=served.base_url, timeout=60) as http:
        ports = set()
        for path, body, param in bodies:
            raw = json.dumps(body).encode()
            assert b"\\ud800" in raw
            r = http.post(path, content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (body, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/json")
            error = r.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error", error
            ports.add(_local_port(r))
            ok = http.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": N, "temperature": 0})
            assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == served.greedy[0]
            ports.add(_local_port(ok))
        assert len(ports) == 1  # one keep-alive connection throughout


def test_seed_and_stop_token_ids_are_checked(served: Served) -> None:
    cases = [
        ({"seed": 2**70}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop_token_ids": [served.vocab]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": [1, served.vocab]}, "prompt"),
        ({"prompt": [[1, 2], [3, served.vocab]]}, "prompt[1]"),
        ({"prompt": ["fine", ""]}, "prompt[1]"),
    ]
    with httpx.Client(base_url=served.base_url, timeout=60) as http:
        for extra, param in cases:
            r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, **extra})
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["param"] == param, (extra, r.json())
        for seed in (2**64 - 1, -(2**63)):
            r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "seed": seed})
            assert r.status_code == 200, r.text
        r = http.post(
            "/v1/chat/completions",
            json={"messages": CHAT, "max_tokens": 2, "stop_token_ids": [served.vocab + 5]},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids"
        # NOTE: OpenAI's prompt is one string, one token-id list, or a list of only strings or only lists.
        r = http.post("/v1/completions", json={"prompt": ["text", [1, 2]], "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("prompt")


def test_prompt_lists_one_choice_each(served: Served) -> None:
    client = served.client()
    for prompt in (PROMPTS, served.ids):
        r = client.completions.create(model=served.model, prompt=prompt, max_tokens=N, temperature=0)
        assert [c.index for c in r.choices] == [0, 1, 2]
        assert [c.text for c in r.choices] == served.greedy
        assert r.usage is not None and r.usage.prompt_tokens == sum(len(i) for i in served.ids)
        assert r.usage.completion_tokens == served.greedy_tokens
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    single = client.completions.create(model=served.model, prompt=served.ids[1], max_tokens=N, temperature=0)
    assert [c.text for c in single.choices] == [served.greedy[1]]
    echoed = client.completions.create(
        model=served.model, prompt=[served.ids[0], served.ids[2]], max_tokens=N, temperature=0, echo=True
    )
    assert [c.text for c in echoed.choices] == [PROMPTS[0] + served.greedy[0], PROMPTS[2] + served.greedy[2]]


def test_prompt_lists_streamed_by_index(served: Served) -> None:
    chunks = list(
        served.client().completions.create(
            model=served.model, prompt=PROMPTS, max_tokens=N, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    texts = ["", "", ""]
    reasons: list[list[str]] = [[], [], []]
    for c in chunks[:-1]:
        assert len(c.choices) == 1
        texts[c.choices[0].index] += c.choices[0].text
        if c.choices[0].finish_reason is not None:
            reasons[c.choices[0].index].append(c.choices[0].finish_reason)
    assert texts == served.greedy
    assert all(len(r) == 1 and r[0] in ("stop", "length") for r in reasons)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens == sum(len(i) for i in served.ids)
    assert usage.completion_tokens == served.greedy_tokens


def test_penalties_on_both_endpoints_equal_llm(served: Served) -> None:
    client = served.client()
    r = client.completions.create(
        model=served.model, prompt=PROMPTS, max_tokens=N, temperature=0,
        presence_penalty=PENALTIES["presence_penalty"], frequency_penalty=PENALTIES["frequency_penalty"],
        extra_body={"repetition_penalty": PENALTIES["repetition_penalty"]},
    )  # fmt: skip
    assert [c.text for c in r.choices] == served.penalised
    # NOTE: the repetitive prompt continues its pattern greedily; the penalties must break it.
    assert served.penalised[1] != served.greedy[1]
    chat = client.chat.completions.create(
        model=served.model, messages=CHAT, max_tokens=N, temperature=0,  # type: ignore[arg-type]
        presence_penalty=PENALTIES["presence_penalty"], frequency_penalty=PENALTIES["frequency_penalty"],
        extra_body={"repetition_penalty": PENALTIES["repetition_penalty"]},
    )  # fmt: skip
    assert chat.choices[0].message.content == served.chat_penalised
    neutral = client.chat.completions.create(
        model=served.model, messages=CHAT, max_tokens=N, temperature=0,  # type: ignore[arg-type]
        presence_penalty=0, frequency_penalty=0, extra_body={"repetition_penalty": 1},
    )  # fmt: skip
    assert neutral.choices[0].message.content == served.chat_greedy


def test_models_retrieve(served: Served) -> None:
    client = served.client()
    card = client.models.retrieve(served.model)
    assert card.id == served.model and card.object == "model"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    body: Any = info.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    r = httpx.get(f"{served.base_url}/v1/models/org/no-such-model")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
