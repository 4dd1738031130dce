from __future__ import annotations

import math

import numpy as np
import pytest

from graphpool.bench.workload import TraceConfig, generate_trace, prompt_token_ids, summarize_trace


def test_same_seed_same_trace_and_other_seed_differs() -> None:
    cfg = TraceConfig(rate=20.0, duration_s=30.0, seed=7)
    a, b = generate_trace(cfg), generate_trace(cfg)
    assert a == b
    c = generate_trace(TraceConfig(rate=20.0, duration_s=30.0, seed=8))
    assert [r.arrival_s for r in c] != [r.arrival_s for r in a]


def test_poisson_arrivals_rate_and_exponential_gaps() -> None:
    rate, duration = 50.0, 200.0
    trace = generate_trace(TraceConfig(rate=rate, duration_s=duration, seed=1))
    arrivals = np.array([r.arrival_s for r in trace])
    assert np.all(np.diff(arrivals) > 0) and arrivals[0] >= 0 and arrivals[-1] < duration
    # n ~ Poisson(rate * duration): within 5 standard deviations
    n, expected = len(trace), rate * duration
    assert abs(n - expected) < 5 * math.sqrt(expected)
    gaps = np.diff(arrivals)
    # exponential gaps: mean 1/rate and coefficient of variation ~1 (a fixed-interval trace has CV 0)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)


def test_lengths_are_lognormal_long_tailed_and_capped() -> None:
    cfg = TraceConfig(rate=100.0, duration_s=200.0, output_mean=256, output_cap=100_000, prompt_mean=300,
                      prompt_cap=100_000, sigma=1.0, seed=3)
    trace = generate_trace(cfg)
    outs = np.array([r.output_len for r in trace], dtype=float)
    prompts = np.array([r.prompt_len for r in trace], dtype=float)
    # uncapped: the mean is the requested one, the log of the lengths is normal with the requested sigma
    assert outs.mean() == pytest.approx(256, rel=0.08)
    assert prompts.mean() == pytest.approx(300, rel=0.08)
    assert np.log(outs).std() == pytest.approx(1.0, abs=0.05)
    # long tail: the median sits well below the mean and p99 is many times the median
    assert np.median(outs) < 0.75 * outs.mean()
    assert np.percentile(outs, 99) > 5 * np.median(outs)

    capped = generate_trace(TraceConfig(rate=100.0, duration_s=50.0, output_cap=1024, prompt_cap=512, seed=3))
    assert max(r.output_len for r in capped) == 1024  # the tail hits the cap at this size
    assert max(r.prompt_len for r in capped) <= 512
    assert min(min(r.output_len, r.prompt_len) for r in capped) >= 1


def test_summary_and_prompt_ids() -> None:
    trace = generate_trace(TraceConfig(rate=10.0, duration_s=10.0, seed=0))
    s = summarize_trace(trace, 10.0)
    assert s["requests"] == len(trace)
    assert s["output_tokens"] == sum(r.output_len for r in trace)
    ids = prompt_token_ids(trace[0], seed=0)
    assert len(ids) == trace[0].prompt_len and all(100 <= t < 1000 for t in ids)
    assert ids == prompt_token_ids(trace[0], seed=0)
    assert summarize_trace([], 1.0)["requests"] == 0


@pytest.mark.parametrize(
    "kwargs",
    [dict(rate=0.0), dict(rate=-1.0), dict(duration_s=0.0), dict(output_mean=0.5), dict(prompt_cap=0),
     dict(sigma=0.0), dict(rate=float("inf"))],
)
def test_bad_configs_raise(kwargs: dict) -> None:
    base = dict(rate=1.0, duration_s=1.0)
    with pytest.raises(ValueError):
        TraceConfig(**(base | kwargs))
