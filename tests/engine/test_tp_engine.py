"""The engine at tensor_parallel_size=2 on the CPU (gloo): this process is rank 0, one spawned process is
rank 1. Random qwen2.5-0.5b shapes (14 heads, 2 KV heads, q/k/v bias; 2 of its 24 layers, for time) in
float32 give the greedy tokens of one process, through prefill, chunked prefill, a prefix-cache hit and
decode; the graph path (the EagerCapturer double) keeps both ranks' pools in lockstep."""

from __future__ import annotations

import argparse
import os
import signal

import pytest
import torch.distributed as dist

from graphpool.engine.args import add_engine_args, engine_config_from_args
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.llm import LLM
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.tp_leader import WorkerDiedError
from graphpool.model.loader import model_config
from graphpool.pool.testing import EagerCapturer

MODEL = "random:qwen2.5-0.5b?layers=2"
# a 24-token prefill budget: the 40-token prompt is chunked, and the second prompt (the first's first block
# plus 6 tokens) comes a step after the first, so its first block is a prefix-cache hit
PROMPTS = [list(range(100, 120)), [*range(100, 116), 7, 8, 9, 10, 11, 12], list(range(300, 340))]
SETTINGS = dict(max_model_len=128, num_kv_blocks=64, max_num_batched_tokens=24, graph_max_batch_size=8,
                graph_split_batch_size=4, graph_grow_step_size=4, graph_warmup="2")
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _tokens(engine: LLMEngine) -> list[list[int]]:
    return [o.token_ids for o in LLM.from_engine(engine).generate(PROMPTS, PARAMS, use_tqdm=False)]


@pytest.fixture(scope="module")
def one_rank_tokens() -> list[list[int]]:
    engine = LLMEngine(EngineConfig(model=MODEL, **SETTINGS))  # type: ignore[arg-type]
    assert engine.prefix_cache_stats().hits_tokens == 0
    return _tokens(engine)


def test_two_ranks_give_the_tokens_of_one_eagerly(one_rank_tokens: list[list[int]]) -> None:
    """Without a capturer every decode step is eager (its attention bound follows the batch, on both ranks)."""
    engine = LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2, **SETTINGS))  # type: ignore[arg-type]
    try:
        assert _tokens(engine) == one_rank_tokens
        assert engine.graph_stats_by_rank() == [None, None]
    finally:
        engine.close()


def test_two_ranks_give_the_tokens_of_one_and_their_pools_stay_in_lockstep(one_rank_tokens: list[list[int]]) -> None:
    engine = LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2, **SETTINGS),  # type: ignore[arg-type]
                       capturer=EagerCapturer())
    try:
        assert engine.model.num_kv_heads == 1 and engine.kv_caches[0][0].shape[2] == 1  # rank 0's KV head
        assert _tokens(engine) == one_rank_tokens
        assert engine.prefix_cache_stats().hits_tokens == 16
        rank0, rank1 = engine.graph_stats_by_rank()
        assert rank0 is not None and rank0 == rank1  # the EagerCapturer takes no time: seconds are 0 on both
        assert rank0.hits and rank0.captures >= 2 and rank0.eager_steps == 0
        # a dead rank is named at the next step
        (proc,) = engine._tp._procs  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
        with pytest.raises(WorkerDiedError, match=r"rank 1 \(pid \d+\) died"):
            _tokens(engine)
    finally:
        engine.close()
    assert not dist.is_initialized() and not proc.is_alive()


class _BreaksOnRank1(EagerCapturer):
    """A capturer that raises (a bug, not a capture failure) in any process but the one that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.home = os.getpid()

    def capture(self, size, fn):  # type: ignore[no-untyped-def]
        if os.getpid() != self.home:
            raise RuntimeError("rank 1 broke on purpose")
        return super().capture(size, fn)


def test_a_rank_that_dies_while_serving_is_named_with_its_traceback() -> None:
    settings = {**SETTINGS, "graph_warmup": "none"}
    engine = LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2, **settings),  # type: ignore[arg-type]
                       capturer=_BreaksOnRank1())
    try:
        (proc,) = engine._tp._procs  # type: ignore[union-attr]
        with pytest.raises(RuntimeError):  # rank 0's all-reduce loses its peer (gloo raises at once)
            _tokens(engine)
        proc.join(120)
        with pytest.raises(WorkerDiedError, match=r"(?s)rank 1 \(pid \d+\) died \(exit code 1\).*broke on purpose"):
            _tokens(engine)
    finally:
        engine.close()
    assert not dist.is_initialized()


class _FailsOnRank1:
    """Pickled to rank 1 as its capturer, where unpickling it raises: rank 1 dies before it starts."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_raise, ("rank 1 cannot start",))


def _raise(message: str) -> None:
    raise RuntimeError(message)


def test_a_rank_that_dies_while_starting_is_reported() -> None:
    config = EngineConfig(model=MODEL, tensor_parallel_size=2, **SETTINGS)  # type: ignore[arg-type]
    with pytest.raises(WorkerDiedError, match=r"rank 1 \(pid \d+\) died \(exit code 1\)"):
        LLMEngine(config, capturer=_FailsOnRank1())  # type: ignore[arg-type]
    assert not dist.is_initialized()


