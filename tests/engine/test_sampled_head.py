"""Decode steps of few rows that draw their tokens in the step (`graph_sample_max_batch_size`,
decode_step.decode_sampled): the LM head and the kernel draw inside the pool's step, fed each row's draw
parameters as a static input. On the CPU with the pool's stand-in capturer and a deterministic stand-in for the
kernel draw (the same function inside the step and in the sampler), every request's tokens equal those of an
engine whose head and draw run after the step: greedy, seeded and unseeded sampling, penalties (whose rows the
sampler draws from the step's logits), batches above the bound, synchronous and async scheduling; the sampler's
own draw then runs only for the steps the bound or a penalty leaves to it. The config's bound resolves per
setting. tests/gpu/test_sampled_head_gpu.py runs the real kernel draw in CUDA graphs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_async_scheduling import LADDER, _engine
from test_graph_prefill import loaded, prompts  # noqa: F401 (fixtures)

import graphpool.engine.engine as engine_module
from graphpool.engine.config import DEFAULT_GRAPH_SAMPLE_MAX_BATCH_SIZE, EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.sequence import Sequence
from graphpool.kernels.sample import PARAM_COLUMNS, sample_params


def stand_in_draw(logits: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """A deterministic draw from the kernel's parameter layout (seeds, then temperature bits; cut columns ignored):
    temperature 0 -> the argmax, else a Gumbel-max from a generator seeded by the row's key."""
    n = logits.shape[0]
    seeds = params[:n].tolist()
    temps = params[n:2 * n].to(torch.int32).view(torch.float32).tolist()
    out = []
    for row, seed, t in zip(logits.float(), seeds, temps, strict=True):
        if t == 0:
            out.append(int(row.argmax()))
            continue
        u = torch.rand(row.shape[0], generator=torch.Generator().manual_seed(seed)).clamp_min(1e-12)
        out.append(int((row / t - torch.log(-torch.log(u))).argmax()))
    return torch.tensor(out, dtype=torch.int64, device=logits.device)


