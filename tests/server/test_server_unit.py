"""Server pieces against a small fake engine that follows the engine contract (fast; no model).

The real-engine tests are in test_server_openai.py; these cover what the real engine cannot easily show:
pool stats with fallbacks by reason, a step that raises, and the engine-thread handover.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from char_tokenizer import CharTokenizer
from graphpool.engine.sampling_params import SamplingParams
from graphpool.pool.stats import FallbackReason, PoolStats
from graphpool.server.app import build_app
from graphpool.server.async_engine import IDLE_WAIT_S, AsyncEngine
from graphpool.server.metrics import ServerMetrics


@dataclass
class Out:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int]
    text: str
    delta_text: str
    finished: bool
    finish_reason: str | None
    logprobs: None = None  # the engine's RequestOutput fields the server reads
    new_logprobs: None = None
    num_cached_tokens: int = 0
    stop_reason: int | str | None = None


@dataclass
class Stats:
    running: int
    waiting: int
    num_free_kv_blocks: int
    num_kv_blocks: int
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    prefix_cache_queries_tokens_total: int = 0
    prefix_cache_hits_tokens_total: int = 0
    prefix_cache_blocks: int = 0
    async_chained_steps_total: int = 0
    graph_warmup_pending: int = 0


@dataclass
class Step:
    kind: str
    batch_size: int
    seconds: float
    graph: bool


@dataclass
class FakeEngine:
    """Each step: every request gets the letter 'a' + step % 26; finishes at max_tokens ('length')."""

    model_name: str = "fake"
    max_model_len: int = 64
    tokenizer: CharTokenizer = field(default_factory=CharTokenizer)
    fail_on_step: bool = False
    stall: bool = False  # unfinished requests that never get scheduled
    requests: dict[str, tuple[list[int], SamplingParams, list[int]]] = field(default_factory=dict)
    steps: int = 0
    prompt_total: int = 0
    gen_total: int = 0
    last_step: Step | None = None
    thread_ids: set[int] = field(default_factory=set)
    graphs_off: FallbackReason | None = None

    def _touch(self) -> None:
        self.thread_ids.add(threading.get_ident())

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> None:
        self._touch()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id}")
        if "REFUSE" in self.tokenizer.decode(ids):
            raise ValueError("the fake engine refuses this prompt")
        self.requests[request_id] = (ids, params, [])
        self.prompt_total += len(ids)

    def abort_request(self, request_id: str) -> None:
        self._touch()
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        self._touch()
        return bool(self.requests)

    def step(self) -> list[Out]:
        self._touch()
        if self.fail_on_step:
            raise RuntimeError("boom")
        self.steps += 1
        if self.stall:
            self.last_step = None
            return []
        tok = ord("a") + self.steps % 26
        outs = []
        for rid, (ids, params, gen) in list(self.requests.items()):
            gen.append(tok)
            self.gen_total += 1
            done = len(gen) >= params.max_tokens
            text = self.tokenizer.decode(gen)
            outs.append(Out(rid, ids, list(gen), [tok], text, chr(tok), done, "length" if done else None))
            if done:
                del self.requests[rid]
        self.last_step = Step("decode", len(outs), 0.003, True)
        return outs

    def stats(self) -> Stats:
        self._touch()
        n = len(self.requests)
        return Stats(n, 0, 100 - n, 100, self.prompt_total, self.gen_total, 0)

    def graph_stats(self) -> PoolStats:
        self._touch()
        return PoolStats(
            steps=self.steps, hits=self.steps, misses=1, captures=1, resident_graphs=1, resident_bytes=4096,
            arena_bytes=3072, fallbacks={FallbackReason.BATCH_TOO_LARGE: 2}, eager_steps=2,
            capture_seconds_total=0.5, capture_seconds_max=0.5, resident_sizes=(8,),
        )  # fmt: skip


def make_client(engine: FakeEngine) -> tuple[TestClient, AsyncEngine]:
    metrics = ServerMetrics(log_interval_s=0.0)
    async_engine = AsyncEngine(engine, observer=metrics)
    return TestClient(build_app(async_engine, metrics)), async_engine


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_completion_stream_and_metrics_with_fake_engine() -> None:
    engine = FakeEngine()
    client, _ = make_client(engine)
    with client:
        r = client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5,
                                 "prompt_tokens_details": {"cached_tokens": 0}}
        assert len(body["choices"][0]["text"]) == 3

        with client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True},
        }) as s:  # fmt: skip
            lines = [ln for ln in s.iter_lines() if ln]
        assert lines[-1] == "data: [DONE]"
        import json

        chunks = [json.loads(ln[len("data: ") :]) for ln in lines[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) != ""
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4

        values = metric_values(client.get("/metrics").text)
        assert values[("graphpool_graph_fallbacks_total", (("reason", "batch_too_large"),))] == 2
        assert values[("graphpool_graph_resident_bytes", ())] == 4096
        assert values[("graphpool_graph_arena_bytes", ())] == 3072
        assert values[("graphpool_graph_steps_total", ())] == engine.steps
        assert values[("graphpool_generation_tokens_total", ())] == 7
        assert values[("graphpool_requests_finished_total", (("reason", "length"),))] == 2
        assert values[("graphpool_step_batch_size_count", (("kind", "decode"),))] == engine.steps
    # NOTE: all engine calls on one thread, and not the test's.
    assert len(engine.thread_ids) == 1 and threading.get_ident() not in engine.thread_ids


def test_engine_value_error_is_a_400_and_a_failed_step_is_a_503() -> None:
    engine = FakeEngine()
    client, async_engine = make_client(engine)
    with client:
        r = client.post("/v1/completions", json={"prompt": "REFUSE me", "max_tokens": 2})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "the fake engine refuses this prompt"
        assert client.get("/health").status_code == 200
        engine.fail_on_step = True
        r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert r.status_code == 503 and "boom" in r.json()["error"]["message"]
        assert client.get("/health").status_code == 503
        assert isinstance(async_engine.error, RuntimeError)


def test_async_engine_call_runs_on_the_engine_thread() -> None:
    engine = FakeEngine()
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:
        ident = asyncio.run(async_engine.call(lambda e: threading.get_ident()))
        assert ident != threading.get_ident()
        with pytest.raises(ZeroDivisionError):
            asyncio.run(async_engine.call(lambda e: 1 / 0))
    finally:
        async_engine.shutdown()


def test_engine_loop_does_not_spin_on_a_step_that_schedules_nothing() -> None:
    import time

    engine = FakeEngine(stall=True)
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:

        async def add() -> None:
            await async_engine.add_request("r", [1, 2], SamplingParams(max_tokens=2))

        asyncio.run(add())
        deadline = time.monotonic() + 60
        while engine.steps == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        first, t0 = engine.steps, time.monotonic()
        time.sleep(0.3)
        steps, elapsed = engine.steps - first, time.monotonic() - t0
        # each step that scheduled nothing waits IDLE_WAIT_S for a command (however long the sleep really took)
        assert first >= 1 and steps <= elapsed / IDLE_WAIT_S + 5
    finally:
        async_engine.shutdown()


def test_describe_startup_says_what_the_pool_captured_and_holds() -> None:
    from types import SimpleNamespace

    from graphpool.engine.config import EngineConfig
    from graphpool.server.startup_log import describe_startup

    engine = FakeEngine(graphs_off=FallbackReason.NO_CUDA)
    cpu = describe_startup(engine, EngineConfig(device="cpu", dtype="float32"), 2.5)
    assert "on cpu (float32), loaded in 2.5 s" in cpu[0]
    assert cpu[1].startswith("KV cache: 100 blocks of 16 tokens (1600 token slots)")
    assert cpu[2] == "CUDA graphs: off (device cpu); decode steps run eagerly"

    gpu_config = SimpleNamespace(
        torch_device="cuda:0", torch_dtype="torch.bfloat16", block_size=16,
        disable_cudagraph=False, graph_memory_budget=256 << 20, max_graph_pool_size=16, graph_warmup=(8,),
    )  # fmt: skip
    engine.graphs_off = FallbackReason.DISABLED
    assert describe_startup(engine, gpu_config, 1.0)[2] == "CUDA graphs: off (--disable-cudagraph); decode steps run eagerly"
    engine.graphs_off = None
    gpu = describe_startup(engine, gpu_config, 1.0)
    assert gpu[2] == (
        "CUDA graphs: warm-up captured 1 graphs in 0.50 s (slowest 0.500 s, 0 failed); resident 1 graphs [8] "
        "holding 0.0 MiB; max_graph_pool_size 16, graph_memory_budget 256 MiB"
    )
    # the server's default: ready with the warm-up graphs still to capture while idle
    import dataclasses

    pool_stats, engine_stats = engine.graph_stats(), engine.stats()
    engine.graph_stats = lambda: dataclasses.replace(pool_stats, captures=0)  # type: ignore[method-assign]
    engine.stats = lambda: dataclasses.replace(engine_stats, graph_warmup_pending=11)  # type: ignore[method-assign]
    assert describe_startup(engine, gpu_config, 1.0)[2] == (
        "CUDA graphs: 11 warm-up graphs (warm-up '(8,)') to capture while idle after start-up, one at a time; "
        "lazy capture meanwhile, max_graph_pool_size 16, graph_memory_budget 256 MiB"
    )


def test_disabled_kernels_show_at_start_up_and_on_metrics() -> None:
    from graphpool.engine.config import EngineConfig
    from graphpool.server.startup_log import describe_startup

    engine = FakeEngine()
    assert "kernels off" not in describe_startup(engine, EngineConfig(device="cpu"), 1.0)[0]
    line = describe_startup(engine, EngineConfig(device="cpu", disabled_kernels="pdl,gemv"), 1.0)[0]
    assert line.endswith("; kernels off: gemv, pdl")
    values = metric_values(ServerMetrics(disabled_kernels=("gemv", "pdl")).render().decode())
    enabled = {dict(labels)["kernel"]: v for (name, labels), v in values.items() if name == "graphpool_kernel_enabled"}
    assert enabled == {"gemv": 0.0, "pdl": 0.0, "gemv_rope": 1.0, "gemv_swiglu": 1.0, "gemv_norm": 1.0, "gemv_rows": 1.0,
                       "step_argmax": 1.0, "step_sample": 1.0, "attn_stages": 1.0}


def test_serve_subcommand_refuses_bad_flags_before_loading() -> None:
    from graphpool.cli import build_parser, main

    args = build_parser().parse_args(["serve", "--port", "9001", "--max-graph-pool-size", "4"])
    assert (args.port, args.host, args.max_graph_pool_size) == (9001, "127.0.0.1", 4)
    assert main(["serve", "--max-model-len", "-3"]) == 2


def test_progress_log_line(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine()
    engine.add_request("r", "hello", SamplingParams(max_tokens=3))
    metrics = ServerMetrics(log_interval_s=1e-9)
    with caplog.at_level("INFO", logger="graphpool.server"):
        metrics.on_step(engine, engine.step())
    assert "running 1, waiting 0, KV blocks free 99/100" in caplog.text
    assert "graphs: 1 decode steps: 1 hits, 0 padded hits, 1 misses, 1 captures (0.50 s)" in caplog.text
    assert "0 evictions, 2 eager; 1 graphs resident" in caplog.text


@dataclass
class WarmingEngine(FakeEngine):
    """A FakeEngine with deferred start-up work: `pending` pieces, done one per idle_work call."""

    pending: int = 3
    idle_calls_while_busy: int = 0
    idle_calls: int = 0

    def idle_work(self) -> bool:
        self._touch()
        self.idle_calls += 1
        if self.requests:
            self.idle_calls_while_busy += 1
        elif self.pending:
            self.pending -= 1
        return self.pending > 0


def test_the_engine_loop_does_the_engines_idle_work_between_requests_and_then_blocks() -> None:
    import time

    engine = WarmingEngine(pending=5)
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:
        deadline = time.monotonic() + 60
        while engine.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.pending == 0 and engine.idle_calls_while_busy == 0
        time.sleep(0.2)
        assert engine.idle_calls == 5  # done: the loop blocks for a command again instead of asking on

        async def one() -> list[str]:
            stream = await async_engine.add_request("r", [1, 2], SamplingParams(max_tokens=3))
            return [out.text async for out in stream]

        assert asyncio.run(one())[-1] == "bcd"  # served as before
        assert engine.idle_calls_while_busy == 0 and engine.thread_ids == {async_engine._thread.ident}
        deadline = time.monotonic() + 60
        while engine.idle_calls < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert engine.idle_calls == 6  # asked once more after serving (steps may leave captures), then blocks
    finally:
        async_engine.shutdown()


def test_on_the_cpu_a_token_is_handed_out_before_the_next_step_is_computed() -> None:
    """Off CUDA a step's forward is its own work: a token held for the next step's `before_wait` hook would
    reach its stream a whole step late. The third step waits until the stream has the second token (a
    30 s bound only ends a hang)."""
    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model="random:smollm2-135m?layers=1", device="cpu", max_model_len=64,
                                    num_kv_blocks=16))
    second_token = threading.Event()
    waited: list[bool] = []
    step = engine.step

    def gated_step():  # type: ignore[no-untyped-def]
        if engine.generation_tokens_total == 2:  # about to compute the third token
            waited.append(second_token.wait(30))
        return step()

    engine.step = gated_step  # type: ignore[method-assign]
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:
        async def stream() -> int:
            got = 0
            async for out in await async_engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=4,
                                                                                            ignore_eos=True)):
                got += len(out.new_token_ids)
                if got >= 2:
                    second_token.set()
            return got

        assert asyncio.run(stream()) == 4
    finally:
        async_engine.shutdown()
    assert waited == [True]  # the second token arrived while the third step waited for it


def test_requests_added_together_start_in_the_same_step_and_a_refusal_is_returned_in_place() -> None:
    """A request's n choices (or prompts) go to the engine in one pass: each choice's first token comes from
    the same step (the fake engine's token is the step's letter). Awaited one by one they were taken one a
    step. A refused one comes back as its ValueError, the others as streams."""
    engine = FakeEngine()
    async_engine = AsyncEngine(engine)
    async_engine.start()

    async def together() -> tuple[list[str], list[object]]:
        params = SamplingParams(max_tokens=2)
        streams = await async_engine.add_requests([(f"r{i}", [1, 2], params) for i in range(6)])
        firsts = []
        for stream in streams:
            assert not isinstance(stream, ValueError)
            texts = [out.delta_text async for out in stream]  # NOTE: read whole: the stream finishes
            firsts.append(texts[0])
        mixed = await async_engine.add_requests([("ok", [1], params), ("bad", "REFUSE", params)])
        return firsts, mixed

    try:
        firsts, mixed = asyncio.run(together())
    finally:
        async_engine.shutdown()
    assert len(set(firsts)) == 1, firsts
    assert not isinstance(mixed[0], ValueError) and isinstance(mixed[1], ValueError)


def test_a_bug_is_a_500_in_openais_shape_and_counted() -> None:
    """No request should reach one; one that does is answered as the others are (JSON error body), counted
    with the refused ones, and the server goes on serving."""

    class BuggyTokenizer(CharTokenizer):
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            if text == "BUG":
                raise RuntimeError("a tokenizer bug")
            return super().encode(text, add_special_tokens)

    metrics = ServerMetrics(log_interval_s=0.0)
    async_engine = AsyncEngine(FakeEngine(tokenizer=BuggyTokenizer()), observer=metrics)
    with TestClient(build_app(async_engine, metrics), raise_server_exceptions=False) as client:
        r = client.post("/v1/completions", json={"prompt": "BUG", "max_tokens": 2})
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "server_error" and "a tokenizer bug" in r.json()["error"]["message"]
        assert client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2}).status_code == 200
        values = metric_values(client.get("/metrics").text)
    assert values[("graphpool_requests_refused_total", (("status", "500"),))] == 1
