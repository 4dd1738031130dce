"""The engine on the GPU (random llama3.2-1b weights): graph decode vs eager decode, a small pool under a
batch-size sweep, and the Triton decode attention against the torch reference inside the engine."""

from __future__ import annotations

import random

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling import SamplingParams
from graphpool.model.loader import load_model

PRESET = "random:llama3.2-1b"
MAX_MODEL_LEN = 512
NUM_REQUESTS = 64


def workload(seed: int = 0) -> list[tuple[list[int], SamplingParams]]:
    """64 token-id prompts of 4..300 tokens with 1..64 greedy output tokens (EOS ignored: fixed lengths)."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(1000, 120000) for _ in range(rng.randint(4, 300))],
         SamplingParams(temperature=0, max_tokens=rng.randint(1, 64), ignore_eos=True))
        for _ in range(NUM_REQUESTS)
    ]


def run(engine: LLMEngine, work: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    """16 requests at once, then 4 more every 5 steps: the decode batch size rises and falls."""
    final: dict[str, list[int]] = {}
    queue = list(enumerate(work))
    step = 0
    while queue or engine.has_unfinished_requests():
        burst = 16 if step == 0 else (4 if step % 5 == 0 else 0)
        for _ in range(min(burst, len(queue))):
            i, (prompt, params) = queue.pop(0)
            engine.add_request(f"r{i}", prompt, params)
        step += 1
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.token_ids
        assert step < 5000
    assert engine.stats().num_free_kv_blocks == engine.stats().num_kv_blocks
    return [final[f"r{i}"] for i in range(len(work))]


def make(loaded, dtype: str, **kwargs) -> LLMEngine:
    config = EngineConfig(model=PRESET, device="cuda", dtype=dtype, max_model_len=MAX_MODEL_LEN, num_kv_blocks=2500,
                          max_num_seqs=64, **kwargs)
    return LLMEngine(config, loaded=loaded)


def match_rate(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


@pytest.fixture(scope="module")
def fp32_model():
    return load_model(PRESET, "cuda", torch.float32, "torch", seed=0, max_positions=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def fp32_eager(fp32_model) -> list[list[int]]:
    return run(make(fp32_model, "float32", disable_cudagraph=True), workload())


@pytest.fixture(scope="module")
def bf16_models():
    torch_model = load_model(PRESET, "cuda", torch.bfloat16, "torch", seed=0, max_positions=MAX_MODEL_LEN)
    triton_model = load_model(PRESET, "cuda", torch.bfloat16, "triton", seed=0, max_positions=MAX_MODEL_LEN)
    assert triton_model[0].attn_backend == "triton"
    assert torch.equal(torch_model[0].embed_tokens.weight, triton_model[0].embed_tokens.weight)
    return torch_model, triton_model


def test_graph_decode_matches_eager_fp32(fp32_model, fp32_eager) -> None:
    """fp32 (no TF32): the captured graphs must give exactly the eager tokens."""
    assert not torch.backends.cuda.matmul.allow_tf32
    engine = make(fp32_model, "float32", graph_miss_policy="capture", profile_steps=True)
    got = run(engine, workload())
    assert got == fp32_eager
    stats = engine.graph_stats()
    assert stats is not None and stats.hits > 50 and stats.captures > 5
    assert engine.last_step is not None and engine.last_step.forward_seconds is not None


def test_graph_decode_matches_eager_bf16(bf16_models) -> None:
    """bf16: graph (padded batch, length bound baked in) vs eager can flip near-tied argmaxes; almost all
    requests must still agree token for token."""
    _, triton_model = bf16_models
    eager = run(make(triton_model, "bfloat16", disable_cudagraph=True), workload(1))
    engine = make(triton_model, "bfloat16")
    graph = run(engine, workload(1))
    assert match_rate(graph, eager) >= 0.9
    assert all(g[:2] == e[:2] for g, e in zip(graph, eager, strict=True))
    stats = engine.graph_stats()
    assert stats is not None and stats.hits + stats.padded_hits > 50


def test_small_pool_sweeps_misses_hits_and_evictions(fp32_model, fp32_eager) -> None:
    engine = make(fp32_model, "float32", max_graph_pool_size=4, graph_miss_policy="capture", graph_warmup="all")
    warm = engine.graph_stats()
    assert warm is not None and 1 <= warm.resident_graphs <= 4 and warm.captures == warm.resident_graphs
    graph_steps = 0
    decode_sizes: set[int] = set()
    original_step = engine.step

    def counting_step():
        nonlocal graph_steps
        outs = original_step()
        info = engine.last_step
        if info is not None and info.kind == "decode":
            decode_sizes.add(info.batch_size)
            graph_steps += info.graph
        return outs

    engine.step = counting_step  # type: ignore[method-assign]
    got = run(engine, workload())
    assert got == fp32_eager
    stats = engine.graph_stats()
    assert stats.resident_graphs <= 4 and stats.evictions > 0 and stats.hits > 0 and stats.misses > 0
    assert stats.captures > 4 and len(decode_sizes) > 8 and graph_steps > 0


def test_triton_attention_matches_torch_in_the_engine(bf16_models) -> None:
    torch_model, triton_model = bf16_models
    work = workload(2)
    ref = run(make(torch_model, "bfloat16", attn_backend="torch"), work)
    got = run(make(triton_model, "bfloat16", attn_backend="triton"), work)
    assert match_rate(got, ref) >= 0.8
    assert all(g[:2] == r[:2] for g, r in zip(got, ref, strict=True))
    total = sum(len(r) for r in ref)
    agree = sum(next((i for i, (x, y) in enumerate(zip(g, r, strict=False)) if x != y), len(r))
                for g, r in zip(got, ref, strict=True))
    assert agree / total >= 0.9
