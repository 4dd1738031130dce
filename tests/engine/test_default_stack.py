"""The GPU's default engine stack on the CPU: decode graphs (the pool's stand-in capturer), prefill steps
through them, mixed steps, prefix caching, chunked prefill, and too few KV blocks (preemption), with and without
async scheduling and microbatch overlap, against the plainest engine (eager, strict interleaving, no cache, ample KV): greedy tokens
equal, request for request, with prompts arriving while others decode."""

from __future__ import annotations

import pytest
from test_async_scheduling import _drive
from test_chunked_prefill import MAX_MODEL_LEN
from test_graph_prefill import loaded, prompts  # noqa: F401 (fixtures)

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.pool.testing import EagerCapturer

LADDER = {"graph_max_batch_size": 32, "graph_split_batch_size": 8, "graph_grow_step_size": 8}


@pytest.fixture(scope="module")
def workload(prompts):  # noqa: F811
    # shared 12-token prefixes (prefix-cache hits) and prompts long enough to be chunked at a budget of 24
    reqs = [p[:30] for p in prompts] + [p[:12] + p[20:34] for p in prompts]
    params = [SamplingParams(temperature=0, max_tokens=10 + i % 6, ignore_eos=True) for i in range(len(reqs))]
    return reqs, params


@pytest.fixture(scope="module")
def plain(loaded, workload):  # noqa: F811
    reqs, params = workload
    engine = LLMEngine(EngineConfig(device="cpu", max_model_len=MAX_MODEL_LEN, num_kv_blocks=128,
                                    enable_prefix_caching=False, graph_prefill_max_tokens=0), loaded=loaded)
    return _drive(engine, reqs, params)


@pytest.mark.parametrize(("async_scheduling", "overlap"), [(False, False), (True, False), (False, True), (True, True)])
def test_default_stack_equals_the_plain_engine(loaded, workload, plain, async_scheduling: bool,  # noqa: F811
                                               overlap: bool) -> None:
    reqs, params = workload
    engine = LLMEngine(EngineConfig(device="cpu", max_model_len=MAX_MODEL_LEN, num_kv_blocks=18, block_size=4,
                                    max_num_batched_tokens=24, enable_mixed_steps=True, graph_warmup="none",
                                    async_scheduling=async_scheduling, enable_microbatch_overlap=overlap,
                                    **LADDER),
                       loaded=loaded, capturer=EagerCapturer())
    kinds: dict[str, int] = {}
    step = engine.step

    def counting_step():
        out = step()
        if engine.last_step is not None:
            kinds[engine.last_step.kind] = kinds.get(engine.last_step.kind, 0) + 1
        return out

    engine.step = counting_step  # type: ignore[method-assign]
    got = _drive(engine, reqs, params)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in plain.items()}
    assert kinds.get("mixed", 0) > 0 and kinds.get("decode", 0) > 0, kinds
    assert engine.scheduler.num_preemptions > 0
    assert engine.prefix_cache_stats().hits_tokens > 0
    assert engine.graph_stats().hits + engine.graph_stats().padded_hits > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
