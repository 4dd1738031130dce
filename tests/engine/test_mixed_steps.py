"""Mixed steps (`enable_mixed_steps`): a decode step takes prompt chunks into its leftover rows, run as
decode-attention rows, so running streams get a token in the steps that prefill. Greedy outputs token for
token those of strict interleaving (six layers of the real default model, CPU, eager and through the stand-in
capturer)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest
from test_chunked_prefill import MAX_MODEL_LEN
from test_graph_prefill import loaded, prompts  # noqa: F401 (fixtures)

from graphpool.engine.args import add_engine_args, engine_config_from_args
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.scheduler import Scheduler
from graphpool.engine.sequence import Sequence
from graphpool.pool.testing import EagerCapturer

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
LADDER = {"graph_max_batch_size": 64, "graph_split_batch_size": 8, "graph_grow_step_size": 8}


def _seq(rid: str, n: int, max_tokens: int = 4) -> Sequence:
    return Sequence(rid, list(range(1, n + 1)), SamplingParams(temperature=0, max_tokens=max_tokens), frozenset(), None)


def test_scheduler_fills_a_decode_steps_leftover_rows_with_chunks() -> None:
    bm = BlockManager(64, 4, max_blocks_per_seq=16, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, token_budget=32, mixed_rows=10)
    sched.add(_seq("a", 5))
    first = sched.schedule()
    assert first is not None and first.kind == "prefill"  # nothing decodes yet: a plain prefill step
    first.seqs[0].token_ids.append(7)  # its sampled token
    sched.add(_seq("b", 20))
    step = sched.schedule()
    assert step is not None and step.kind == "mixed"
    assert [s.request_id for s in step.seqs] == ["a"] and len(step.slots) == 1  # b's chunk is not its last
    assert [(c.seq.request_id, c.start, c.end) for c in step.chunks] == [("b", 0, 9)]  # 10 rows - 1 decode row
    assert step.num_tokens == 10
    step.seqs[0].token_ids.append(8)
    step = sched.schedule()
    assert step is not None and step.kind == "mixed" and [(c.start, c.end) for c in step.chunks] == [(9, 18)]


def test_mixed_prompt_tokens_bound_a_mixed_steps_chunks() -> None:
    """mixed_prompt_tokens: a mixed step takes at most that many prompt tokens, though more rows are left; a
    step with nothing decoding is a prefill step, which the bound leaves alone."""
    bm = BlockManager(64, 4, max_blocks_per_seq=16, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, token_budget=32, mixed_rows=10, mixed_prompt_tokens=4)
    sched.add(_seq("a", 6))
    first = sched.schedule()
    assert first is not None and first.kind == "prefill" and first.num_tokens == 6
    first.seqs[0].token_ids.append(7)
    sched.add(_seq("b", 7))
    spans = []
    for token in (8, 9):
        step = sched.schedule()
        assert step is not None and step.kind == "mixed" and len(step.slots) == 1
        spans += [(c.start, c.end) for c in step.chunks]
        step.seqs[0].token_ids.append(token)
    assert spans == [(0, 4), (4, 7)]  # 4 + 3 of b's 7 tokens, where 9 rows were free
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--mixed-prompt-tokens", "64"])
    assert engine_config_from_args(args, device="cpu").mixed_prompt_tokens == 64
    with pytest.raises(ValueError, match="mixed_prompt_tokens"):
        EngineConfig(mixed_prompt_tokens=0)


@pytest.mark.parametrize(("prompt", "chunks"), [(20, [(0, 8), (8, 16), (16, 20)]), (25, [(0, 25)])])
def test_scheduler_chunks_a_lone_prompt_into_graph_sized_steps(prompt: int, chunks: list) -> None:
    """Nothing decoding: a prompt of at most idle_prefill_steps x idle_prefill_rows tokens (3 x 8 here) is
    prefilled 8 tokens a step; a longer one in one step of the token budget."""
    bm = BlockManager(64, 4, max_blocks_per_seq=16, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, token_budget=32, mixed_rows=10, idle_prefill_rows=8, idle_prefill_steps=3)
    sched.add(_seq("a", prompt))
    got = []
    while (step := sched.schedule()) is not None and step.kind == "prefill":
        got += [(c.start, c.end) for c in step.chunks]
        if step.seqs:  # its last chunk: the first token is sampled, and the next step decodes it
            break
    assert got == chunks and [s.request_id for s in step.seqs] == ["a"]
    assert Scheduler(bm, max_num_seqs=8, token_budget=32, mixed_rows=10).idle_prefill_rows == 0


def test_scheduler_keeps_one_step_when_no_graph_would_replay() -> None:
    asked = []
    bm = BlockManager(64, 4, max_blocks_per_seq=16, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, token_budget=32, mixed_rows=10, idle_prefill_rows=8, idle_prefill_steps=3,
                      graph_ready=lambda rows, max_len: asked.append((rows, max_len)) is not None)
    sched.add(_seq("a", 20))
    step = sched.schedule()
    assert step is not None and [(c.start, c.end) for c in step.chunks] == [(0, 20)] and asked == [(8, 20)]


def test_idle_prefill_rows_follow_graph_prefill_and_the_steps() -> None:
    assert EngineConfig(enable_mixed_steps=True).idle_prefill_rows == 256
    assert EngineConfig(enable_mixed_steps=True, graph_prefill_max_tokens=64).idle_prefill_rows == 64
    assert EngineConfig(enable_mixed_steps=True, max_num_batched_tokens=100).idle_prefill_rows == 100
    assert EngineConfig(enable_mixed_steps=True, idle_prefill_steps=0).idle_prefill_rows == 0
    assert EngineConfig(enable_mixed_steps=True, graph_prefill_max_tokens=0).idle_prefill_rows == 0
    assert EngineConfig(device="cpu").idle_prefill_rows == 0  # no mixed steps there
    with pytest.raises(ValueError, match="idle_prefill_steps must be an int >= 0"):
        EngineConfig(idle_prefill_steps=-1)


def test_scheduler_without_mixed_rows_interleaves_strictly() -> None:
    bm = BlockManager(64, 4, max_blocks_per_seq=16, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, token_budget=32)
    sched.add(_seq("a", 5))
    sched.schedule().seqs[0].token_ids.append(7)
    sched.add(_seq("b", 20))
    assert sched.schedule().kind == "decode"
    assert sched.schedule().kind == "prefill"


def _drive(engine: LLMEngine, requests: list[list[int]], params: SamplingParams = GREEDY,
           after_step: Callable[[], Any] | None = None) -> tuple[dict[str, list[int]], list]:
    """r0 alone until it decodes, then the other prompts arrive while it runs -> (outputs, each step's
    `after_step()`, by default its `last_step`)."""
    out: dict[str, list[int]] = {}
    steps = []
    engine.add_request("r0", requests[0], params)
    for n in range(10_000):
        if n == 2:
            for i, p in enumerate(requests[1:], 1):
                engine.add_request(f"r{i}", p, params)
        if n > 2 and not engine.has_unfinished_requests():
            break
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.token_ids
        steps.append(after_step() if after_step is not None else engine.last_step)
    return out, steps


@pytest.mark.parametrize("graphs", [False, True])
def test_mixed_steps_equal_strict_interleaving(loaded, prompts, graphs: bool) -> None:  # noqa: F811
    settings = {"device": "cpu", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 96, "max_num_batched_tokens": 40,
                "enable_prefix_caching": False, **LADDER}

    def engine(**kw) -> LLMEngine:
        return LLMEngine(EngineConfig(**settings, **kw), loaded=loaded, capturer=EagerCapturer() if graphs else None)

    want, strict_steps = _drive(engine(), prompts)
    got, steps = _drive(engine(enable_mixed_steps=True), prompts)
    assert got == want and len(got) == len(prompts)
    mixed = [s for s in steps if s is not None and s.kind == "mixed"]
    assert mixed and all(s.num_tokens <= 40 for s in mixed)
    assert not any(s is not None and s.kind == "mixed" for s in strict_steps)
    # r0 decodes through the other prompts' prefill: fewer steps in all than strict interleaving
    assert len(steps) < len(strict_steps)
    if graphs:
        assert any(s.graph for s in mixed)


def test_mixed_rows_follow_the_largest_graph_and_the_budget() -> None:
    # NOTE: on by default only where decode graphs run (CUDA): tests/gpu/test_graph_prefill_gpu.py checks that
    assert EngineConfig(device="cpu").mixed_rows == 0 and not EngineConfig(disable_cudagraph=True).enable_mixed_steps
    assert EngineConfig(enable_mixed_steps=True).mixed_rows == 256
    assert EngineConfig(enable_mixed_steps=True, max_num_batched_tokens=100).mixed_rows == 100
    with pytest.raises(ValueError, match="enable_mixed_steps must be a bool"):
        EngineConfig(enable_mixed_steps=1)  # type: ignore[arg-type]


def _head_rows_per_step(engine: LLMEngine, requests: list[list[int]], params: SamplingParams,
                        monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int, int]]:
    """(kind, batch size, tokens, rows the LM head ran on) of each step of `_drive`."""
    calls: list[int] = []
    compute_logits = engine.runner.model.compute_logits
    monkeypatch.setattr(engine.runner.model, "compute_logits",
                        lambda hidden, **kw: calls.append(hidden.shape[0]) or compute_logits(hidden, **kw))

    def record() -> tuple[str, int, int, int] | None:
        s, rows = engine.last_step, sum(calls)
        calls.clear()
        return None if s is None else (s.kind, s.batch_size, s.num_tokens, rows)

    return [s for s in _drive(engine, requests, params, record)[1] if s is not None]


@pytest.mark.parametrize("graphs", [False, True])
def test_the_head_of_a_mixed_step_runs_on_the_rows_that_give_tokens(loaded, prompts, monkeypatch,  # noqa: F811
                                                                    graphs: bool) -> None:
    """A chunk's rows but its prompt's last give no token: the LM head skips them; where a chunk scores its
    prompt tokens (prompt logprobs) it runs on every row."""
    settings = {"device": "cpu", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 96, "max_num_batched_tokens": 40,
                "enable_prefix_caching": False, "enable_mixed_steps": True, "graph_sample_max_batch_size": 0,
                **LADDER}

    def engine() -> LLMEngine:
        return LLMEngine(EngineConfig(**settings), loaded=loaded, capturer=EagerCapturer() if graphs else None)

    mixed = [s for s in _head_rows_per_step(engine(), prompts, GREEDY, monkeypatch) if s[0] == "mixed"]
    # at most one row a decode row and a chunk, and fewer than the step's tokens where a chunk has several
    assert mixed and all(rows <= bs for _, bs, _, rows in mixed)
    assert any(rows < tokens for _, _, tokens, rows in mixed)
    monkeypatch.undo()
    scoring = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=1)
    mixed = [s for s in _head_rows_per_step(engine(), prompts, scoring, monkeypatch) if s[0] == "mixed"]
    assert mixed and any(rows == tokens > bs for _, bs, tokens, rows in mixed)
