"""Small prefill steps through the decode graphs (`graph_prefill_max_tokens`): a step of at most N tokens
replays a resident decode graph with one row a token. On the CPU with the pool's stand-in capturer (the
replay is an eager run of the same step on the static buffers): greedy outputs token for token those of the
eager prefill, fresh and resumed chunks and prefix hits alike, and prefill steps never capture."""

from __future__ import annotations

import pytest
from test_chunked_prefill import MAX_MODEL_LEN, TEXTS

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.pool.testing import EagerCapturer
from model_reference import record_steps, run_waves

LADDER = {"graph_max_batch_size": 64, "graph_split_batch_size": 8, "graph_grow_step_size": 8}


@pytest.fixture(scope="module")
def loaded(short_model):
    return short_model  # tests/conftest.py: the embedded model, six of its layers


@pytest.fixture(scope="module")
def prompts(loaded) -> list[list[int]]:
    return [loaded[2].encode(t) for t in TEXTS]


def _engine(loaded, capturer: EagerCapturer | None = None, **kwargs) -> LLMEngine:
    settings = {"device": "cpu", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 96, **LADDER} | kwargs
    return LLMEngine(EngineConfig(**settings), loaded=loaded, capturer=capturer)


def _run(engine: LLMEngine, prompts: list[list[int]], waves: list[range]) -> tuple[dict[str, list[int]], list]:
    steps = record_steps(engine)  # run_waves drives engine.step
    return run_waves(engine, prompts, waves, max_tokens=8), steps


@pytest.fixture(scope="module")
def eager(loaded, prompts) -> dict[str, list[int]]:
    return _run(_engine(loaded, max_num_batched_tokens=48), prompts, [range(len(prompts))])[0]


@pytest.mark.parametrize("caching", [False, True])
def test_graph_prefill_equals_the_eager_prefill(loaded, prompts, eager, caching: bool) -> None:
    capturer = EagerCapturer()
    engine = _engine(loaded, capturer, max_num_batched_tokens=48, graph_prefill_max_tokens=48,
                     enable_prefix_caching=caching, graph_warmup="cover")
    waves = [range(1), range(len(prompts))] if caching else [range(len(prompts))]
    got, steps = _run(engine, prompts, waves)
    assert {k: got[k] for k in eager} == eager
    prefills = [s for s in steps if s.kind == "prefill"]
    replayed = [s for s in prefills if s.graph]
    assert replayed and all(s.num_tokens <= 48 for s in replayed)
    assert all(s.captures == 0 for s in prefills)  # prefill borrows resident graphs, never captures one
    # resumed chunks (a prompt longer than the 48-token budget) replay too
    assert sum(s.num_tokens for s in replayed) > max(len(p) for p in prompts)
    if caching:
        assert engine.prefix_cache_stats().hits_tokens > 0


@pytest.mark.parametrize(("length", "steps", "warmup", "replayed"), [
    (80, 3, "cover", [32, 32, 16]), (120, 3, "cover", []), (80, 0, "cover", []), (80, 3, "none", [])])
def test_a_lone_prompt_is_prefilled_through_the_graphs_in_steps(loaded, prompts, length: int, steps: int,
                                                                 warmup: str, replayed: list[int]) -> None:
    """Nothing decoding: a prompt of up to idle_prefill_steps graph-prefill steps (3 x 32 tokens here) is
    prefilled in steps of 32 tokens, each a replay, with the eager prefill's greedy output; a longer one, any
    with idle_prefill_steps 0, or one no resident graph would serve (no warm-up: none captured yet) in one
    eager step."""
    prompt = [t for p in prompts for t in p][:length]
    want = run_waves(_engine(loaded), [prompt], [range(1)], max_tokens=8)
    engine = _engine(loaded, EagerCapturer(), graph_prefill_max_tokens=32, graph_warmup=warmup,
                     enable_mixed_steps=True, idle_prefill_steps=steps)
    got, steps = _run(engine, [prompt], [range(1)])
    assert got == want
    prefills = [s for s in steps if s.kind == "prefill"]
    assert [s.num_tokens for s in prefills if s.graph] == replayed
    assert [s.num_tokens for s in prefills if not s.graph] == ([] if replayed else [length])


def test_without_a_resident_graph_the_prefill_runs_eagerly(loaded, prompts) -> None:
    engine = _engine(loaded, EagerCapturer(), graph_prefill_max_tokens=64, graph_warmup="none")
    _, steps = _run(engine, [prompts[0][:40]], [range(1)])
    assert [s.graph for s in steps if s.kind == "prefill"] == [False]
    assert engine.graph_stats().captures >= 1  # the decode steps captured; the prefill did not


def test_on_by_default_within_the_largest_graph_and_validated() -> None:
    assert EngineConfig().graph_prefill_max_tokens == 256
    assert EngineConfig(graph_max_batch_size=64).graph_prefill_max_tokens == 64
    assert EngineConfig(graph_prefill_max_tokens=0).graph_prefill_max_tokens == 0
    with pytest.raises(ValueError, match="graph_max_batch_size"):
        EngineConfig(graph_prefill_max_tokens=300)
    with pytest.raises(ValueError, match=">= 0"):
        EngineConfig(graph_prefill_max_tokens=-1)


def test_bench_serve_prefill_configs_are_valid_server_configurations() -> None:
    import argparse

    from graphpool.bench.serve.configs import serve_configs
    from graphpool.engine.args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    configs = serve_configs(46, "256MiB")
    cfg = engine_config_from_args(parser.parse_args(list(configs["eager-prefill"].flags)), device="cpu")
    assert cfg.graph_prefill_max_tokens == 0 and not cfg.enable_mixed_steps
    cfg = engine_config_from_args(parser.parse_args(list(configs["no-mixed-steps"].flags)), device="cpu")
    assert cfg.graph_prefill_max_tokens == 256 and not cfg.enable_mixed_steps
    cfg = engine_config_from_args(parser.parse_args(["--enable-mixed-steps", *configs["eager-idle-prefill"].flags]),
                                  device="cpu")
    assert cfg.graph_prefill_max_tokens == 256 and cfg.mixed_rows == 256 and cfg.idle_prefill_rows == 0
    cfg = engine_config_from_args(parser.parse_args(["--enable-mixed-steps"]), device="cpu")
    assert cfg.enable_mixed_steps and cfg.mixed_rows == 256


def test_async_scheduling_default_follows_the_device_and_the_flag() -> None:
    import argparse

    from graphpool.engine.args import add_engine_args, engine_config_from_args

    assert EngineConfig(device="cpu").async_scheduling is False  # nothing to overlap on the CPU
    assert EngineConfig(device="cpu", async_scheduling=True).async_scheduling is True
    with pytest.raises(ValueError, match="profile_steps"):
        EngineConfig(device="cpu", async_scheduling=True, profile_steps=True)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(["--async-scheduling"]), device="cpu").async_scheduling
    assert not engine_config_from_args(parser.parse_args(["--no-async-scheduling"]), device="cpu").async_scheduling
