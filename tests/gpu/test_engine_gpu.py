"""The engine on the GPU (random llama3.2-1b weights): graph decode vs eager decode, a small pool under a
batch-size sweep, the Triton kernels against the torch reference inside the engine, and the host staging of
the step inputs while copies are queued.

Random weights give flat next-token distributions, so two correct computations that round differently
(padded vs live batch GEMMs, another attention kernel) can flip a near-tied argmax and then diverge for the
rest of the request. So the second run of each pair is teacher-forced: it gets the first run's tokens, and the
comparison is per step (same batches, same positions): argmaxes must agree except at near-ties, and the
logits of the chosen tokens must be close.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.host_copy import HostStaging
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model

PRESET = "random:llama3.2-1b"
MAX_MODEL_LEN = 512
NUM_REQUESTS = 64
Work = list[tuple[list[int], SamplingParams]]
Key = tuple[str, int]  # (request id, position of the sampled token)


def workload(seed: int = 0) -> Work:
    """64 token-id prompts of 4..300 tokens with 1..64 greedy output tokens (EOS ignored: fixed lengths)."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(1000, 120000) for _ in range(rng.randint(4, 300))],
         SamplingParams(temperature=0, max_tokens=rng.randint(1, 64), ignore_eos=True))
        for _ in range(NUM_REQUESTS)
    ]


@dataclass
class Record:
    tokens: dict[Key, int] = field(default_factory=dict)  # what was fed on
    argmax: dict[Key, int] = field(default_factory=dict)
    chosen_logit: dict[Key, float] = field(default_factory=dict)
    top2_gap: dict[Key, float] = field(default_factory=dict)
    outputs: list[list[int]] = field(default_factory=list)
    decode_sizes: set[int] = field(default_factory=set)
    graph_steps: int = 0
    argmax_rows: int = 0  # greedy rows whose token (the engine's step_argmax) was checked against torch's


def run(engine: LLMEngine, work: Work, forced: Record | None = None) -> Record:
    """16 requests at once, then 4 more every 5 steps (the decode batch size rises and falls). Every sampled
    row is recorded; with `forced`, the tokens of that earlier run are fed instead of this run's own."""
    rec = Record()
    greedy = engine.sampler.sample

    def sample(logits: torch.Tensor, seqs: list, drawn: torch.Tensor | None = None) -> torch.Tensor:
        own = greedy(logits, seqs, drawn)  # NOTE: drawn: a small step's argmax, taken in its replay
        # NOTE: every row is greedy: the sampler's tokens (the model's step_argmax) are torch's argmax
        assert torch.equal(own, logits.argmax(-1))
        rec.argmax_rows += len(seqs)
        keys = [(s.request_id, s.num_tokens) for s in seqs]
        tokens = own if forced is None else torch.tensor([forced.tokens[k] for k in keys], device=logits.device)
        top2 = logits.topk(2, dim=-1).values
        chosen = logits.gather(1, tokens[:, None]).squeeze(1)
        for k, t, a, c, (v1, v2) in zip(keys, tokens.tolist(), own.tolist(), chosen.tolist(), top2.tolist(),
                                        strict=True):
            rec.tokens[k], rec.argmax[k], rec.chosen_logit[k], rec.top2_gap[k] = t, a, c, v1 - v2
        return tokens

    engine.sampler.sample = sample  # type: ignore[method-assign]
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
        info = engine.last_step
        if info is not None and info.kind == "decode":
            rec.decode_sizes.add(info.batch_size)
            rec.graph_steps += info.graph
        assert step < 5000
    assert engine.stats().num_free_kv_blocks == engine.stats().num_kv_blocks
    rec.outputs = [final[f"r{i}"] for i in range(len(work))]
    return rec


def compare(ref: Record, got: Record, *, tie: float, logit_tol: float, min_agree: float) -> None:
    """`got` was forced with `ref`'s tokens: same keys; argmaxes differ only where ref's top two are within
    `tie`; chosen-token logits within `logit_tol`; at least `min_agree` of all argmaxes equal."""
    assert got.tokens == ref.tokens and got.outputs == ref.outputs
    flips = [k for k in ref.argmax if got.argmax[k] != ref.argmax[k]]
    assert all(ref.top2_gap[k] <= tie for k in flips), [(k, ref.top2_gap[k]) for k in flips][:5]
    assert 1 - len(flips) / len(ref.argmax) >= min_agree
    worst = max(abs(got.chosen_logit[k] - ref.chosen_logit[k]) for k in ref.chosen_logit)
    assert worst <= logit_tol


def make(loaded, dtype: str, **kwargs) -> LLMEngine:
    # NOTE: synchronous: the recording sampler keys every sampled row by its position, and a chained async step
    # samples a row for a request the step before finishes (then drops it); async == sync is
    # test_async_scheduling_gpu's
    kwargs.setdefault("async_scheduling", False)
    config = EngineConfig(model=PRESET, device="cuda", dtype=dtype, max_model_len=MAX_MODEL_LEN, num_kv_blocks=2500,
                          max_num_seqs=64, **kwargs)
    return LLMEngine(config, loaded=loaded)


