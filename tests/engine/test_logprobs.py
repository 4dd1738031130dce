"""`SamplingParams.logprobs`: the engine's per-token logprobs equal `log_softmax` of transformers' logits for
the same tokens (the raw model output: temperature and penalties change the draw, not the values), greedy
tokens are their own top-1, and async scheduling and the graph path give the same as the synchronous eager
engine. The default model on the CPU."""

from __future__ import annotations

import pytest
import torch

from graphpool import LLM
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine, RequestOutput
from graphpool.engine.logprobs import gather_logprobs
from graphpool.engine.sampling_params import InvalidParam, SamplingParams
from graphpool.pool.testing import EagerCapturer

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village"]
TOL = 2e-3


def _engine(loaded, graphs: bool = False, **kw) -> LLMEngine:
    settings = {"device": "cpu", "max_model_len": 128, "num_kv_blocks": 64, "graph_warmup": "none"} | kw
    return LLMEngine(EngineConfig(**settings), loaded=loaded, capturer=EagerCapturer() if graphs else None)


def _run(engine: LLMEngine, params: list[SamplingParams]) -> dict[str, RequestOutput]:
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", PROMPTS[i % len(PROMPTS)], p)
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.new_logprobs is None or len(out.new_logprobs) == len(out.new_token_ids)
            if out.finished:
                done[out.request_id] = out
    return done


def _reference(hf_model, prompt_ids: list[int], out_ids: list[int]) -> torch.Tensor:
    """transformers' log_softmax at each output position: [len(out_ids), vocab]."""
    ids = torch.tensor([prompt_ids + out_ids])
    with torch.no_grad():
        logits = hf_model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)


def test_params_validate_logprobs() -> None:
    assert SamplingParams().logprobs is None and SamplingParams(logprobs=20).logprobs == 20
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(InvalidParam) as info:
            SamplingParams(logprobs=bad)  # type: ignore[arg-type]
        assert info.value.param == "logprobs"


def test_gather_only_the_rows_that_ask() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 0.0], [1.0, 1.0, 4.0, 0.0]])
    tokens = torch.tensor([1, 0, 2])
    step = gather_logprobs(logits, [2, None, 0], tokens)
    assert step is not None and step.rows == [0, 2]
    rows = step.start_copy(pin=False).by_row(tokens.tolist())
    want = torch.log_softmax(logits, dim=-1)
    assert set(rows) == {0, 2}
    assert rows[0].token_id == 1 and rows[0].logprob == pytest.approx(want[0, 1].item())
    assert [t for t, _ in rows[0].top] == [3, 2]
    assert [v for _, v in rows[0].top] == pytest.approx(want[0, [3, 2]].tolist())
    assert rows[2].top == () and rows[2].logprob == pytest.approx(want[2, 2].item())
    assert gather_logprobs(logits, [None, None, None], tokens) is None


def test_logprobs_equal_transformers_log_softmax(default_model, hf_default_model) -> None:
    tok = default_model[2]
    params = [
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5),
        # NOTE: a hot, penalised draw: the values are still the raw model's, not those it was drawn from
        SamplingParams(temperature=1.7, seed=3, max_tokens=8, ignore_eos=True, logprobs=3, repetition_penalty=1.5,
                       top_k=20),
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
    ]
    done = _run(_engine(default_model), params)
    assert done["r2"].logprobs is None
    for rid, k in (("r0", 5), ("r1", 3)):
        out = done[rid]
        assert out.logprobs is not None and [lp.token_id for lp in out.logprobs] == out.token_ids
        ref = _reference(hf_default_model, tok.encode(PROMPTS[int(rid[1])]), out.token_ids)
        for pos, lp in enumerate(out.logprobs):
            assert lp.logprob == pytest.approx(ref[pos, lp.token_id].item(), abs=TOL)
            assert len(lp.top) == k
            top_ids = [t for t, _ in lp.top]
            assert [v for _, v in lp.top] == pytest.approx(ref[pos, top_ids].tolist(), abs=TOL)
            assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
            assert lp.top[0][1] == pytest.approx(ref[pos].max().item(), abs=TOL)
    greedy = done["r0"].logprobs
    assert greedy is not None and all(lp.top[0][0] == lp.token_id for lp in greedy)
    assert all(lp.logprob == lp.top[0][1] for lp in greedy)
    # the hot draw left the argmax at least once, where its own logprob is below the top one
    assert any(lp.top[0][0] != lp.token_id and lp.logprob < lp.top[0][1] for lp in done["r1"].logprobs or [])


def test_async_scheduling_and_graphs_carry_the_same_logprobs(default_model) -> None:
    params = [
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.9, seed=11, max_tokens=12, ignore_eos=True, logprobs=0),
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True, logprobs=4, presence_penalty=1.0),
    ]
    want = _run(_engine(default_model), params)
    for kw in ({"graphs": True}, {"graphs": True, "async_scheduling": True}, {"async_scheduling": True}):
        engine = _engine(default_model, **kw)
        got = _run(engine, params)
        assert got.keys() == want.keys()
        for rid, out in got.items():
            assert out.token_ids == want[rid].token_ids
            if want[rid].logprobs is None:
                assert out.logprobs is None
                continue
            assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
            for a, b in zip(out.logprobs, want[rid].logprobs, strict=True):
                assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-4)
                assert [t for t, _ in a.top] == [t for t, _ in b.top]
        if kw.get("async_scheduling"):
            assert engine._async is not None and engine._async.chained_steps > 3
        if kw.get("graphs"):
            assert engine.graphs_off is None


def test_llm_generate_hands_the_logprobs_on(default_model) -> None:
    llm = LLM.from_engine(_engine(default_model))
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=1)
    out = llm.generate(PROMPTS[0], params, use_tqdm=False)[0]
    assert out.logprobs is not None and [lp.token_id for lp in out.logprobs] == out.token_ids
    seq = out.outputs[0]
    assert seq.logprobs == out.logprobs and seq.cumulative_logprob == pytest.approx(
        sum(lp.logprob for lp in out.logprobs))
    plain = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert plain[0].logprobs is None and plain[0].outputs[0].cumulative_logprob is None
