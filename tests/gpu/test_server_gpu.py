"""The server on a GPU: decode steps replay captured graphs, and /metrics shows the pool's work."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from graphpool.model.gguf_loader import default_gguf_path

# NOTE: the device machine has no fastapi/uvicorn/openai and the 98 MB default model cannot travel there, so
# this test runs only on a GPU machine set up with scripts/setup.sh.
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
try:
    default_gguf_path()
except FileNotFoundError as e:
    pytest.skip(f"default model not installed: {e}", allow_module_level=True)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from graphpool import LLM, SamplingParams  # noqa: E402
from graphpool.server.main import describe_startup, serve_in_thread  # noqa: E402

PROMPT = "The capital of France is"


def _metrics(base_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{base_url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_server_on_gpu_replays_graphs_and_reports_them() -> None:
    llm = LLM(device="cuda", max_model_len=512, num_kv_blocks=1024, graph_warmup=(1, 2, 4, 8))
    startup = "\n".join(describe_startup(llm.engine, llm.engine.config, 1.0))
    assert "warm-up captured 4 graphs" in startup, startup
    greedy = SamplingParams(temperature=0, max_tokens=16)
    expected = llm.generate(PROMPT, greedy, use_tqdm=False)[0].text
    assert expected

    with serve_in_thread(llm.engine) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        r = client.completions.create(
            model=llm.engine.model_name, prompt=PROMPT, max_tokens=16, temperature=0
        )
        assert r.choices[0].text == expected

        async def many(n: int) -> list[tuple[str | None, int]]:
            async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0) as c:

                async def one(i: int) -> tuple[str | None, int]:
                    out = await c.completions.create(
                        model=llm.engine.model_name,
                        prompt=f"Story {i}:",
                        max_tokens=24,
                        temperature=0.7,
                        seed=i,
                        extra_body={"ignore_eos": True},
                    )
                    return out.choices[0].finish_reason, out.usage.completion_tokens if out.usage else -1

                return await asyncio.gather(*(one(i) for i in range(n)))

        assert asyncio.run(many(24)) == [("length", 24)] * 24
        m = _metrics(base_url)

    assert m[("graphpool_graph_enabled", ())] == 1
    assert m[("graphpool_graph_captures_total", ())] >= 4
    assert m[("graphpool_graph_resident", ())] >= 1
    assert m[("graphpool_graph_resident_bytes", ())] > 0
    replayed = m[("graphpool_graph_hits_total", ())] + m[("graphpool_graph_padded_hits_total", ())]
    assert replayed > 0
    # Decode steps the server observed replaying a graph (the reference run before it is not observed).
    assert m[("graphpool_step_seconds_count", (("kind", "decode"), ("mode", "graph")))] > 0
