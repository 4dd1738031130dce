"""Random-weight models (no tokenizer) through the server: streaming per token, prefix-cache metrics."""

from __future__ import annotations

import openai

from graphpool import LLM
from graphpool.server.main import serve_in_thread


def test_tokenless_model_streams_a_chunk_per_token() -> None:
    llm = LLM(model="random:smollm2-135m", device="cpu", max_model_len=64, num_kv_blocks=16)
    assert llm.engine.tokenizer is None
    with serve_in_thread(llm.engine) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        chunks = list(client.completions.create(
            model=llm.engine.model_name, prompt=[5, 17, 42, 7], max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    choices = [c.choices[0] for c in chunks if c.choices]
    # one chunk per generated token, then the finish chunk; no text without a tokenizer
    assert [c.finish_reason for c in choices] == [None] * 6 + ["length"]
    assert all(c.text == "" for c in choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_prefix_cache_counters_reach_metrics_and_outputs() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from graphpool import SamplingParams
    from graphpool.server.metrics import ServerMetrics

    llm = LLM(model="random:smollm2-135m", device="cpu", max_model_len=128, num_kv_blocks=32)
    shared = list(range(10, 58))  # three full 16-token blocks
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    first = llm.generate([[*shared, 7]], params, use_tqdm=False)[0]
    again = llm.generate([[*shared, 9, 11]], params, use_tqdm=False)[0]  # its first 48 tokens are cached blocks
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 48)
    metrics = ServerMetrics()
    metrics.publish(llm.engine)
    got = {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert got["graphpool_prefix_cache_hits_tokens_total"] == 48
    assert got["graphpool_prefix_cache_queries_tokens_total"] == 49 + 50
    assert got["graphpool_prefix_cache_blocks"] >= 3


def test_a_server_answers_before_the_deferred_warm_up_graphs_and_captures_them_while_idle() -> None:
    """The real engine with the pool's stand-in capturer (graphs on, on the CPU), built as `graphpool serve`
    builds it: ready with every warm-up graph still to capture; they are captured while no request runs, and
    /metrics shows them resident; requests are served before, meanwhile and after."""
    import time

    import httpx

    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine
    from graphpool.pool.testing import EagerCapturer

    config = EngineConfig(model="random:smollm2-135m?layers=1", device="cpu", max_model_len=64, num_kv_blocks=16,
                          graph_max_batch_size=8, graph_split_batch_size=4, graph_grow_step_size=4)
    engine = LLMEngine(config, capturer=EagerCapturer(), defer_graph_warmup=True)
    wanted = engine.runner.warmup_sizes("cover")
    assert engine.runner.deferred_graphs == len(wanted) > 1 and engine.runner.pool.resident_sizes() == ()
    with serve_in_thread(engine) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model=engine.model_name, prompt=[5, 17, 42], max_tokens=3, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage is not None and out.usage.completion_tokens == 3
        deadline = time.monotonic() + 120
        gauges: dict[str, float] = {}
        while time.monotonic() < deadline:
            text = httpx.get(f"{base_url}/metrics").text
            gauges = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith(("graphpool_graph_resident ", "graphpool_graph_warmup_pending "))}
            if gauges["graphpool_graph_warmup_pending"] == 0:
                break
            time.sleep(0.05)
        assert gauges["graphpool_graph_warmup_pending"] == 0 and gauges["graphpool_graph_resident"] >= len(wanted)
        again = client.completions.create(model=engine.model_name, prompt=[5, 17, 42], max_tokens=3, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert again.usage is not None and again.usage.completion_tokens == 3
    assert engine.runner.deferred_graphs == 0 and set(wanted) <= set(engine.runner.pool.resident_sizes())


def test_async_scheduling_streams_through_the_held_hand_off_give_every_token_in_order() -> None:
    """Async scheduling on the CPU (the pool's stand-in capturer), requests streamed concurrently: the engine
    thread hands each step's outputs out from the next step's hook, and every stream gets exactly the tokens the
    engine gives alone, one chunk each, then its finish chunk."""
    import asyncio

    from graphpool import SamplingParams
    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine
    from graphpool.pool.testing import EagerCapturer

    config = EngineConfig(model="random:smollm2-135m?layers=1", device="cpu", max_model_len=64, num_kv_blocks=32,
                          async_scheduling=True, graph_warmup="none", graph_max_batch_size=8,
                          graph_split_batch_size=4, graph_grow_step_size=4)
    engine = LLMEngine(config, capturer=EagerCapturer())
    prompts = [[5 + i, 17, 42, 7 + i] for i in range(4)]
    lengths = [3, 7, 5, 9]
    alone = []
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"alone{i}", p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        while engine.has_unfinished_requests():
            alone += [o.token_ids for o in engine.step() if o.finished]

    async def stream_all(base_url: str) -> list[list[tuple[list[str], str | None]]]:
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)

        async def one(p: list[int], n: int) -> list[tuple[list[str], str | None]]:
            stream = await client.completions.create(
                model=engine.model_name, prompt=p, max_tokens=n, temperature=0, stream=True, logprobs=0,
                extra_body={"ignore_eos": True})
            return [(c.choices[0].logprobs.tokens if c.choices[0].logprobs else [], c.choices[0].finish_reason)
                    async for c in stream]

        return await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths, strict=True)))

    chained = engine._async.chained_steps if engine._async is not None else 0
    with serve_in_thread(engine) as (base_url, _):
        streams = asyncio.run(stream_all(base_url))
    for chunks, want, n in zip(streams, alone, lengths, strict=True):
        assert [f for _, f in chunks] == [None] * n + ["length"]
        assert [t for tokens, _ in chunks for t in tokens] == [f"token_id:{t}" for t in want]
    assert engine._async is not None and engine._async.chained_steps > chained
