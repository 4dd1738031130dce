"""Serving-trace generator: Poisson arrivals, long-tailed (lognormal) prompt and output lengths.

Pure and deterministic for a seed; knows nothing about the engine (the replay driver is trace/replay.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TraceConfig:
    rate: float  # mean arrivals per second (Poisson process)
    duration_s: float  # arrivals are drawn in [0, duration_s)
    prompt_mean: float = 300.0  # mean of the lognormal before the cap
    prompt_cap: int = 1024
    output_mean: float = 256.0
    output_cap: int = 1024
    sigma: float = 1.0  # lognormal shape: larger is a longer tail
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of requests/s, got {self.rate}")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
        for name in ("prompt_mean", "output_mean"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"{name} must be >= 1 token, got {getattr(self, name)}")
        for name in ("prompt_cap", "output_cap"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 token, got {getattr(self, name)}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")


@dataclass(frozen=True)
class TraceRequest:
    index: int
    arrival_s: float
    prompt_len: int
    output_len: int


def _lognormal_lengths(rng: np.random.Generator, n: int, mean: float, sigma: float, cap: int) -> np.ndarray:
    # NOTE: mu chosen so the *uncapped* distribution has the requested mean: E = exp(mu + sigma^2 / 2).
    mu = math.log(mean) - sigma * sigma / 2.0
    draws = rng.lognormal(mean=mu, sigma=sigma, size=n)
    return np.clip(np.rint(draws), 1, cap).astype(np.int64)


def generate_trace(cfg: TraceConfig) -> list[TraceRequest]:
    """Requests sorted by arrival time; the same config always gives the same trace."""
    rng = np.random.default_rng(cfg.seed)
    arrivals: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / cfg.rate))
        if t >= cfg.duration_s:
            break
        arrivals.append(t)
    n = len(arrivals)
    prompts = _lognormal_lengths(rng, n, cfg.prompt_mean, cfg.sigma, cfg.prompt_cap)
    outputs = _lognormal_lengths(rng, n, cfg.output_mean, cfg.sigma, cfg.output_cap)
    return [
        TraceRequest(index=i, arrival_s=arrivals[i], prompt_len=int(prompts[i]), output_len=int(outputs[i]))
        for i in range(n)
    ]


def prompt_token_ids(req: TraceRequest, seed: int, low: int = 100, high: int = 1000) -> list[int]:
    """Deterministic random token ids for a request's prompt (ids in [low, high), valid in any real vocab)."""
    rng = np.random.default_rng((seed, req.index))
    return rng.integers(low, high, size=req.prompt_len).tolist()


def summarize_trace(trace: list[TraceRequest], duration_s: float) -> dict[str, float]:
    if not trace:
        return {"requests": 0, "rate": 0.0}
    outs = np.array([r.output_len for r in trace])
    prompts = np.array([r.prompt_len for r in trace])
    return {
        "requests": len(trace),
        "rate": len(trace) / duration_s,
        "prompt_mean": float(prompts.mean()),
        "prompt_p99": float(np.percentile(prompts, 99)),
        "output_mean": float(outs.mean()),
        "output_p50": float(np.percentile(outs, 50)),
        "output_p99": float(np.percentile(outs, 99)),
        "output_tokens": int(outs.sum()),
    }
