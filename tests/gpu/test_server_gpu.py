"""The server on the GPU with the real default model, queried with the official openai client.

Completion and chat, streamed and not, equal the engine's greedy output; 64 concurrent streams complete;
a client that disconnects mid-stream frees its KV blocks; bad requests get a 400 and serving continues;
/metrics shows the graph pool's counters moving. Nothing here skips where CUDA is present.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import report, require

from graphpool import LLM, SamplingParams

MAX_MODEL_LEN = 2048
MAX_TOKENS = 16
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
CHAT = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
]
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Served:
    base_url: str
    model: str
    completions: dict[str, str]
    chats: list[str]
    startup: str

    def client(self) -> Any:
        return require("openai").OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0)

    def metrics(self) -> Metrics:
        httpx = require("httpx")
        parser = require("prometheus_client.parser")
        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text)
            for s in family.samples
        }


@pytest.fixture(scope="module")
def served(default_gguf: Path) -> Iterator[Served]:
    for module in ("fastapi", "uvicorn", "openai", "httpx", "prometheus_client", "gguf"):
        require(module)
    from graphpool.server.main import serve_in_thread
    from graphpool.server.startup_log import describe_startup

    # NOTE: device "cuda" without an index: the engine thread died on exactly this before.
    llm = LLM(device="cuda", max_model_len=MAX_MODEL_LEN, max_num_seqs=64, num_kv_blocks=4096)
    startup = "\n".join(describe_startup(llm.engine, llm.engine.config, 1.0))
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    completions = {p: llm.generate(p, greedy, use_tqdm=False)[0].text for p in PROMPTS}
    chats = [llm.chat(c, greedy, use_tqdm=False)[0].text for c in CHAT]
    assert all(completions.values()) and all(chats)
    with serve_in_thread(llm.engine) as (base_url, _):
        yield Served(base_url, llm.engine.model_name, completions, chats, startup)


def test_startup_warms_the_default_cover(served: Served) -> None:
    assert "warm-up captured 11 graphs" in served.startup, served.startup
    m = served.metrics()
    assert m[("graphpool_graph_enabled", ())] == 1
    assert m[("graphpool_graph_resident", ())] >= 11
    assert m[("graphpool_graph_resident_bytes", ())] > 0


def test_completion_and_chat_streamed_and_not_equal_the_engine(served: Served) -> None:
    client = served.client()
    for prompt, expected in served.completions.items():
        r = client.completions.create(model=served.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert r.choices[0].text == expected
        chunks = list(client.completions.create(
            model=served.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    for messages, expected in zip(CHAT, served.chats, strict=True):
        r = client.chat.completions.create(model=served.model, messages=messages, max_tokens=MAX_TOKENS,
                                           temperature=0)
        assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == expected
        chunks = list(client.chat.completions.create(
            model=served.model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_64_concurrent_streams_complete_through_graphs(served: Served) -> None:
    n, max_tokens = 64, 48
    before = served.metrics()

    from server_checks import concurrent_streams

    t0 = time.perf_counter()
    results = concurrent_streams(served.base_url, served.model, n, max_tokens)
    seconds = time.perf_counter() - t0
    assert [(reason, tokens) for _, reason, tokens in results] == [("length", max_tokens)] * n
    assert all(text for text, _, _ in results)
    after = served.metrics()
    graph_steps = ("graphpool_step_seconds_count", (("kind", "decode"), ("mode", "graph")))
    generated = ("graphpool_generation_tokens_total", ())
    assert after[generated] - before.get(generated, 0) == n * max_tokens
    # every token after a request's first comes from a decode row: in a decode step, or in a mixed step (on by
    # default with graphs), whose sequences also count the prompt chunks it carried
    rows = [("graphpool_step_batch_size_sum", (("kind", kind),)) for kind in ("decode", "mixed")]
    assert sum(after.get(r, 0) - before.get(r, 0) for r in rows) >= n * (max_tokens - 1)
    assert after[graph_steps] - before.get(graph_steps, 0) > 0
    report("server_64_streams", {"seconds": round(seconds, 2), "tokens": n * max_tokens})


def test_disconnecting_clients_free_their_kv_blocks(served: Served) -> None:
    from server_checks import check_disconnects_free_kv

    # NOTE: ~2000 tokens at a few ms a step on the GPU: seconds, far longer than the client waits.
    check_disconnects_free_kv(served.base_url, served.model, PROMPTS, MAX_TOKENS, long_tokens=MAX_MODEL_LEN - 64,
                              give_up_s=0.5)


BAD_REQUESTS: list[tuple[str, dict[str, Any], str | None]] = [
    ("/v1/completions", {"model": "gpt-17", "prompt": "hi"}, "model"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hello " * (2 * MAX_MODEL_LEN), "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
]


def test_bad_requests_get_400_and_serving_continues(served: Served) -> None:
    httpx = require("httpx")
    with httpx.Client(base_url=served.base_url, timeout=30) as http:
        for path, body, param in BAD_REQUESTS:
            r = http.post(path, json=body)
            assert r.status_code == 400, (body, r.status_code, r.text)
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param, (body, error)
        prompt = PROMPTS[0]
        r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == served.completions[prompt]


def test_metrics_show_the_graph_counters_moving(served: Served) -> None:
    openai = require("openai")
    before = served.metrics()

    async def burst(n: int) -> None:
        async with openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key="none", max_retries=0,
                                      timeout=120) as c:
            await asyncio.gather(*(c.completions.create(
                model=served.model, prompt=f"Count to {i}:", max_tokens=12 + i % 7, temperature=0,
                extra_body={"ignore_eos": True}) for i in range(n)))

    for n in (3, 9, 20, 37):  # batch sizes spread over the ladder: exact and padded hits
        asyncio.run(burst(n))
    after = served.metrics()

    def delta(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    replayed = delta("graphpool_graph_hits_total") + delta("graphpool_graph_padded_hits_total")
    assert replayed > 0
    graph_steps = delta("graphpool_step_seconds_count", (("kind", "decode"), ("mode", "graph")))
    assert 0 < graph_steps <= delta("graphpool_graph_steps_total")
    assert after[("graphpool_graph_resident", ())] >= 1
    report("server_metrics_delta", {
        "hits": delta("graphpool_graph_hits_total"), "padded_hits": delta("graphpool_graph_padded_hits_total"),
        "misses": delta("graphpool_graph_misses_total"), "captures": delta("graphpool_graph_captures_total"),
    })
