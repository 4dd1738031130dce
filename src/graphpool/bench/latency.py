"""Pure metrics of a replayed trace: per-request token timelines, latency percentiles, batch-size working set."""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphpool.bench.common import percentile


@dataclass
class RequestTimeline:
    arrival_s: float  # scheduled arrival, seconds from the start of the trace
    output_len: int  # tokens asked for
    token_times: list[float] = field(default_factory=list)  # seconds from the start of the trace
    finished: bool = False

    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_s if self.token_times else None

    def itls(self) -> list[float]:
        t = self.token_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]


@dataclass(frozen=True)
class LatencySummary:
    requests: int
    started: int  # got at least one token
    finished: int
    output_tokens: int
    itl_p50_ms: float
    itl_p99_ms: float
    itl_p999_ms: float
    itl_max_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float


def summarize_latency(timelines: Sequence[RequestTimeline]) -> LatencySummary:
    itls = all_itls_ms(timelines)
    ttfts = [t * 1e3 for tl in timelines if (t := tl.ttft()) is not None]
    return LatencySummary(
        requests=len(timelines),
        started=len(ttfts),
        finished=sum(tl.finished for tl in timelines),
        output_tokens=sum(len(tl.token_times) for tl in timelines),
        itl_p50_ms=percentile(itls, 50),
        itl_p99_ms=percentile(itls, 99),
        itl_p999_ms=percentile(itls, 99.9),
        itl_max_ms=max(itls) if itls else math.nan,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p99_ms=percentile(ttfts, 99),
    )


def all_itls_ms(timelines: Sequence[RequestTimeline]) -> list[float]:
    return [x * 1e3 for tl in timelines for x in tl.itls()]


def cdf_points(xs: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their empirical CDF (i / n)."""
    s = sorted(xs)
    n = len(s)
    return s, [(i + 1) / n for i in range(n)]


def bucket_of(batch_size: int, sizes: Sequence[int]) -> int | None:
    """Smallest size >= batch_size in an ascending ladder, None above its top."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


@dataclass(frozen=True)
class WorkingSet:
    decode_steps: int
    distinct_buckets: int  # over the whole run
    max_window_buckets: int  # most distinct buckets within any `window` consecutive decode steps
    window: int
    mean_batch: float
    histogram: dict[int, int]  # bucket -> decode steps


def working_set(batch_sizes: Sequence[int], sizes: Sequence[int], window: int = 1000) -> WorkingSet:
    """How many graph buckets a sequence of decode batch sizes touches (above the ladder: not counted)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    ladder = sorted(sizes)
    buckets = [b for bs in batch_sizes if (b := bucket_of(bs, ladder)) is not None]
    hist = Counter(buckets)
    in_window: Counter[int] = Counter()
    recent: deque[int] = deque()
    best = 0
    for b in buckets:
        recent.append(b)
        in_window[b] += 1
        if len(recent) > window:
            old = recent.popleft()
            in_window[old] -= 1
            if in_window[old] == 0:
                del in_window[old]
        best = max(best, len(in_window))
    return WorkingSet(
        decode_steps=len(batch_sizes),
        distinct_buckets=len(hist),
        max_window_buckets=best,
        window=window,
        mean_batch=sum(batch_sizes) / len(batch_sizes) if batch_sizes else 0.0,
        histogram=dict(sorted(hist.items())),
    )
