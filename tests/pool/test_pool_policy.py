from __future__ import annotations

import pytest
import torch

from graphpool.pool import (
    CAPTURE,
    AdmitFrequent,
    CaptureOnMiss,
    Choice,
    FallbackReason,
    GraphPool,
    InputSpec,
    PoolConfig,
    ResidencyBook,
    make_policy,
)
from graphpool.pool.policy import nearest_larger
from graphpool.pool.testing import EagerCapturer


def test_lru_order_and_touch() -> None:
    book = ResidencyBook(capacity=3)
    for s in (1, 2, 3):
        book.add(s, 10)
    book.touch(1)
    assert book.sizes() == (2, 3, 1)
    assert book.victims(10) == [2]
    assert book.total_bytes == 30
    assert book.remove(2) == 10 and book.total_bytes == 20
    assert book.victims(10) == []


def test_pinned_never_a_victim() -> None:
    book = ResidencyBook(capacity=2, pinned=(1,))
    book.add(1, 5)
    book.add(2, 5)
    assert book.victims(5) == [2]
    book.touch(2)
    assert book.victims(5) == [2]


def test_budget_victims_lru_first() -> None:
    book = ResidencyBook(capacity=10, budget=100)
    for s, b in ((1, 30), (2, 30), (3, 30)):
        book.add(s, b)
    assert book.victims(10) == []
    assert book.victims(40) == [1]
    assert book.victims(70) == [1, 2]
    assert book.victims(101) is None  # alone over budget
    assert book.victims(10, may_evict=False) == []
    assert book.victims(40, may_evict=False) is None  # fits only by evicting


def test_budget_infeasible_with_pins() -> None:
    book = ResidencyBook(capacity=10, budget=100, pinned=(1,))
    book.add(1, 80)
    book.add(2, 10)
    assert book.victims(15) == [2]
    assert book.victims(25) is None


def test_victims_of_an_over_budget_set_keep_the_new_graph() -> None:
    book = ResidencyBook(capacity=10, budget=100)
    book.add(1, 40)
    book.add(2, 40)
    book.add(3, 50)  # measured bigger than estimated
    assert book.victims(keep=3) == [1]
    assert book.victims(keep=1) == [2]
    assert book.victims(keep=3, may_evict=False) is None
    book.remove(1)
    book.add(4, 200)
    assert book.victims(keep=4) is None


def test_victims_count_one_more_graph_only_when_given_its_bytes() -> None:
    book = ResidencyBook(capacity=2)
    book.add(1, 0)
    book.add(2, 0)
    assert book.victims() == []  # the resident set itself fits
    assert book.victims(0) == [1]  # one more graph, even of 0 bytes, needs a slot


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


def test_the_arena_counts_until_the_last_graph_goes() -> None:
    book = ResidencyBook(capacity=10, budget=100)
    book.add(8, 10, arena_bytes=50)
    book.add(4, 10, arena_bytes=50)
    assert book.total_bytes == 70 and book.arena_bytes == 50
    assert book.victims(10, arena_need=50) == []
    assert book.victims(10, arena_need=75) == [8]  # the arena grows by 25: one graph's own bytes make room
    assert book.victims(10, arena_need=95) is None  # a fresh arena of 95 and the new graph: 105, too much
    assert book.victims(5, arena_need=95) == [8, 4]  # 100 fits once both are gone (and the arena with them)
    assert book.remove(8) == 10 and book.total_bytes == 60
    assert book.remove(4) == 10 and book.total_bytes == 0 and book.arena_bytes == 0


def test_arena_over_budget_after_a_capture_evicts_the_rest_too() -> None:
    book = ResidencyBook(capacity=10, budget=100)
    book.add(2, 10, arena_bytes=40)
    book.add(16, 10, arena_bytes=120)  # the capture of 16 grew the arena past the budget
    assert book.victims(keep=16) is None
    book.remove(16)
    assert book.total_bytes == 130 and book.victims() == [2]  # the arena only goes with its last graph


def test_arena_estimates_follow_the_sizes_measured() -> None:
    book = ResidencyBook(capacity=4)
    assert book.arena_estimate(8) == 0
    book.add(4, 1, arena_bytes=30)
    assert book.arena_estimate(8) == 30 and book.arena_estimate(8, upper=False) == 30
    book.add(64, 1, arena_bytes=90)
    assert book.arena_estimate(8) == 90 and book.arena_estimate(8, upper=False) == 30
    assert book.arena_estimate(2) == 90 and book.arena_estimate(2, upper=False) == 0


def test_nearest_larger_within_ratio() -> None:
    assert nearest_larger((64, 48, 256), 40, 0.5) == 48
    assert nearest_larger((64, 256), 40, 0.5) is None
    assert nearest_larger((40,), 40, 0.5) is None


def test_capture_on_miss_always_captures() -> None:
    p = CaptureOnMiss()
    assert p.on_miss(5, (1, 2), False, 1) == CAPTURE
    assert p.on_miss(5, (), True, None) == CAPTURE


