from __future__ import annotations

import pytest

from graphpool.pool import (
    Action,
    AdmitFrequent,
    CaptureOnMiss,
    FallbackReason,
    MissContext,
    MissPolicy,
    PoolConfig,
    ResidencyBook,
    make_policy,
)
from graphpool.pool.policy import nearest_larger


def test_lru_order_and_touch() -> None:
    book = ResidencyBook(capacity=3)
    for s in (1, 2, 3):
        book.add(s, 10)
    book.touch(1)
    assert book.sizes() == (2, 3, 1)
    assert book.victims_for(10) == [2]
    assert book.total_bytes == 30
    assert book.remove(2) == 10 and book.total_bytes == 20
    assert book.victims_for(10) == []


def test_pinned_never_a_victim() -> None:
    book = ResidencyBook(capacity=2, pinned=(1,))
    book.add(1, 5)
    book.add(2, 5)
    assert book.victims_for(5) == [2]
    book.touch(2)
    assert book.victims_for(5) == [2]


def test_budget_victims_lru_first() -> None:
    book = ResidencyBook(capacity=10, budget=100)
    for s, b in ((1, 30), (2, 30), (3, 30)):
        book.add(s, b)
    assert book.victims_for(10) == []
    assert book.victims_for(40) == [1]
    assert book.victims_for(70) == [1, 2]
    assert book.victims_for(101) is None  # alone over budget


def test_budget_infeasible_with_pins() -> None:
    book = ResidencyBook(capacity=10, budget=100, pinned=(1,))
    book.add(1, 80)
    book.add(2, 10)
    assert book.victims_for(15) == [2]
    assert book.victims_for(25) is None


def test_victims_over_budget_keeps_new_graph() -> None:
    book = ResidencyBook(capacity=10, budget=100)
    book.add(1, 40)
    book.add(2, 40)
    book.add(3, 50)  # measured bigger than estimated
    assert book.victims_over_budget(keep=3) == [1]
    book.remove(1)
    book.add(4, 200)
    assert book.victims_over_budget(keep=4) is None


def test_estimate_uses_larger_sizes_then_nearest_smaller() -> None:
    book = ResidencyBook(capacity=4)
    assert book.estimate(8) == 0
    book.add(4, 100)
    assert book.estimate(8) == 100  # nearest smaller: a lower bound
    book.add(16, 300)
    book.add(32, 200)
    assert book.estimate(8) == 300
    book.remove(16)
    assert book.estimate(8) == 300  # remembered after eviction


def test_nearest_larger_within_ratio() -> None:
    assert nearest_larger((64, 48, 256), 40, 0.5) == 48
    assert nearest_larger((64, 256), 40, 0.5) is None
    assert nearest_larger((40,), 40, 0.5) is None


def _ctx(bucket: int, resident: tuple[int, ...], room: bool, victim: int | None = None) -> MissContext:
    return MissContext(bucket=bucket, resident=resident, has_room=room, victim=victim)


def test_capture_on_miss_always_captures() -> None:
    p = CaptureOnMiss()
    assert isinstance(p, MissPolicy)
    assert p.on_miss(_ctx(5, (1, 2), room=False, victim=1)).action is Action.CAPTURE


def test_admit_frequent_room_serve_eager_admit() -> None:
    p = AdmitFrequent(max_padding_ratio=0.5, admit_after=3, admit_window=8)
    assert isinstance(p, MissPolicy)
    p.observe(5)
    assert p.on_miss(_ctx(5, (), room=True)).action is Action.CAPTURE
    d = p.on_miss(_ctx(5, (7, 20), room=False, victim=7))
    assert d.action is Action.SERVE_WITH and d.size == 7
    d = p.on_miss(_ctx(5, (20,), room=False, victim=20))
    assert d.action is Action.SERVE_WITH and d.size == 20  # past the ratio, still better than eager
    d = p.on_miss(_ctx(5, (3,), room=False, victim=3))
    assert d.action is Action.EAGER and d.reason is FallbackReason.NOT_ADMITTED
    p.observe(5)
    p.observe(5)
    assert p.frequency(5) == 3
    assert p.on_miss(_ctx(5, (20,), room=False, victim=20)).action is Action.CAPTURE


def test_admit_frequent_with_room_pads_a_rare_size_until_it_is_admitted() -> None:
    p = AdmitFrequent(max_padding_ratio=0.5, admit_after=3, admit_window=8)
    p.observe(6)
    d = p.on_miss(_ctx(6, (8,), room=True))
    assert d.action is Action.SERVE_WITH and d.size == 8  # room, but a rare size: no capture stall
    p.observe(6)
    p.observe(6)
    assert p.on_miss(_ctx(6, (8,), room=True)).action is Action.CAPTURE  # admitted: captured
    p.observe(2)
    assert p.on_miss(_ctx(2, (8,), room=True)).action is Action.CAPTURE  # nothing to pad into: capture


def test_admit_frequent_guards_against_a_more_frequent_victim() -> None:
    p = AdmitFrequent(max_padding_ratio=0.0, admit_after=2, admit_window=16)
    for _ in range(4):
        p.observe(9)
    for _ in range(3):
        p.observe(5)
    assert p.on_miss(_ctx(5, (9,), room=False, victim=9)).action is Action.SERVE_WITH  # not admitted
    p.observe(5)
    p.observe(5)  # 5 now more frequent than 9
    assert p.on_miss(_ctx(5, (9,), room=False, victim=9)).action is Action.CAPTURE


def test_admit_window_forgets() -> None:
    p = AdmitFrequent(admit_after=1, admit_window=3)
    for b in (1, 2, 3, 4):
        p.observe(b)
    assert p.frequency(1) == 0
    assert p.frequency(4) == 1


def test_make_policy() -> None:
    assert isinstance(make_policy(PoolConfig(miss_policy="capture")), CaptureOnMiss)
    p = make_policy(PoolConfig(miss_policy="admit", admit_after=4, admit_window=10, max_padding_ratio=0.25))
    assert isinstance(p, AdmitFrequent) and p.admit_after == 4 and p.max_padding_ratio == 0.25
    with pytest.raises(ValueError):
        AdmitFrequent(admit_after=0)


def test_admit_frequent_prefers_a_padded_graph_to_a_capture() -> None:
    p = AdmitFrequent(max_padding_ratio=0.5, admit_after=2, admit_window=16)
    for _ in range(10):
        p.observe(6)
    d = p.on_miss(_ctx(6, (8, 30), room=False, victim=30))
    assert d.action is Action.SERVE_WITH and d.size == 8
    assert p.on_miss(_ctx(6, (30,), room=False, victim=30)).action is Action.CAPTURE
