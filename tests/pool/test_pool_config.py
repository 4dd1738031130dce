from __future__ import annotations

import dataclasses
import json

import pytest

from graphpool.pool import BucketLadder, FallbackReason, PoolConfig, PoolStats
from graphpool.pool.stats import StatsCounters


def test_default_ladder_has_46_sizes() -> None:
    ladder = PoolConfig().ladder()
    assert len(ladder) == 46
    assert ladder.sizes[:32] == tuple(range(1, 33))
    assert ladder.sizes[32:] == tuple(range(48, 257, 16))
    assert ladder.max_size == 256


def test_ladder_adds_max_off_the_grid() -> None:
    ladder = BucketLadder.build(100, 8, 16)
    assert ladder.sizes == (1, 2, 3, 4, 5, 6, 7, 8, 24, 40, 56, 72, 88, 100)
    assert BucketLadder.build(4, 4, 16).sizes == (1, 2, 3, 4)


@pytest.mark.parametrize(
    ("bs", "expected"), [(1, 1), (17, 17), (32, 32), (33, 48), (48, 48), (49, 64), (255, 256), (256, 256)]
)
def test_find_closest(bs: int, expected: int) -> None:
    assert PoolConfig().ladder().find_closest(bs) == expected


def test_find_closest_above_max_is_none() -> None:
    assert PoolConfig().ladder().find_closest(257) is None
    assert BucketLadder([2, 8]).find_closest(9) is None
    assert BucketLadder([2, 8]).find_closest(1) == 2


def test_explicit_ladder_overrides() -> None:
    cfg = PoolConfig(batch_sizes=(1, 2, 4, 8), pinned=(8,), max_graph_pool_size=2)
    assert cfg.ladder().sizes == (1, 2, 4, 8)
    assert cfg.ladder() is cfg.ladder()  # built once, at construction
    assert cfg == PoolConfig(batch_sizes=(1, 2, 4, 8), pinned=(8,), max_graph_pool_size=2)
    assert "ladder" not in repr(cfg)
    assert PoolConfig(batch_sizes=[1, 3]).batch_sizes == (1, 3)  # type: ignore[arg-type]


def test_padding_cover_serves_every_size() -> None:
    ladder = PoolConfig().ladder()
    for ratio in (0.0, 0.25, 0.5, 1.0):
        cover = ladder.padding_cover(ratio)
        assert cover == sorted(cover, reverse=True)
        for b in ladder:
            assert any(b <= s <= b * (1 + ratio) for s in cover), (ratio, b)
    assert len(ladder.padding_cover(0.5)) < 16


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_batch_size": 0}, ">= 1"),
        ({"split_batch_size": -1}, ">= 1"),
        ({"grow_step": 0}, ">= 1"),
        ({"split_batch_size": 300}, "split_batch_size"),
        ({"batch_sizes": ()}, "empty"),
        ({"batch_sizes": (4, 2)}, "increasing"),
        ({"batch_sizes": (2, 2)}, "increasing"),
        ({"batch_sizes": (0, 2)}, ">= 1"),
        ({"max_graph_pool_size": 0}, "max_graph_pool_size"),
        ({"graph_memory_budget": 0}, "graph_memory_budget"),
        ({"graph_memory_budget": -5}, "graph_memory_budget"),
        ({"graph_memory_budget": 1 << 20, "mempool": "shared"}, "per_graph"),
        ({"mempool": "global"}, "mempool"),
        ({"miss_policy": "lru"}, "miss_policy"),
        ({"pinned": (33,)}, "not a ladder size"),
        ({"pinned": (1, 1)}, "duplicates"),
        ({"pinned": (1, 2), "max_graph_pool_size": 2}, "evictable"),
        ({"max_len_in_batch": 0}, "max_len_in_batch"),
        ({"max_padding_ratio": -0.1}, "max_padding_ratio"),
        ({"admit_after": 0}, "admit_after"),
        ({"admit_after": 5, "admit_window": 4}, "admit_window"),
        ({"num_microbatches": 3}, "num_microbatches"),
        ({"defer_max_padded_steps": 0}, "defer_max_padded_steps"),
    ],
)
def test_nonsense_config_raises(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PoolConfig(**kwargs)  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    cfg = PoolConfig()
    with pytest.raises(AttributeError):
        cfg.max_graph_pool_size = 3  # type: ignore[misc]


def test_stats_as_dict_uses_reason_names() -> None:
    s = PoolStats(fallbacks={FallbackReason.OVER_BUDGET: 2}, resident_sizes=(1, 2), capture_failures_by_kind={"oom": 1})
    d = s.as_dict()
    assert d["fallbacks"] == {"over_budget": 2}
    assert d["resident_sizes"] == [1, 2]
    assert d["capture_failures_by_kind"] == {"oom": 1} and d["capture_failures_by_kind"] is not s.capture_failures_by_kind
    assert list(d) == [f.name for f in dataclasses.fields(PoolStats)]
    assert json.loads(json.dumps(d)) == d


def test_stats_snapshot_derives_the_totals_and_is_detached_from_the_counters() -> None:
    c = StatsCounters()
    c.fallbacks[FallbackReason.NO_CUDA] += 2
    c.fallbacks[FallbackReason.OVER_BUDGET] += 1
    c.capture_failures_by_kind["oom"] += 1
    c.capture_failures_by_kind["error"] += 2
    c.captured(0.5)
    c.captured(0.25)
    st = c.snapshot((3, 1), 40)
    assert (st.captures, st.capture_seconds_total, st.capture_seconds_max) == (2, 0.75, 0.5)
    assert (st.capture_failures, st.eager_steps, st.resident_graphs, st.resident_bytes) == (3, 3, 2, 40)
    assert type(st.fallbacks) is dict and type(st.capture_failures_by_kind) is dict
    c.fallbacks[FallbackReason.NO_CUDA] += 1
    assert st.fallbacks == {FallbackReason.NO_CUDA: 2, FallbackReason.OVER_BUDGET: 1}
    with pytest.raises(KeyError):
        st.fallbacks[FallbackReason.DISABLED]
