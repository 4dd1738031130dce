"""Small prefill steps through the decode graphs on the GPU (default model, Triton kernels, real CUDA
graphs): float32 greedy tokens equal those of the eager prefill (fresh chunks, resumed chunks, prefix hits, a
lone long prompt in graph-sized steps);
bfloat16 prefill step times with and without are reported (no bound asserted: `bench serve --configs dg`
measures the serving side)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from gpu_helpers import report
from test_prefix_chunked_gpu import MAX_MODEL_LEN, prompts  # noqa: F401 (a fixture)

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model
from model_reference import record_steps, run_waves

BASE = {"device": "cuda", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 256, "max_num_batched_tokens": 256}


@pytest.mark.parametrize("caching", [False, True])
def test_float32_greedy_equal_through_the_decode_graphs(prompts, caching: bool) -> None:  # noqa: F811
    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=MAX_MODEL_LEN)
    base = BASE | {"dtype": "float32", "enable_prefix_caching": caching, "max_num_batched_tokens": 64}
    waves = [[0], list(range(1, len(prompts)))]
    # NOTE: the reference prefills eagerly; both without mixed steps (on by default), so every prompt is a
    # prefill step
    base |= {"enable_mixed_steps": False}
    ref = run_waves(LLMEngine(EngineConfig(**base, graph_prefill_max_tokens=0), loaded=loaded), prompts, waves,
                    max_tokens=24)
    engine = LLMEngine(EngineConfig(**base, graph_prefill_max_tokens=64), loaded=loaded)
    steps = record_steps(engine)
    got = run_waves(engine, prompts, waves, max_tokens=24)
    prefills = [s for s in steps if s.kind == "prefill"]
    replayed = sum(s.graph for s in prefills)
    report(f"graph_prefill_gpu fp32 caching={caching}: prefill steps replayed", f"{replayed}/{len(prefills)}")
    assert got == ref
    assert replayed > 0 and all(s.captures == 0 for s in prefills)


def test_bfloat16_prefill_step_times_with_and_without(prompts) -> None:  # noqa: F811
    loaded = load_model(None, "cuda", torch.bfloat16, "triton", max_positions=MAX_MODEL_LEN)
    for n in (0, 256):
        engine = LLMEngine(EngineConfig(**BASE, graph_prefill_max_tokens=n, enable_prefix_caching=False),
                           loaded=loaded)
        times: dict[int, list[float]] = {}
        for length in (8, 40, 120, 250):
            for rep in range(6):
                engine.add_request(f"r{length}-{rep}", prompts[rep % len(prompts)][:length],
                                   SamplingParams(temperature=0, max_tokens=1))
                torch.cuda.synchronize()
                t = time.perf_counter()
                engine.step()
                torch.cuda.synchronize()
                assert engine.last_step.kind == "prefill" and engine.last_step.graph == (n > 0)
                times.setdefault(length, []).append((time.perf_counter() - t) * 1e3)
                while engine.has_unfinished_requests():
                    engine.step()
        medians = {length: round(statistics.median(v[1:]), 2) for length, v in times.items()}
        report(f"graph_prefill_gpu bf16 graph_prefill_max_tokens={n}: prefill step ms by prompt length", medians)


def test_float32_lone_prompts_are_prefilled_in_graph_steps(prompts) -> None:  # noqa: F811
    """Nothing decoding, the defaults (mixed steps on): a prompt of 300 or 700 tokens is prefilled in steps of
    at most 256 tokens, each a replay; greedy tokens equal those of one eager prefill step (graph prefill
    off). The time to the first token both ways is reported (no bound asserted)."""
    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=1024)
    text = [t for p in prompts for t in p]
    cases = [text[:300], text[:700]]
    assert len(cases[1]) == 700
    base = {"device": "cuda", "dtype": "float32", "max_model_len": 1024, "num_kv_blocks": 256,
            "enable_prefix_caching": False}
    engines = {n: LLMEngine(EngineConfig(**base, graph_prefill_max_tokens=n), loaded=loaded) for n in (0, 256)}
    firsts: dict[int, list[float]] = {}
    outs: dict[int, list[list[int]]] = {}
    steps = []
    for n, engine in engines.items():
        for i, case in enumerate(cases):
            engine.add_request(f"r{i}", case, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
            torch.cuda.synchronize()
            t = time.perf_counter()
            out: list[int] = []
            first = None
            while engine.has_unfinished_requests():
                got = engine.step()
                first = first or (round((time.perf_counter() - t) * 1e3, 2) if got else None)
                steps += [engine.last_step] if n else []
                out = next((o.token_ids for o in got if o.finished), out)
            firsts.setdefault(n, []).append(first)
            outs.setdefault(n, []).append(out)
    prefills = [s for s in steps if s is not None and s.kind == "prefill"]
    report("graph_prefill_gpu fp32 lone 300/700-token prompts: ms to the first token, eager / graph steps",
           (firsts[0], firsts[256]))
    assert outs[256] == outs[0] and all(len(o) == 16 for o in outs[0])
    assert [s.num_tokens for s in prefills] == [256, 44, 256, 256, 188]
    assert all(s.graph and s.captures == 0 for s in prefills)


def test_float32_mixed_steps_equal_strict_interleaving(prompts) -> None:  # noqa: F811
    """Mixed steps with real CUDA graphs (the decode graphs replay decode rows + prompt chunk rows)."""
    from test_mixed_steps import _drive

    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=MAX_MODEL_LEN)
    base = BASE | {"dtype": "float32", "enable_prefix_caching": False, "max_num_batched_tokens": 64}
    want, strict = _drive(LLMEngine(EngineConfig(**base, enable_mixed_steps=False), loaded=loaded), prompts[:4])
    got, steps = _drive(LLMEngine(EngineConfig(**base, enable_mixed_steps=True), loaded=loaded), prompts[:4])
    mixed = [s for s in steps if s is not None and s.kind == "mixed"]
    report("graph_prefill_gpu fp32 mixed steps: steps mixed / all, replayed", (len(mixed), len(steps),
                                                                             sum(s.graph for s in mixed)))
    report("graph_prefill_gpu fp32 steps strict / mixed", (len(strict), len(steps)))
    assert got == want and mixed and any(s.graph for s in mixed)
    assert not any(s is not None and s.kind == "mixed" for s in strict)


def test_on_by_default_on_the_gpu() -> None:
    cfg = EngineConfig(device="cuda")
    assert cfg.graph_prefill_max_tokens == 256 and cfg.enable_mixed_steps and cfg.mixed_rows == 256
