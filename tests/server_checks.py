"""Server scenarios shared by the CPU and the GPU server tests: the same checks on either device."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base_url: str) -> Metrics:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_kv_idle(base_url: str, timeout: float = 300.0) -> Metrics:
    """/metrics once nothing runs or waits and every KV block is free again (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(base_url)
        idle = m[("graphpool_requests_running", ())] == 0 and m[("graphpool_requests_waiting", ())] == 0
        if idle and m[("graphpool_kv_blocks_free", ())] == m[("graphpool_kv_blocks_total", ())]:
            return m
        assert time.monotonic() < deadline, f"KV blocks not freed: {m}"
        time.sleep(0.05)


def check_disconnects_free_kv(
    base_url: str, model: str, prompts: list[str], max_tokens: int, long_tokens: int, give_up_s: float
) -> None:
    """A streaming client that hangs up mid-stream and a non-streaming one that gives up after ``give_up_s``
    both free their KV blocks (two aborts); clients sending ``prompts`` meanwhile are unaffected.
    ``long_tokens`` must take far longer than ``give_up_s`` to generate on the device under test."""
    idle = wait_kv_idle(base_url)
    aborted = ("graphpool_requests_finished_total", (("reason", "abort"),))
    body = {"prompt": "Write a long story about a dragon.", "max_tokens": long_tokens, "ignore_eos": True}
    results: list[tuple[str | None, int]] = []

    def other(prompt: str) -> None:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                      extra_body={"ignore_eos": True})
        results.append((r.choices[0].finish_reason, r.usage.completion_tokens if r.usage else -1))

    with httpx.Client(base_url=base_url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            # NOTE: keep the iterator alive: closing it (a `break` out of a for loop) closes the connection.
            lines = response.iter_lines()
            data_lines = 0
            while data_lines < 3:
                data_lines += next(lines).startswith("data: ")
            others = [threading.Thread(target=other, args=(p,)) for p in prompts]
            for t in others:
                t.start()
            busy = scrape(base_url)
            assert busy[("graphpool_kv_blocks_free", ())] < idle[("graphpool_kv_blocks_free", ())]
        # Leaving the block closed the connection mid-stream. Now a non-streaming client that gives up:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json=body, timeout=give_up_s)
        for t in others:
            t.join(300)
    after = wait_kv_idle(base_url)
    assert after[("graphpool_kv_blocks_free", ())] == idle[("graphpool_kv_blocks_free", ())]
    assert after[aborted] - idle.get(aborted, 0) == 2
    assert results == [("length", max_tokens)] * len(prompts)


def concurrent_streams(base_url: str, model: str, n: int, max_tokens: int) -> list[tuple[str, str | None, int]]:
    """``n`` streamed, seeded, sampled completions at once through the openai async client:
    (text, finish reason, completion tokens from the usage chunk) per request, in order."""

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, int]:
        stream = await client.completions.create(
            model=model, prompt=f"Request number {i}: the weather today is", max_tokens=max_tokens,
            temperature=0.8, seed=i, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, reason, tokens = "", None, -1
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return text, reason, tokens

    async def all_of_them() -> list[tuple[str, str | None, int]]:
        async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0,
                                      timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(n)))

    return asyncio.run(all_of_them())
