"""graph_defer_captures on the CPU with the pool's stand-in capturer: a batch size admitted while decoding is
served padded, and captured by the engine's idle work once no request is unfinished."""

from __future__ import annotations

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.pool.testing import EagerCapturer

SETTINGS = {"model": "random:smollm2-135m?layers=1", "device": "cpu", "max_model_len": 64, "num_kv_blocks": 32,
            "graph_max_batch_size": 8, "graph_split_batch_size": 4, "graph_grow_step_size": 4,
            "graph_prefill_max_tokens": 0, "cpu_threads": 1}


def _decode(engine: LLMEngine, rows: int) -> dict[str, list[int]]:
    for i in range(rows):
        engine.add_request(f"r{i}", [1 + i, 2, 3], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] = list(out.token_ids)
    return tokens


def _uncovered_size(engine: LLMEngine) -> int:
    cover = set(engine.runner.pool.resident_sizes())
    return next(s for s in engine.runner.pool.ladder if s not in cover and any(c > s for c in cover))


def test_an_admitted_size_is_padded_while_decoding_and_captured_when_idle() -> None:
    capturer = EagerCapturer()
    engine = LLMEngine(EngineConfig(**SETTINGS, graph_defer_captures=True), capturer=capturer)
    size = _uncovered_size(engine)
    at_start = len(capturer.captured)
    tokens = _decode(engine, size)
    assert len(capturer.captured) == at_start  # nothing captured while a request ran
    assert engine.runner.pool.wanted_sizes == (size,)
    assert engine.runner.pool.stats().padded_hits > 0
    assert engine.idle_work() is False  # the wanted size captured; nothing left
    assert capturer.captured[-1] == size and size in engine.runner.pool.resident_sizes()
    # the same greedy tokens as an engine that captured the size in the step
    plain = LLMEngine(EngineConfig(**SETTINGS), capturer=EagerCapturer(), loaded=(engine.model, engine.model_config, None))
    assert _decode(plain, size) == tokens
    assert size in plain.runner.pool.resident_sizes()


def test_idle_work_captures_nothing_while_a_request_is_unfinished() -> None:
    capturer = EagerCapturer()
    engine = LLMEngine(EngineConfig(**SETTINGS, graph_defer_captures=True), capturer=capturer)
    size = _uncovered_size(engine)
    _decode(engine, size)
    captured = len(capturer.captured)
    engine.add_request("late", [5, 6], SamplingParams(max_tokens=2, temperature=0.0))
    assert engine.idle_work() is True and len(capturer.captured) == captured  # still wanted, not captured
