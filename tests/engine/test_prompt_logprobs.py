"""`SamplingParams.prompt_logprobs`: every prompt token's logprob, rank and top k equal `log_softmax` of
transformers' logits over the whole prompt (the default model on the CPU), whether the prompt is prefilled
whole, in chunks (resumed chunks run as paged rows), through the decode graphs (the stand-in capturer: graph
prefill and mixed steps) or beside requests that do not ask; a request that asks reuses no cached prefix, and
a prompt prefilled again after a preemption is scored once. Two tensor-parallel ranks give one rank's values."""

from __future__ import annotations

import pytest
import torch

from graphpool import LLM
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine, RequestOutput
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.llm_outputs import Logprob
from graphpool.engine.logprobs import TokenLogprob
from graphpool.engine.prompt_logprobs import PromptSpan, span_rows
from graphpool.engine.sampling_params import InvalidParam, SamplingParams
from graphpool.engine.scheduler import PrefillChunk, Scheduler
from graphpool.engine.sequence import Sequence
from graphpool.pool.testing import EagerCapturer

PROMPTS = [
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest to find",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
TOL = 2e-3
LADDER = {"graph_max_batch_size": 64, "graph_split_batch_size": 8, "graph_grow_step_size": 8}
CONFIGS = {
    "whole": {},
    "chunked": {"max_num_batched_tokens": 7},
    "graphs": {"max_num_batched_tokens": 16, "graph_prefill_max_tokens": 16, "enable_mixed_steps": True,
               "graph_warmup": "cover", **LADDER},
}


def _engine(loaded, graphs: bool = False, **kw) -> LLMEngine:
    settings = {"device": "cpu", "max_model_len": 160, "num_kv_blocks": 64, "graph_warmup": "none"} | kw
    return LLMEngine(EngineConfig(**settings), loaded=loaded, capturer=EagerCapturer() if graphs else None)


def _run(engine: LLMEngine, params: list[SamplingParams], prompts: list[str] = PROMPTS,
         steps: list | None = None) -> dict[str, RequestOutput]:
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", prompts[i % len(prompts)], p)
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if steps is not None and engine.last_step is not None:
            steps.append(engine.last_step)
    return done


def _reference(hf_model, ids: list[int]) -> torch.Tensor:
    """transformers' log_softmax at prompt positions 0 .. n-2 (each scores the next prompt token)."""
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1)


def _check(lps: list[TokenLogprob], ids: list[int], ref: torch.Tensor, k: int) -> None:
    assert [lp.token_id for lp in lps] == ids[1:]
    for pos, lp in enumerate(lps):
        assert lp.logprob == pytest.approx(ref[pos, lp.token_id].item(), abs=TOL)
        # the rank counts the tokens at least as likely (itself included), up to near-ties
        chosen = ref[pos, lp.token_id]
        assert lp.rank is not None
        assert int((ref[pos] > chosen + TOL).sum()) + 1 <= lp.rank <= int((ref[pos] >= chosen - TOL).sum())
        assert len(lp.top) == k
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        assert values == pytest.approx(ref[pos, [t for t, _ in lp.top]].tolist(), abs=TOL)
        if k:
            assert values[0] == pytest.approx(ref[pos].max().item(), abs=TOL)
            assert lp.rank == 1 or lp.top[0][0] != lp.token_id


def test_params_validate_prompt_logprobs() -> None:
    assert SamplingParams().prompt_logprobs is None and SamplingParams(prompt_logprobs=0).prompt_logprobs == 0
    for bad in (-1, 21, 2.0, True, "3"):
        with pytest.raises(InvalidParam) as info:
            SamplingParams(prompt_logprobs=bad)  # type: ignore[arg-type]
        assert info.value.param == "prompt_logprobs"


def test_span_rows_follow_the_chunks() -> None:
    seq = Sequence("a", list(range(1, 11)), SamplingParams(prompt_logprobs=1), frozenset(), None)
    chunks = [PrefillChunk(seq, 0, 4, None), PrefillChunk(seq, 4, 10, PromptSpan(5, 9, 1)),
              PrefillChunk(seq, 0, 3, PromptSpan(0, 3, 2))]
    assert span_rows(chunks, 2) == [2 + 4 + 1, 2 + 4 + 2, 2 + 4 + 3, 2 + 4 + 4, 12, 13, 14]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prompt_logprobs_equal_transformers(default_model, hf_default_model, name: str) -> None:
    tok = default_model[2]
    kw = CONFIGS[name]
    graphs = name == "graphs"
    params = [
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=4),
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),  # beside it, asking nothing
        SamplingParams(temperature=0.8, seed=5, max_tokens=6, ignore_eos=True, prompt_logprobs=0, logprobs=2),
    ]
    steps: list = []
    done = _run(_engine(default_model, graphs, **kw), params, steps=steps)
    plain = _run(_engine(default_model), [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)] * 3)
    assert done["r1"].prompt_logprobs is None
    for rid, k in (("r0", 4), ("r2", 0)):
        ids = tok.encode(PROMPTS[int(rid[1])])
        lps = done[rid].prompt_logprobs
        assert lps is not None and len(lps) == len(ids) - 1
        _check(lps, ids, _reference(hf_default_model, ids), k)
    # asking changes no output
    assert done["r0"].token_ids == plain["r0"].token_ids and done["r1"].token_ids == plain["r1"].token_ids
    if name == "chunked":  # the prompts are longer than the budget: resumed chunks scored their rows
        assert max(s.num_tokens for s in steps if s.kind == "prefill") <= 7 < len(tok.encode(PROMPTS[0]))
    if graphs:  # prompt rows came from decode-graph replays, and decode steps still replay
        assert any(s.graph for s in steps if s.kind in ("prefill", "mixed"))
        assert any(s.graph for s in steps if s.kind == "decode")