def test_admit_frequent_room_serve_eager_admit() -> None:
    p = AdmitFrequent(max_padding_ratio=0.5, admit_after=3, admit_window=8)
    p.observe(5)
    assert p.on_miss(5, (), True, None) == CAPTURE
    assert p.on_miss(5, (7, 20), False, 7) == 7
    assert p.on_miss(5, (20,), False, 20) == 20  # past the ratio, still better than eager
    assert p.on_miss(5, (3,), False, 3) is FallbackReason.NOT_ADMITTED
    p.observe(5)
    p.observe(5)
    assert p.frequency(5) == 3
    assert p.on_miss(5, (20,), False, 20) == CAPTURE


def test_admit_frequent_with_room_pads_a_rare_size_until_it_is_admitted() -> None:
    p = AdmitFrequent(max_padding_ratio=0.5, admit_after=3, admit_window=8)
    p.observe(6)
    assert p.on_miss(6, (8,), True, None) == 8  # room, but a rare size: no capture stall
    p.observe(6)
    p.observe(6)
    assert p.on_miss(6, (8,), True, None) == CAPTURE  # admitted: captured
    p.observe(2)
    assert p.on_miss(2, (8,), True, None) == CAPTURE  # nothing to pad into: capture


def test_admit_frequent_guards_against_a_more_frequent_victim() -> None:
    p = AdmitFrequent(max_padding_ratio=0.0, admit_after=2, admit_window=16)
    for _ in range(4):
        p.observe(9)
    for _ in range(3):
        p.observe(5)
    assert p.on_miss(5, (9,), False, 9) == 9  # not admitted: served padded
    p.observe(5)
    p.observe(5)  # 5 now more frequent than 9
    assert p.on_miss(5, (9,), False, 9) == CAPTURE


def test_admit_window_forgets() -> None:
    p = AdmitFrequent(admit_after=1, admit_window=3)
    for b in (1, 2, 3, 4):
        p.observe(b)
    assert p.frequency(1) == 0
    assert p.frequency(4) == 1


def test_make_policy() -> None:
    p = make_policy(PoolConfig(miss_policy="capture"))
    assert type(p) is CaptureOnMiss
    p = make_policy(PoolConfig(miss_policy="admit", admit_after=4, admit_window=10, max_padding_ratio=0.25))
    assert isinstance(p, AdmitFrequent) and p.admit_after == 4 and p.max_padding_ratio == 0.25
    with pytest.raises(ValueError):
        AdmitFrequent(admit_after=0)


def test_admit_frequent_prefers_a_padded_graph_to_a_capture() -> None:
    p = AdmitFrequent(max_padding_ratio=0.5, admit_after=2, admit_window=16)
    for _ in range(10):
        p.observe(6)
    assert p.on_miss(6, (8, 30), False, 30) == 8
    assert p.on_miss(6, (30,), False, 30) == CAPTURE


class _Scripted(CaptureOnMiss):
    """A custom policy: answers each miss from a script, and records what the pool showed it."""

    def __init__(self, *answers: Choice) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[int, tuple[int, ...], bool, int | None]] = []
        self.observed: list[int] = []

    def observe(self, bucket: int) -> None:
        self.observed.append(bucket)

    def on_miss(self, bucket: int, resident: tuple[int, ...], has_room: bool, victim: int | None) -> Choice:
        self.seen.append((bucket, resident, has_room, victim))
        return self.answers.pop(0)


def _pool(policy: CaptureOnMiss) -> tuple[GraphPool, EagerCapturer]:
    cap = EagerCapturer()
    cfg = PoolConfig(batch_sizes=(2, 4, 8), max_graph_pool_size=2)
    pool = GraphPool(lambda s: s["x"] * 2, (InputSpec("x", (), torch.float32),), cfg, "cpu", cap, miss_policy=policy)
    return pool, cap


def test_a_custom_policy_is_asked_and_obeyed() -> None:
    policy = _Scripted(CAPTURE, FallbackReason.NOT_ADMITTED, 8, CAPTURE, CAPTURE)
    pool, cap = _pool(policy)
    x = torch.arange(3.0)
    for _ in range(2):
        assert torch.equal(pool.run({"x": torch.arange(7.0)}), torch.arange(7.0) * 2)  # capture 8, then a hit
    assert torch.equal(pool.run({"x": x}), x * 2)  # eager: the policy's reason
    assert not pool.last_replayed
    assert torch.equal(pool.run({"x": x}), x * 2)  # served padded by 8
    assert pool.last_replayed
    pool.run({"x": torch.arange(2.0)})  # capture 2: room for it
    pool.run({"x": x})  # capture 4: evicts 8, the least recently used
    assert policy.observed == [8, 8, 4, 4, 2, 4]
    assert policy.seen == [(8, (), True, None), (4, (8,), True, None), (4, (8,), True, None),
                           (2, (8,), True, None), (4, (8, 2), False, 8)]
    st = pool.stats()
    assert (st.hits, st.padded_hits, st.misses, st.captures) == (1, 1, 5, 3)
    assert st.fallbacks == {FallbackReason.NOT_ADMITTED: 1} and cap.released == [8]


@pytest.mark.parametrize("bad", [4, 2, 16, "eager"])
def test_a_policy_serving_with_a_non_resident_or_smaller_size_is_refused(bad: Choice) -> None:
    pool, _ = _pool(_Scripted(CAPTURE, bad))
    pool.run({"x": torch.arange(7.0)})  # 8 resident
    with pytest.raises(ValueError, match="neither CAPTURE"):
        pool.run({"x": torch.arange(3.0)})