@pytest.fixture
def with_draw(loaded, monkeypatch):  # noqa: F811
    """The engine's kernel draw is the stand-in, inside the step and in the sampler; counts the sampler's calls."""
    model = loaded[0]
    monkeypatch.setattr(model, "ops", dataclasses.replace(model.ops, step_sample=stand_in_draw))
    calls: list[int] = []

    def sampler_draw(logits: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        calls.append(logits.shape[0])
        return stand_in_draw(logits, params)

    monkeypatch.setattr(engine_module, "kernel_draw", lambda device, step_sample: sampler_draw)
    return calls


def _params(i: int) -> SamplingParams:
    kinds = [
        SamplingParams(temperature=0.8, seed=11 + i, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=0.9, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True, top_k=20, top_p=0.9),
    ]
    return kinds[i % len(kinds)]


def _drive(engine: LLMEngine, reqs: list[list[int]], params: list[SamplingParams]) -> dict[str, list[int]]:
    for i, (r, p) in enumerate(zip(reqs, params, strict=True)):
        engine.add_request(f"r{i}", r, p)
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.token_ids
    return out


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("n", [1, 3, 10])
def test_tokens_drawn_in_the_step_equal_those_drawn_after_it(loaded, prompts, with_draw, n: int,  # noqa: F811
                                                             async_scheduling: bool) -> None:
    reqs = [prompts[i % len(prompts)][: 12 + i] for i in range(n)]
    params = [_params(i) for i in range(n)]
    if n == 3:  # NOTE: a penalised row: the sampler draws that batch from the step's logits
        params[2] = dataclasses.replace(params[2], repetition_penalty=1.3)
    after = _engine(loaded, True, graph_sample_max_batch_size=0, async_scheduling=async_scheduling)
    want = _drive(after, reqs, params)
    after_calls = len(with_draw)
    with_draw.clear()
    engine = _engine(loaded, True, async_scheduling=async_scheduling)
    assert engine.runner.sample_rows == min(DEFAULT_GRAPH_SAMPLE_MAX_BATCH_SIZE, LADDER["graph_max_batch_size"])
    got = _drive(engine, reqs, params)
    assert got == want and len(got) == n
    assert after_calls > 0 and all(t >= 0 for ids in got.values() for t in ids)
    if n == 1:  # every decode step drew itself: the sampler's draw ran only for the prompt's first token
        assert len(with_draw) <= 1, with_draw
    else:
        assert with_draw, "steps the bound or a penalty leaves to the sampler draw there"


def _seq(params: SamplingParams, tokens: int = 0, stop_ids: frozenset[int] = frozenset()) -> Sequence:
    seq = Sequence("s", [1, 2, 3], params, stop_ids, None)
    seq.token_ids.extend([5] * tokens)
    return seq


def test_step_draw_packs_each_row_or_declines() -> None:
    seen: list[int] = []
    sampler = Sampler(torch.device("cpu"), 0, draw=lambda x, p: seen.append(1))
    seeded = SamplingParams(temperature=0.5, seed=3, top_k=4, top_p=0.5, min_p=0.1)
    plain = [_seq(SamplingParams(temperature=0)), _seq(seeded, tokens=2)]
    params = sampler.step_draw(plain)
    assert params is not None and params.shape == (2, PARAM_COLUMNS) and params.dtype == np.int64
    key = sampler.step_draw([_seq(seeded, tokens=2)])[:, 0].tolist()  # type: ignore[index]
    assert params[1, 0] == key[0]  # a seeded row's key follows its seed and token count, not the stream
    want = sample_params([int(params[0, 0]), key[0]], [0.0, 0.5], [0, 4], [1.0, 0.5], [0.0, 0.1])
    assert params.T.reshape(-1).tolist() == want
    greedy = sampler.step_draw([_seq(SamplingParams(temperature=0))] * 3)
    assert greedy is not None and greedy[:, 0].tolist() == [0, 0, 0] and greedy[:, 1].tolist() == [0, 0, 0]
    # rows whose logits change before the draw, or no kernel draw: the sampler draws after the step
    for other in (SamplingParams(temperature=0.5, repetition_penalty=1.2), SamplingParams(min_tokens=2)):
        assert sampler.step_draw([plain[0], _seq(other, stop_ids=frozenset({7}))]) is None
    assert Sampler(torch.device("cpu"), 0).step_draw(plain) is None
    drawn = torch.tensor([4, 2])
    assert sampler.sample(torch.zeros(2, 8), plain, drawn) is drawn and not seen


def test_every_cut_keeps_the_cut_columns() -> None:
    assert len(sample_params([1, 2], [0.5, 0.0])) == 4
    one, zero = sample_params([0, 0], [1.0, 1.0])[2:], sample_params([0, 0], [0.0, 0.0])[2:]
    assert sample_params([1, 2], [0.5, 0.0], [0, 0], [1.0, 1.0], [0.0, 0.0], every_cut=True) == [
        *sample_params([1, 2], [0.5, 0.0]), 0, 0, *one, *zero]


@pytest.mark.parametrize(("settings", "want"), [
    ({}, DEFAULT_GRAPH_SAMPLE_MAX_BATCH_SIZE),
    ({"graph_max_batch_size": 4, "graph_split_batch_size": 4}, 4),
    ({"enable_microbatch_overlap": True}, 0),
    ({"graph_sample_max_batch_size": 0}, 0),
    ({"graph_sample_max_batch_size": 32}, 32),
])
def test_config_resolves_the_bound(settings: dict, want: int) -> None:
    assert EngineConfig(device="cpu", **settings).graph_sample_max_batch_size == want


@pytest.mark.parametrize("settings", [{"graph_sample_max_batch_size": -1},
                                      {"graph_sample_max_batch_size": 4, "enable_microbatch_overlap": True}])
def test_config_refuses_a_bad_bound(settings: dict) -> None:
    with pytest.raises(ValueError, match="graph_sample_max_batch_size"):
        EngineConfig(device="cpu", **settings)
