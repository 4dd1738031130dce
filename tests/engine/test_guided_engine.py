"""Guided decoding on the real default model (CPU): every kind of constraint, greedy and sampled, in one batch
with an unguided request (whose output it does not change); the prefill's first token is masked; through the
pool's stand-in capturer, decode steps with guided rows stay graph replays, and with async scheduling a batch
holding a guided row is never launched ahead while giving the synchronous engine's outputs."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.guided import GuidedDecoding
from graphpool.pool.testing import EagerCapturer
from guided_cases import GUIDES, check

# NOTE: looked up, not imported: xgrammar takes ~1 s to import, at collection in every xdist worker
pytestmark = pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="xgrammar is not installed")
pytest.importorskip("jsonschema")

PROMPT = "Describe a person as JSON with a name, an age and a city:"
LADDER = {"graph_max_batch_size": 16, "graph_split_batch_size": 4, "graph_grow_step_size": 4}


def _engine(loaded: Any, capturer: EagerCapturer | None = None, **kwargs: Any) -> LLMEngine:
    settings = {"device": "cpu", "max_model_len": 256, "num_kv_blocks": 64, "graph_warmup": "none", **LADDER}
    return LLMEngine(EngineConfig(**settings | kwargs), loaded=loaded, capturer=capturer)




def _batch() -> list[SamplingParams]:
    """Each constraint greedy and sampled, a greedy json_object, and one unguided request last."""
    params = [SamplingParams(temperature=t, seed=3, max_tokens=64, guided=g) for g in GUIDES for t in (0, 0.8)]
    params.append(SamplingParams(temperature=0, max_tokens=64, guided=GuidedDecoding("json_object")))
    return [*params, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]


def test_every_constraint_greedy_and_sampled_in_one_batch(default_model) -> None:
    llm = LLM.from_engine(_engine(default_model))
    params = _batch()
    outs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    for p, out in zip(params[:-1], outs[:-1], strict=True):
        assert out.finish_reason == "stop", (p.guided, out.text)
        assert out.token_ids[-1] in llm.engine.eos_token_ids  # ended on the grammar's stop token ...
        check(p.guided, out.text)  # ... which the text leaves out
    alone = llm.generate(PROMPT, params[-1], use_tqdm=False)[0]
    assert outs[-1].token_ids == alone.token_ids  # the unguided row is sampled as without the others


def test_chat_json_object_parses(default_model) -> None:
    llm = LLM.from_engine(_engine(default_model))
    messages = [{"role": "user", "content": "Give me a person with a name, age and city as JSON."}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=96, guided=GuidedDecoding("json_object")),
                   use_tqdm=False)[0]
    assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict)


def test_the_prefills_token_is_masked(default_model) -> None:
    llm = LLM.from_engine(_engine(default_model))
    params = SamplingParams(temperature=0, max_tokens=1, guided=GuidedDecoding("regex", "7[0-9]"))
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    assert out.text == "7" and out.finish_reason == "length"
    free = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert free.text != "7"  # the model's own first token differs: the mask chose it


def test_a_bad_spec_is_refused_on_admission(default_model) -> None:
    llm = LLM.from_engine(_engine(default_model))
    with pytest.raises(ValueError, match="regex constraint does not compile"):
        llm.generate(PROMPT, SamplingParams(guided=GuidedDecoding("regex", "a{3,1}")), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def _drive(engine: LLMEngine, params: list[SamplingParams], prompt: list[int]) -> dict[str, Any]:
    """Runs the requests; checks after every step that nothing is in flight while a guided row runs."""
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", prompt, p)
    out, guided_steps = {}, []
    while engine.has_unfinished_requests():
        guided_running = any(s.guide is not None for s in engine.scheduler.running)
        outputs = engine.step()
        step = engine.last_step
        if guided_running and step is not None and step.kind == "decode":
            guided_steps.append(step.graph)
            assert engine._async is None or engine._async.inflight is None  # no step launched ahead
        out.update({o.request_id: (o.token_ids, o.text, o.finish_reason) for o in outputs if o.finished})
    return {"out": out, "guided_steps": guided_steps}


def test_graph_replays_and_async_scheduling(default_model) -> None:
    prompt = default_model[2].encode(PROMPT)
    # the unguided requests outlast the guided ones, so async scheduling chains steps once those are done
    params = [*_batch()[:-1], *[SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * 2]
    sync = _engine(default_model, EagerCapturer(), async_scheduling=False)
    want = _drive(sync, params, prompt)
    engine = _engine(default_model, EagerCapturer(), async_scheduling=True)
    got = _drive(engine, params, prompt)
    assert got["out"] == want["out"]
    for i, p in enumerate(params[:-2]):
        check(p.guided, got["out"][f"r{i}"][1])
    assert len(got["guided_steps"]) > 10 and all(got["guided_steps"])  # every guided decode step replayed
    assert engine.graph_stats().eager_steps == 0
    assert engine._async is not None and engine._async.chained_steps > 5
