"""The server on the real default model (SmolLM2-135M-Instruct, CPU), queried over HTTP on 127.0.0.1.

One server per module: greedy references come from `LLM.generate` / `LLM.chat` on the same engine before
the server takes it over (afterwards only the server's engine thread touches it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.server.main import serve_in_thread
from server_checks import check_disconnects_free_kv, concurrent_streams

MAX_MODEL_LEN = 256
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
CHAT = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
]
MAX_TOKENS = 8
STOP = ["\n", "answer"]


@dataclass
class Served:
    base_url: str
    model: str
    completions: dict[str, str]  # prompt -> greedy text
    chats: list[str]  # greedy reply per CHAT conversation
    stopped: tuple[str, str | None]  # PROMPTS[0] greedy with stop=STOP: text, finish_reason
    app: Any

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"{self.base_url}/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


@pytest.fixture(scope="module")
def served(default_model) -> Iterator[Served]:
    config = EngineConfig(device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=64, num_kv_blocks=160)
    llm = LLM.from_engine(LLMEngine(config, loaded=default_model))
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    # NOTE: one prompt at a time, as the server tests send them, so batch composition cannot differ.
    completions = {p: llm.generate(p, greedy, use_tqdm=False)[0].text for p in PROMPTS}
    chats = [llm.chat(c, greedy, use_tqdm=False)[0].text for c in CHAT]
    assert all(completions.values()) and all(chats)
    out = llm.generate(
        PROMPTS[0], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=STOP), use_tqdm=False
    )
    stopped = (out[0].text, out[0].finish_reason)

    with serve_in_thread(llm.engine) as (base_url, server):
        yield Served(base_url, llm.engine.model_name, completions, chats, stopped, server.config.app)


def test_models_and_health(served: Served) -> None:
    assert [m.id for m in served.client().models.list().data] == [served.model]
    assert httpx.get(f"{served.base_url}/health").json() == {"status": "ok"}


def test_completion_equals_llm_generate(served: Served) -> None:
    client = served.client()
    for prompt, expected in served.completions.items():
        r = client.completions.create(model=served.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert r.choices[0].text == expected
        assert r.object == "text_completion"
        assert r.usage is not None and r.usage.completion_tokens <= MAX_TOKENS
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    echoed = client.completions.create(
        model=served.model, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, echo=True
    )
    assert echoed.choices[0].text == PROMPTS[0] + served.completions[PROMPTS[0]]


def test_stop_strings_as_llm_generate(served: Served) -> None:
    client = served.client()
    kwargs = {
        "model": served.model,
        "prompt": PROMPTS[0],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stop": STOP,
    }
    r = client.completions.create(**kwargs)
    assert (r.choices[0].text, r.choices[0].finish_reason) == served.stopped
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == served.stopped[0]
    assert chunks[-1].choices[0].finish_reason == served.stopped[1]


def test_chat_equals_llm_chat(served: Served) -> None:
    client = served.client()
    for messages, expected in zip(CHAT, served.chats, strict=True):
        r = client.chat.completions.create(
            model=served.model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        assert r.choices[0].message.role == "assistant"
        assert r.choices[0].message.content == expected
        assert r.choices[0].finish_reason in ("stop", "length")


def test_streaming_equals_llm(served: Served) -> None:
    client = served.client()
    prompt = PROMPTS[1]
    chunks = list(
        client.completions.create(
            model=served.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == served.completions[prompt]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])

    chat_chunks = list(
        client.chat.completions.create(
            model=served.model,
            messages=CHAT[0],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
    assert text == served.chats[0]
    assert chat_chunks[-2].choices[0].finish_reason in ("stop", "length")
    usage = chat_chunks[-1].usage
    assert chat_chunks[-1].choices == [] and usage is not None and usage.completion_tokens >= 1


def test_32_concurrent_streams_all_complete(served: Served) -> None:
    n, max_tokens = 32, 8
    before = served.metrics()

    results = concurrent_streams(served.base_url, served.model, n, max_tokens)
    assert len(results) == n
    assert [(reason, tokens) for _, reason, tokens in results] == [("length", max_tokens)] * n
    assert all(text for text, _, _ in results)
    after = served.metrics()
    finished = ("graphpool_requests_finished_total", (("reason", "length"),))
    assert after[finished] - before.get(finished, 0) >= n
    # The engine batched them: some decode step held more than one sequence.
    decode = (("kind", "decode"),)
    steps = after[("graphpool_step_batch_size_count", decode)] - before.get(
        ("graphpool_step_batch_size_count", decode), 0
    )
    rows = after[("graphpool_step_batch_size_sum", decode)] - before.get(
        ("graphpool_step_batch_size_sum", decode), 0
    )
    assert rows == n * (max_tokens - 1)  # the first token of each comes from its prefill
    assert steps < rows


def test_disconnecting_client_frees_its_kv_blocks(served: Served) -> None:
    # NOTE: 200 tokens on CPU take many seconds; the abort must come long before the request could finish.
    check_disconnects_free_kv(served.base_url, served.model, PROMPTS, MAX_TOKENS, long_tokens=200, give_up_s=1.0)


BAD_REQUESTS: list[tuple[str, str, Any, str | None]] = [
    # (name, path, json body or raw bytes, offending param)
    ("invalid json", "/v1/completions", b'{"prompt": "hi", ', None),
    ("unknown model", "/v1/completions", {"model": "gpt-17", "prompt": "hi"}, "model"),
    ("missing prompt", "/v1/completions", {"max_tokens": 4}, "prompt"),
    ("missing messages", "/v1/chat/completions", {"max_tokens": 4}, "messages"),
    ("empty messages", "/v1/chat/completions", {"messages": []}, "messages"),
    ("empty prompt", "/v1/completions", {"prompt": ""}, "prompt"),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("max_tokens negative", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, "max_tokens"),
    ("max_tokens beyond context", "/v1/completions", {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
    ("prompt too long", "/v1/completions", {"prompt": "hello " * (2 * MAX_MODEL_LEN), "max_tokens": 1}, "prompt"),
    ("temperature too high", "/v1/completions", {"prompt": "hi", "temperature": 2.5}, "temperature"),
    ("temperature negative", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    ("top_p zero", "/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("top_p above one", "/v1/completions", {"prompt": "hi", "top_p": 1.5}, "top_p"),
    ("n above OpenAI's limit", "/v1/completions", {"prompt": "hi", "n": 129}, "n"),
    ("best_of other than n", "/v1/completions", {"prompt": "hi", "n": 2, "best_of": 4}, "best_of"),
    ("logprobs above 20", "/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("token id out of vocab", "/v1/completions", {"prompt": [1, 10**9]}, "prompt"),
    ("empty prompt in a list", "/v1/completions", {"prompt": ["a", ""]}, "prompt[1]"),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("not an object", "/v1/completions", [1, 2, 3], None),
]  # fmt: skip


def test_bad_inputs_are_400_and_the_server_keeps_serving(served: Served) -> None:
    before = served.metrics()
    with httpx.Client(base_url=served.base_url, timeout=30) as http:
        for name, path, body, param in BAD_REQUESTS:
            if isinstance(body, bytes):
                r = http.post(path, content=body, headers={"Content-Type": "application/json"})
            else:
                r = http.post(path, json=body)
            assert r.status_code == 400, (name, r.status_code, r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, name
            assert error["type"] == "invalid_request_error", name
            assert len(error["message"]) > 5, name
            assert error["param"] == param, (name, error)
        r = http.post(
            "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}
        )
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == served.completions[PROMPTS[0]]
    after = served.metrics()
    refused = ("graphpool_requests_refused_total", (("status", "400"),))
    assert after[refused] - before.get(refused, 0) == len(BAD_REQUESTS)
    # curl -d sends a JSON body as form data; it is read as JSON all the same.
    r = httpx.post(f"{served.base_url}/v1/completions", content=b'{"prompt": "hi", "max_tokens": -1}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="best_of must equal n"):
        served.client().completions.create(model=served.model, prompt="hi", n=3, best_of=5)


def test_metrics_move_as_requests_are_served(served: Served) -> None:
    before = served.metrics()
    served.client().completions.create(
        model=served.model, prompt=PROMPTS[2], max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    after = served.metrics()

    def delta(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert delta("graphpool_generation_tokens_total") == 5
    assert delta("graphpool_prompt_tokens_total") >= 4
    assert delta("graphpool_requests_finished_total", (("reason", "length"),)) == 1
    assert delta("graphpool_step_seconds_count", (("kind", "prefill"), ("mode", "eager"))) >= 1
    assert delta("graphpool_step_seconds_count", (("kind", "decode"), ("mode", "eager"))) == 4
    assert delta("graphpool_time_to_first_token_seconds_count") == 1
    assert delta("graphpool_request_seconds_count") == 1
    assert after[("graphpool_graph_enabled", ())] == 0  # CPU: decode runs eagerly
    assert after[("graphpool_kv_blocks_total", ())] > 0