def test_a_request_with_prompt_logprobs_reuses_no_cached_prefix(default_model, hf_default_model) -> None:
    engine = _engine(default_model, enable_prefix_caching=True)
    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    asks = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=3)
    prompt = [PROMPTS[0]]
    _run(engine, [greedy], prompt)
    hits = engine.prefix_cache_stats().hits_tokens
    second = _run(engine, [asks], prompt)["r0"]
    assert engine.prefix_cache_stats().hits_tokens == hits  # computed whole
    ids = default_model[2].encode(PROMPTS[0])
    assert second.prompt_logprobs is not None and len(second.prompt_logprobs) == len(ids) - 1
    _check(second.prompt_logprobs, ids, _reference(hf_default_model, ids), 3)
    third = _run(engine, [greedy], prompt)["r0"]
    assert engine.prefix_cache_stats().hits_tokens > hits and third.token_ids == second.token_ids


def test_a_preempted_prompt_is_scored_once_and_then_reuses_its_cache() -> None:
    bm = BlockManager(64, 4, max_blocks_per_seq=16, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=4, token_budget=4)
    seq = Sequence("a", list(range(1, 11)), SamplingParams(temperature=0, prompt_logprobs=1), frozenset(), None)
    sched.add(seq)
    spans = []
    for _ in range(2):
        batch = sched.schedule()
        assert batch is not None
        chunk = batch.chunks[0]
        spans.append((chunk.start, chunk.end, chunk.prompt_logprobs))
        for p in range(chunk.prompt_logprobs.start, chunk.prompt_logprobs.end):
            seq.prompt_logprobs.append(TokenLogprob(seq.token_ids[p + 1], -1.0, (), 1))
        bm.commit(seq, chunk.end)
    assert spans == [(0, 4, PromptSpan(0, 4, 1)), (4, 8, PromptSpan(4, 8, 1))]
    sched._preempt(seq)
    # prefilled again from 0 (its prompt logprobs are not complete: no cached prefix), scoring only position 8
    again = [sched.schedule() for _ in range(3)]
    assert [(b.chunks[0].start, b.chunks[0].end, b.chunks[0].prompt_logprobs) for b in again] == [
        (0, 4, None), (4, 8, None), (8, 10, PromptSpan(8, 9, 1))]
    seq.prompt_logprobs.append(TokenLogprob(seq.token_ids[9], -1.0, (), 1))
    bm.commit(seq, 10)
    seq.token_ids.append(42)
    sched._preempt(seq)
    resumed = sched.schedule()  # complete now: its full blocks are reused, nothing is scored
    assert resumed is not None and resumed.chunks[0].start == 8 and resumed.chunks[0].prompt_logprobs is None


def test_llm_returns_vllms_shape(default_model) -> None:
    tok = default_model[2]
    llm = LLM.from_engine(_engine(default_model))
    ids = tok.encode(PROMPTS[1])
    out = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2), use_tqdm=False)[0]
    engine_out = _run(_engine(default_model), [SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)],
                      [PROMPTS[1]])["r0"].prompt_logprobs
    assert engine_out is not None and out.prompt_logprobs is not None
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    for token, entry, lp in zip(ids[1:], out.prompt_logprobs[1:], engine_out, strict=True):
        top = [t for t, _ in lp.top]
        assert entry is not None and set(entry) == {*top, token} and len(top) == 2
        assert entry[token] == Logprob(lp.logprob, lp.rank, tok.decode([token], skip_special_tokens=False))
        assert [entry[t].rank for t in top] == [1, 2]
        assert [entry[t].logprob for t in top] == [v for _, v in lp.top]
        assert [entry[t].decoded_token for t in top] == [tok.decode([t], skip_special_tokens=False) for t in top]
    assert llm.generate(PROMPTS[1], SamplingParams(max_tokens=1), use_tqdm=False)[0].prompt_logprobs is None


TP_MODEL = "random:qwen2.5-0.5b?layers=2"
TP_SETTINGS = dict(max_model_len=128, num_kv_blocks=64, max_num_batched_tokens=24, graph_max_batch_size=8,
                   graph_split_batch_size=4, graph_grow_step_size=4, graph_warmup="none")


def test_two_ranks_score_the_prompt_as_one() -> None:
    prompts = [list(range(100, 140)), list(range(200, 210))]
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=3)

    def scores(engine: LLMEngine) -> list[list[dict[int, Logprob]]]:
        outs = LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)
        return [[e for e in o.prompt_logprobs or [] if e is not None] for o in outs]

    one = scores(LLMEngine(EngineConfig(model=TP_MODEL, **TP_SETTINGS)))  # type: ignore[arg-type]
    engine = LLMEngine(EngineConfig(model=TP_MODEL, tensor_parallel_size=2, **TP_SETTINGS))  # type: ignore[arg-type]
    try:
        two = scores(engine)
    finally:
        engine.close()
    assert [len(s) for s in one] == [39, 9]
    for a, b in zip(one, two, strict=True):
        assert [set(x) for x in a] == [set(y) for y in b]
        for x, y in zip(a, b, strict=True):
            for t in x:
                assert x[t].logprob == pytest.approx(y[t].logprob, abs=1e-4)
                assert abs(x[t].rank - y[t].rank) <= 3  # a random model's logits are dense: near-ties
