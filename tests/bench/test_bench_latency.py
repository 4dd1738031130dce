from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from graphpool.bench.common import median, percentile
from graphpool.bench.latency import RequestTimeline, bucket_of, cdf_points, summarize_latency, working_set
from graphpool.bench.serve.attribution import split_client_stalled

LADDER = [*range(1, 33), *range(48, 256, 16), 256]


def test_percentile_and_median() -> None:
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert median(xs) == 3.0
    assert median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0
    assert percentile(xs, 50) == 3.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([1.0, 2.0], 50) == pytest.approx(1.5)
    assert math.isnan(percentile([], 50)) and math.isnan(median([]))
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_timelines_give_ttft_and_itls() -> None:
    a = RequestTimeline(arrival_s=1.0, output_len=4, token_times=[1.5, 1.6, 1.7, 2.7], finished=True)
    b = RequestTimeline(arrival_s=2.0, output_len=3, token_times=[2.25, 2.35])
    never = RequestTimeline(arrival_s=3.0, output_len=3)
    assert a.ttft() == pytest.approx(0.5) and never.ttft() is None
    assert a.itls() == pytest.approx([0.1, 0.1, 1.0])
    s = summarize_latency([a, b, never])
    assert (s.requests, s.started, s.finished, s.output_tokens) == (3, 2, 1, 6)
    assert s.itl_max_ms == pytest.approx(1000.0)
    assert s.itl_p50_ms == pytest.approx(100.0)
    assert s.ttft_p50_ms == pytest.approx(375.0)
    empty = summarize_latency([never])
    assert math.isnan(empty.itl_p99_ms) and empty.output_tokens == 0


def test_bucket_of_pads_up_and_refuses_above_top() -> None:
    assert bucket_of(1, LADDER) == 1
    assert bucket_of(33, LADDER) == 48
    assert bucket_of(250, LADDER) == 256
    assert bucket_of(257, LADDER) is None


def test_working_set_counts_buckets_overall_and_in_windows() -> None:
    # first 100 steps cycle through 1..20 (20 buckets), then 100 steps at 40 (bucket 48)
    sizes = [1 + i % 20 for i in range(100)] + [40] * 100
    ws = working_set(sizes, LADDER, window=50)
    assert ws.distinct_buckets == 21
    assert ws.max_window_buckets == 21  # a window across the change sees all 20 small sizes and 48
    assert working_set(sizes, LADDER, window=10).max_window_buckets == 10
    assert ws.histogram[48] == 100 and ws.histogram[1] == 5
    assert ws.decode_steps == 200
    assert ws.mean_batch == pytest.approx((sum(1 + i % 20 for i in range(100)) + 4000) / 200)
    # a window of 1 only ever holds one bucket; sizes above the ladder are not counted
    assert working_set([*sizes, 999], LADDER, window=1).max_window_buckets == 1
    assert working_set([999], LADDER).distinct_buckets == 0
    with pytest.raises(ValueError):
        working_set(sizes, LADDER, window=0)


def test_cdf_points() -> None:
    xs, ys = cdf_points([3.0, 1.0, 2.0])
    assert xs == [1.0, 2.0, 3.0] and ys == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_ttfts_over_a_client_stall_are_told_apart() -> None:
    """A request whose wait for its first token overlapped a stall (>= 10 ms) of its own client process's loop is
    counted, not kept; a shorter lateness, or another process's stall, keeps it."""
    def req(worker: int, sent: float, first: float) -> SimpleNamespace:
        return SimpleNamespace(worker=worker, timeline=RequestTimeline(sent, 4, [first, first + 0.01]))

    t0 = 100.0  # the trace's start on the monotonic clock
    spans = [[(t0 + 0.50, t0 + 0.80), (t0 + 2.000, t0 + 2.005)], []]  # worker 0: a 300 ms stall, a 5 ms lateness
    results = [req(0, 0.40, 0.90),  # waited over the stall
               req(0, 1.95, 2.10),  # only the 5 ms lateness
               req(1, 0.40, 0.90),  # the other process: no stall
               req(0, 0.10, 0.20),  # before it
               SimpleNamespace(worker=0, timeline=RequestTimeline(0.6, 4, []))]  # no token: no TTFT
    kept, stalled = split_client_stalled(results, spans, t0)
    assert stalled == 1
    assert kept == pytest.approx([150.0, 500.0, 100.0])