@pytest.fixture(scope="module")
def fp32_model():
    return load_model(PRESET, "cuda", torch.float32, "torch", seed=0, max_positions=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def fp32_eager(fp32_model) -> Record:
    rec = run(make(fp32_model, "float32", disable_cudagraph=True), workload())
    assert rec.graph_steps == 0 and sum(len(o) for o in rec.outputs) > 1000
    return rec


@pytest.fixture(scope="module")
def bf16_models():
    torch_model = load_model(PRESET, "cuda", torch.bfloat16, "torch", seed=0, max_positions=MAX_MODEL_LEN)
    triton_model = load_model(PRESET, "cuda", torch.bfloat16, "triton", seed=0, max_positions=MAX_MODEL_LEN)
    assert triton_model[0].attn_backend == "triton"
    assert torch.equal(torch_model[0].embed_tokens.weight, triton_model[0].embed_tokens.weight)
    return torch_model, triton_model


def test_graph_decode_matches_eager_fp32(fp32_model, fp32_eager) -> None:
    engine = make(fp32_model, "float32", graph_miss_policy="capture", profile_steps=True)
    got = run(engine, workload(), forced=fp32_eager)
    compare(fp32_eager, got, tie=1e-3, logit_tol=1e-3, min_agree=0.995)
    stats = engine.graph_stats()
    assert stats is not None and stats.hits > 50 and stats.captures > 5 and got.graph_steps > 50
    assert got.argmax_rows > 0
    assert engine.last_step is not None and engine.last_step.forward_seconds is not None


def test_graph_decode_matches_eager_bf16(bf16_models) -> None:
    _, triton_model = bf16_models
    eager = run(make(triton_model, "bfloat16", disable_cudagraph=True), workload(1))
    engine = make(triton_model, "bfloat16")  # the default miss policy
    got = run(engine, workload(1), forced=eager)
    compare(eager, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    stats = engine.graph_stats()
    assert stats is not None and stats.hits + stats.padded_hits > 50 and got.graph_steps > 50


def test_microbatch_overlap_graphs_match_eager_fp32(fp32_model, fp32_eager) -> None:
    """Decode steps as two interleaved microbatches in one graph (one rank: nothing to overlap; what is checked
    is the two-microbatch capture and the interleaved forward against the plain eager step)."""
    engine = make(fp32_model, "float32", graph_miss_policy="capture", enable_microbatch_overlap=True)
    assert engine.runner.pool.config.num_microbatches == 2
    got = run(engine, workload(), forced=fp32_eager)
    compare(fp32_eager, got, tie=1e-3, logit_tol=1e-3, min_agree=0.995)
    stats = engine.graph_stats()
    assert stats is not None and stats.hits > 50 and got.graph_steps > 50


def test_microbatch_overlap_graphs_match_eager_bf16(bf16_models) -> None:
    _, triton_model = bf16_models
    eager = run(make(triton_model, "bfloat16", disable_cudagraph=True), workload(1))
    engine = make(triton_model, "bfloat16", enable_microbatch_overlap=True)
    got = run(engine, workload(1), forced=eager)
    compare(eager, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    stats = engine.graph_stats()
    assert stats is not None and stats.hits + stats.padded_hits > 50 and got.graph_steps > 50


def test_small_pool_sweeps_misses_hits_and_evictions(fp32_model, fp32_eager) -> None:
    engine = make(fp32_model, "float32", max_graph_pool_size=4, graph_miss_policy="capture", graph_warmup="1,8,16,32")
    warm = engine.graph_stats()
    assert warm is not None and 1 <= warm.resident_graphs <= 4 and warm.captures == warm.resident_graphs
    got = run(engine, workload(), forced=fp32_eager)
    compare(fp32_eager, got, tie=1e-3, logit_tol=1e-3, min_agree=0.995)
    stats = engine.graph_stats()
    assert stats.resident_graphs <= 4 and stats.evictions > 0 and stats.hits > 0 and stats.misses > 0
    assert stats.captures > 4 and len(got.decode_sizes) > 8 and got.graph_steps > 0


def test_triton_kernels_match_torch_in_the_engine(bf16_models) -> None:
    torch_model, triton_model = bf16_models
    work = workload(2)
    ref = run(make(torch_model, "bfloat16"), work)
    got = run(make(triton_model, "bfloat16"), work, forced=ref)
    compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.9)
    # the first tokens of every request (prefill, then the first two decode steps)
    first = [(f"r{i}", len(p) + j) for i, (p, params) in enumerate(work) for j in range(min(3, params.max_tokens))]
    # NOTE: random bf16 weights give near-tied logits (median top-2 gap ~0.12) and the fused Triton norm/rotary
    # round differently from the torch ops: 178/190 agreed on the H200 (torch 2.11); every flip was a near-tie
    # (checked by compare above).
    assert sum(got.argmax[k] == ref.argmax[k] for k in first) >= 0.9 * len(first)


def test_staging_keeps_each_copy_while_earlier_ones_are_queued() -> None:
    """With GPU work queued ahead, every staged copy is still in flight when the buffers come round again: a
    buffer written before its copy ran would hand a step another step's inputs."""
    staging = HostStaging(torch.device("cuda"), num_buffers=2)
    torch.cuda._sleep(100_000_000)  # NOTE: tens of ms of GPU time ahead of the copies
    outs = [staging.to_device(np.full(64, i, dtype=np.int64), np.arange(i, i + 3, dtype=np.int32)) for i in range(9)]
    torch.cuda.synchronize()
    for i, (ids, lens) in enumerate(outs):
        assert ids.tolist() == [i] * 64 and lens.tolist() == [i, i + 1, i + 2]
