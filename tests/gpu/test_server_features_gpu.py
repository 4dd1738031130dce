"""The server's sampling features keep decode on graphs: the real default model on CUDA behind the server,
queried concurrently with the official openai client by requests with logprobs / top_logprobs, n > 1,
presence / frequency / repetition penalties, min_p and a JSON schema (the default model's chat template), all at
once; the pool's own counters on /metrics (decode steps, of them eager) must show no eager decode step, and
each output must be what its request asked for."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import report, require

from graphpool import LLM

MAX_MODEL_LEN = 1024
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def base_url(default_gguf: Path) -> Iterator[tuple[str, str]]:
    for module in ("fastapi", "uvicorn", "openai", "httpx", "xgrammar", "jsonschema"):
        require(module)
    from graphpool.server.main import serve_in_thread

    llm = LLM(device="cuda", max_model_len=MAX_MODEL_LEN, max_num_seqs=64, num_kv_blocks=2048)
    with serve_in_thread(llm.engine) as (url, _):
        yield url, llm.engine.model_name


def _pool_counters(url: str) -> dict[str, float]:
    httpx = require("httpx")
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for name in ("graphpool_graph_steps_total", "graphpool_graph_eager_steps_total"):
        m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
        assert m is not None, name
        out[name] = float(m.group(1))
    return out


async def _traffic(url: str, model: str) -> list[Any]:
    openai = require("openai")
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    chat = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]
    calls = []
    for i in range(4):
        calls += [
            client.completions.create(model=model, prompt=f"Story {i}: once upon a time", max_tokens=48,
                                      temperature=0, logprobs=3),
            client.chat.completions.create(model=model, messages=chat, max_tokens=48, temperature=0.8, seed=i,
                                           n=3, logprobs=True, top_logprobs=2),
            client.completions.create(model=model, prompt=f"List {i}:", max_tokens=48, temperature=0.7, seed=i,
                                      presence_penalty=0.5, frequency_penalty=0.3,
                                      extra_body={"repetition_penalty": 1.2, "min_p": 0.05}),
            client.chat.completions.create(model=model, messages=chat, max_tokens=96, temperature=0, n=2,
                                           response_format={"type": "json_schema", "json_schema": {
                                               "name": "person", "schema": SCHEMA}}),
        ]
    return await asyncio.gather(*calls)


def test_logprobs_n_penalties_and_schemas_decode_on_graphs(base_url: tuple[str, str]) -> None:
    jsonschema = require("jsonschema")
    url, model = base_url
    before = _pool_counters(url)
    results = asyncio.run(_traffic(url, model))
    after = _pool_counters(url)
    steps = after["graphpool_graph_steps_total"] - before["graphpool_graph_steps_total"]
    eager = after["graphpool_graph_eager_steps_total"] - before["graphpool_graph_eager_steps_total"]
    report("server_features_decode_steps", {"steps": steps, "eager": eager})
    assert steps > 40 and eager == 0, (steps, eager)
    for k in range(0, len(results), 4):
        greedy_lp, sampled_n, penalised, schema = results[k:k + 4]
        lp = greedy_lp.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) > 0
        assert all(x <= 0 for x in lp.token_logprobs) and all(len(t) <= 3 for t in lp.top_logprobs)
        assert len(sampled_n.choices) == 3
        assert all(c.logprobs is not None and c.logprobs.content for c in sampled_n.choices)
        assert penalised.choices[0].text
        assert len(schema.choices) == 2
        for c in schema.choices:
            assert c.finish_reason == "stop", c
            jsonschema.validate(json.loads(c.message.content), SCHEMA)