def test_tensor_parallel_settings_are_checked() -> None:
    for bad in (0, -1, "2", True):
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            EngineConfig(model=MODEL, tensor_parallel_size=bad)  # type: ignore[arg-type]
    four = EngineConfig(model=MODEL, tensor_parallel_size=4)  # 14 heads: refused where the model loads
    with pytest.raises(ValueError, match="must divide the model's num_heads"):
        LLMEngine(four)
    assert not dist.is_initialized()  # refused before any rank started


def test_the_commands_say_why_the_model_does_not_shard(capsys: pytest.CaptureFixture[str]) -> None:
    from graphpool.cli import main
    from graphpool.server.main import main as serve_main

    flags = ["--model", MODEL, "--device", "cpu", "--tensor-parallel-size", "4"]
    assert main(["generate", "--prompt", "x", *flags]) == 2
    assert serve_main(["--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert "graphpool generate: tensor_parallel_size 4 must divide the model's num_heads (14)" in err
    assert "graphpool serve: tensor_parallel_size 4 must divide the model's num_heads (14)" in err
    with pytest.raises(ValueError, match="`loaded` cannot be used"):
        LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2), loaded=(None, None, None))
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(["--model", MODEL, "--tensor-parallel-size", "2"]))
    assert config.tensor_parallel_size == 2 and config.rank_device(1) == "cpu"


def test_a_random_preset_may_keep_its_first_layers() -> None:
    assert model_config(MODEL).num_layers == 2
    assert model_config(MODEL).num_kv_heads == model_config("random:qwen2.5-0.5b").num_kv_heads == 2
    for bad in ("random:qwen2.5-0.5b?layers=0", "random:qwen2.5-0.5b?heads=2", "random:qwen2.5-0.5b?layers=x"):
        with pytest.raises(ValueError, match="layers=N"):
            model_config(bad)


def test_mixed_steps_on_two_ranks_give_the_tokens_of_one() -> None:
    """A mixed step's rows go to rank 1 as a decode step's do (runner.mixed -> decode_rows -> announce)."""
    from graphpool.engine.timeline import records_from_export

    settings = SETTINGS | {"enable_mixed_steps": True, "record_step_timeline": True}
    one = _tokens(LLMEngine(EngineConfig(model=MODEL, **settings)))  # type: ignore[arg-type]
    engine = LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2, **settings),  # type: ignore[arg-type]
                       capturer=EagerCapturer())
    try:
        assert _tokens(engine) == one
        assert engine.timeline is not None
        kinds = [r.kind for r in records_from_export(engine.timeline.export())]
        assert "mixed" in kinds
    finally:
        engine.close()


def test_graph_prefill_on_two_ranks_gives_the_tokens_of_one() -> None:
    """A prefill step that replays a decode graph goes to rank 1 as a decode step with its decision."""
    from graphpool.engine.timeline import records_from_export

    settings = SETTINGS | {"graph_prefill_max_tokens": 8, "max_num_batched_tokens": 8, "graph_warmup": "2,8",
                           "record_step_timeline": True}
    one = _tokens(LLMEngine(EngineConfig(model=MODEL, **settings), capturer=EagerCapturer()))  # type: ignore[arg-type]
    engine = LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2, **settings),  # type: ignore[arg-type]
                       capturer=EagerCapturer())
    try:
        assert _tokens(engine) == one
        assert engine.timeline is not None
        steps = records_from_export(engine.timeline.export())
        assert any(r.kind == "prefill" and r.graph for r in steps)
    finally:
        engine.close()


def test_microbatch_overlap_on_two_ranks_gives_the_tokens_of_one(one_rank_tokens: list[list[int]]) -> None:
    """Each decode step as two microbatches, each one's all-reduces (gloo, async) running while the other
    computes; graphs of two microbatches in lockstep on both ranks."""
    settings = SETTINGS | {"enable_microbatch_overlap": True}
    engine = LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2, **settings),  # type: ignore[arg-type]
                       capturer=EagerCapturer())
    try:
        assert engine.runner.pool.config.num_microbatches == 2
        assert _tokens(engine) == one_rank_tokens
        rank0, rank1 = engine.graph_stats_by_rank()
        assert rank0 is not None and rank0 == rank1 and rank0.hits and rank0.eager_steps == 0
    finally:
        engine.close()


@pytest.mark.parametrize("mixed", [False, True])
def test_async_scheduling_on_two_ranks_gives_the_tokens_of_one(one_rank_tokens: list[list[int]], mixed: bool) -> None:
    """A chained step's input tokens are still on rank 0's device: rank 1 gets them by a broadcast (a chained
    mixed step's prompt tokens with them)."""
    settings = SETTINGS | {"async_scheduling": True, "enable_mixed_steps": mixed}
    engine = LLMEngine(EngineConfig(model=MODEL, tensor_parallel_size=2, **settings),  # type: ignore[arg-type]
                       capturer=EagerCapturer())
    try:
        assert _tokens(engine) == one_rank_tokens
        assert engine.stats().async_chained_steps_total > 0
        assert engine._async is not None
        assert (engine._async.chained_with_prompts > 0) == mixed
        rank0, rank1 = engine.graph_stats_by_rank()
        assert rank0 is not None and rank0 == rank1 and rank0.hits
    finally:
        engine.close()
