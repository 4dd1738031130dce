"""Async scheduling (`async_scheduling`): the next decode step is launched on the device tokens of the one
before, whose outputs are processed while it runs. On the CPU (six layers of the real default model; eager and
through the pool's stand-in capturer) every request's tokens and text equal those of the synchronous engine,
whatever stops it (max_tokens, a stop token, a stop string, max_model_len, an abort), with requests arriving mid-run,
seeded sampling and penalties, and with too few KV blocks for every chained step; its KV blocks all come
back. tests/gpu/test_graph_prefill_gpu.py checks it on the GPU, where the overlap is real."""

from __future__ import annotations

import pytest
from test_chunked_prefill import MAX_MODEL_LEN
from test_graph_prefill import loaded, prompts  # noqa: F401 (fixtures)

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.pool.testing import EagerCapturer
from model_reference import record_steps

LADDER = {"graph_max_batch_size": 64, "graph_split_batch_size": 8, "graph_grow_step_size": 8}


def _params(i: int, stop_ids: list[int], stop_text: str) -> SamplingParams:
    """A mix of what ends a request and how it samples, by request index."""
    kinds = [
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=stop_ids),
        SamplingParams(temperature=0.8, seed=7, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop=[stop_text] if stop_text else None),
    ]
    return kinds[i % len(kinds)]


def _drive(engine: LLMEngine, reqs: list[list[int]], params: list[SamplingParams],
           abort: str | None = None) -> dict[str, tuple[list[int], str, str | None]]:
    """Half the requests first, the rest once the first ones decode; `abort` is dropped after a few steps."""
    out: dict[str, tuple[list[int], str, str | None]] = {}
    half = len(reqs) // 2
    for i in range(half):
        engine.add_request(f"r{i}", reqs[i], params[i])
    for n in range(10_000):
        if n == 3:
            for i in range(half, len(reqs)):
                engine.add_request(f"r{i}", reqs[i], params[i])
        if n == 6 and abort is not None:
            engine.abort_request(abort)
        if n > 3 and not engine.has_unfinished_requests():
            break
        for o in engine.step():
            if o.finished:
                out[o.request_id] = (o.token_ids, o.text, o.finish_reason)
    return out


def _engine(loaded, graphs: bool, **kw) -> LLMEngine:  # noqa: F811
    settings = {"device": "cpu", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 96, "graph_warmup": "none",
                **LADDER} | kw
    return LLMEngine(EngineConfig(**settings), loaded=loaded, capturer=EagerCapturer() if graphs else None)


def _watch_launches(engine: LLMEngine, seen) -> None:
    """Call `seen(batch, chained)` at every step async scheduling launches (chained: on device tokens)."""
    ahead = engine._async
    assert ahead is not None
    launch = ahead.launch

    def watched(batch, input_ids=None):
        seen(batch, input_ids is not None)
        return launch(batch, input_ids)

    ahead.launch = watched  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def workload(loaded, prompts):  # noqa: F811
    """Prompts, and params whose stop token and stop string the synchronous run does meet mid-output."""
    reqs = [p[:16] for p in prompts] + [p[4:20] for p in prompts]
    probe = _drive(_engine(loaded, False), reqs, [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)]
                   * len(reqs))
    stop_ids = [probe["r1"][0][3]]
    stop_text = probe["r4"][1][5:8].strip() or probe["r4"][1][5:8]
    return reqs, [_params(i, stop_ids, stop_text) for i in range(len(reqs))]


@pytest.mark.parametrize("mixed", [False, True])
def test_outputs_equal_the_synchronous_engine(loaded, workload, mixed: bool) -> None:  # noqa: F811
    reqs, params = workload
    want = _drive(_engine(loaded, True, enable_mixed_steps=mixed), reqs, params)
    engine = _engine(loaded, True, async_scheduling=True, enable_mixed_steps=mixed)
    got = _drive(engine, reqs, params)
    assert got == want
    reasons = {r for _, _, r in want.values()}
    assert {"length", "stop"} <= reasons  # the mix met both kinds of end
    assert engine._async is not None and engine._async.chained_steps > 5
    assert engine._async.chained_after_prompts > 0, "no step was chained after a prefill or mixed step"
    # with mixed steps the arrivals' prompts ride in chained steps beside the decode rows
    assert (engine._async.chained_with_prompts > 0) == mixed
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
    assert not engine.has_unfinished_requests() and engine._async.inflight is None


@pytest.mark.parametrize("mixed", [False, True])
def test_an_abort_and_max_model_len_mid_flight(loaded, workload, mixed: bool) -> None:  # noqa: F811
    reqs, params = workload
    # prompts of 16 tokens: some requests end by length at max_model_len
    short = {"max_model_len": 24, "enable_mixed_steps": mixed}
    want = _drive(_engine(loaded, True, **short), reqs, params, abort="r2")
    engine = _engine(loaded, True, async_scheduling=True, **short)
    got = _drive(engine, reqs, params, abort="r2")
    assert "r2" not in got and got == want and len(got) == len(reqs) - 1
    assert any(len(t) == 24 - 16 for t, _, r in got.values() if r == "length")  # ended at max_model_len
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


@pytest.mark.parametrize("mixed", [False, True])
def test_too_few_kv_blocks_for_every_chained_step(loaded, workload, mixed: bool) -> None:  # noqa: F811
    reqs, params = workload
    # preemptions happen
    tight = {"num_kv_blocks": 12, "block_size": 4, "enable_prefix_caching": False, "enable_mixed_steps": mixed}
    want = _drive(_engine(loaded, mixed, **tight), reqs, params)
    engine = _engine(loaded, mixed, async_scheduling=True, **tight)
    got = _drive(engine, reqs, params)
    assert engine.scheduler.num_preemptions > 0 and got == want
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


def test_validated() -> None:
    assert not EngineConfig().async_scheduling
    with pytest.raises(ValueError, match="profile_steps"):
        EngineConfig(async_scheduling=True, profile_steps=True)
    with pytest.raises(ValueError, match="async_scheduling must be a bool"):
        EngineConfig(async_scheduling=1)  # type: ignore[arg-type]


def test_chains_while_requests_wait_that_cannot_be_admitted(loaded, workload) -> None:  # noqa: F811
    reqs, params = workload
    full = {"max_num_seqs": 3}  # 8 requests: most of the run has a queue the scheduler cannot admit from
    want = _drive(_engine(loaded, False, **full), reqs, params)
    engine = _engine(loaded, False, async_scheduling=True, **full)
    ahead = engine._async
    assert ahead is not None
    chain = ahead.chain
    with_queue = []

    def recording_chain(cur):
        waiting = len(engine.scheduler.waiting)
        nxt = chain(cur)
        if nxt is not None and waiting:
            with_queue.append(waiting)
        return nxt

    ahead.chain = recording_chain  # type: ignore[method-assign]
    assert _drive(engine, reqs, params) == want
    assert with_queue, "no step was chained while requests waited"


def test_the_server_streams_the_same_with_async_scheduling(loaded) -> None:  # noqa: F811
    """Concurrent seeded streams through `graphpool serve`'s app and the openai client, both engines."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from graphpool.server.main import serve_in_thread
    from server_checks import concurrent_streams

    results, chained = [], []
    for mode in (False, True):
        engine = _engine(loaded, False, async_scheduling=mode)
        with serve_in_thread(engine) as (base_url, _):
            results.append(concurrent_streams(base_url, engine.model_name, 6, 8))
            text = httpx.get(f"{base_url}/metrics", timeout=30).text
        chained.append(next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                            if s.name == "graphpool_async_chained_steps_total"))
    assert results[0] == results[1]
    assert chained[0] == 0 and chained[1] > 0, chained
    assert all(reason == "length" and tokens == 8 and text for text, reason, tokens in results[1])


def test_chained_mixed_steps_carry_split_prompts(loaded, workload) -> None:  # noqa: F811
    reqs, params = workload
    tight = {"enable_mixed_steps": True, "max_num_batched_tokens": 12}  # 16-token prompts: split in chunks
    want = _drive(_engine(loaded, True, **tight), reqs, params)
    engine = _engine(loaded, True, async_scheduling=True, **tight)
    chained_lasts = []  # per chained step with prompt chunks: whether each chunk ends its prompt
    started: set[str] = set()  # requests with a chunk in an earlier step
    continued = 0  # chunks in chained steps that go on with a prompt an earlier step began

    def seen(batch, chained: bool) -> None:
        nonlocal continued
        if chained and batch.chunks:
            chained_lasts.append([c.is_last for c in batch.chunks])
            continued += sum(c.seq.request_id in started for c in batch.chunks)
        started.update(c.seq.request_id for c in batch.chunks)

    _watch_launches(engine, seen)
    assert _drive(engine, reqs, params) == want
    assert any(not all(lasts) for lasts in chained_lasts), "no chained step carried a prompt's earlier chunk"
    assert continued > 0, "a prompt split over steps broke the chain: its next chunk never rode in a chained step"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


def test_split_prompts_without_mixed_steps(loaded, workload) -> None:  # noqa: F811
    """Without mixed steps a prompt's next chunk runs in a prefill step, which is not chained while the prompt
    is split: async equals sync, and decode steps still chain."""
    reqs, params = workload
    tight = {"enable_mixed_steps": False, "max_num_batched_tokens": 12}
    want = _drive(_engine(loaded, True, **tight), reqs, params)
    engine = _engine(loaded, True, async_scheduling=True, **tight)
    assert _drive(engine, reqs, params) == want
    assert engine._async is not None and engine._async.chained_steps > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


def test_a_lone_prompt_in_graph_prefill_steps(loaded, workload) -> None:  # noqa: F811
    """Nothing decoding at the first arrivals: the first prompt (16 tokens) is prefilled in two replayed steps
    of 8 (`idle_prefill_steps`), then the others ride in mixed steps; async equals sync."""
    reqs, params = workload
    idle = {"enable_mixed_steps": True, "graph_prefill_max_tokens": 8, "graph_warmup": "cover"}
    want = _drive(_engine(loaded, True, **idle), reqs, params)
    engine = _engine(loaded, True, async_scheduling=True, **idle)
    steps = record_steps(engine)
    assert _drive(engine, reqs, params) == want
    first = steps[:2]
    assert [(s.kind, s.num_tokens, s.graph) for s in first] == [("prefill", 8, True)] * 2
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_before_wait_runs_once_a_step_after_its_launches_and_before_its_tokens(
        loaded, prompts, async_scheduling: bool) -> None:  # noqa: F811
    """The server's hook: once per step(), after the step (and a chained next one) is launched, before the
    step's tokens are added."""
    engine = _engine(loaded, graphs=True, async_scheduling=async_scheduling)
    seen: list[tuple[int, int]] = []

    def chained() -> int:
        return engine._async.chained_steps if engine._async is not None else 0

    engine.before_wait = lambda: seen.append((engine.generation_tokens_total, chained()))
    engine.add_request("a", prompts[0], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        before = engine.generation_tokens_total
        outputs = engine.step()
        steps += 1
        assert len(seen) == steps
        assert seen[-1] == (before, chained())
        assert engine.generation_tokens_total == before + len(outputs)
    assert engine.generation_tokens_total == 8
    assert (chained() > 0) == async_scheduling


def test_a_split_prompt_that_scores_its_tokens_steps_with_the_real_tokens(loaded, workload) -> None:  # noqa: F811
    """A late prompt asks for prompt logprobs and is split over steps: no chained step carries its chunks (they
    run as in the synchronous engine), other steps still chain, and every request's tokens equal the synchronous
    engine's."""
    reqs, params = workload
    scoring = list(params)
    late = len(reqs) // 2
    scoring[late] = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=1)
    tight = {"enable_mixed_steps": True, "max_num_batched_tokens": 12}
    want = _drive(_engine(loaded, True, **tight), reqs, scoring)
    engine = _engine(loaded, True, async_scheduling=True, **tight)
    chained_scoring: list[bool] = []
    _watch_launches(engine, lambda batch, chained: chained_scoring.extend(
        chained and c.prompt_logprobs is not None for c in batch.chunks))
    assert _drive(engine, reqs, scoring) == want
    assert engine._async is not None and engine._async.chained_steps > 5 and not any(chained_scoring)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
