"""defer_captures: a size admitted while a larger resident graph can serve it is served padded and captured
later, by capture_wanted(), if the miss policy still wants it then. CPU, the EagerCapturer test double."""

from __future__ import annotations

from collections.abc import Sequence

from test_pool_graphpool import SPECS, check, make, step

from graphpool.pool import GraphPool, PoolConfig
from graphpool.pool.testing import EagerCapturer

ADMIT = dict(admit_after=3, admit_window=8, max_padding_ratio=0.5)


def _ask_for_six(pool: GraphPool) -> None:
    """8 warmed up, then three steps of 6 rows: 6 is admitted at the third (8 serves it within the ratio)."""
    pool.warmup([8])
    for seed in range(3):
        check(pool, 6, seed=seed)


def test_an_admitted_size_is_served_padded_then_captured_when_asked() -> None:
    pool, cap = make(defer_captures=True, **ADMIT)
    pool.warmup([8])
    for seed in range(4):
        check(pool, 6, seed=seed)  # correct rows, every step padded into 8; admitted at the third
    assert cap.captured == [8] and pool.wanted_sizes == (6,)
    st = pool.stats()
    assert (st.padded_hits, st.captures, st.eager_steps) == (4, 1, 0)
    assert pool.capture_wanted() is False  # captured; none left
    assert cap.captured == [8, 6] and pool.wanted_sizes == ()
    check(pool, 6, seed=9)
    assert pool.stats().hits == 1


def test_a_size_waiting_past_its_padded_steps_is_captured_in_the_step() -> None:
    pool, cap = make(defer_captures=True, defer_max_padded_steps=2, **ADMIT)
    pool.warmup([8])
    for seed in range(4):
        check(pool, 6, seed=seed)  # admitted at the third; padded at the third and fourth
    assert cap.captured == [8] and pool.wanted_sizes == (6,)
    check(pool, 6, seed=4)  # a third padded step would pass the bound: no idle moment came, so now
    assert cap.captured == [8, 6] and pool.wanted_sizes == ()
    st = pool.stats()
    assert (st.padded_hits, st.captures) == (4, 2)
    check(pool, 3, seed=5)  # the count is per size: 3 (padded into 6) starts its own
    assert pool.wanted_sizes == (3,)


def test_without_defer_the_admitted_size_is_captured_in_the_step() -> None:
    pool, cap = make(**ADMIT)
    _ask_for_six(pool)
    assert cap.captured == [8, 6] and pool.wanted_sizes == ()


def test_a_size_beyond_the_padding_ratio_is_padded_anyway_rather_than_captured_in_the_step() -> None:
    pool, cap = make(defer_captures=True, **ADMIT)
    pool.warmup([8])
    check(pool, 3)  # with room and nothing within the ratio the policy captures; deferred, 8 serves it
    assert cap.captured == [8] and pool.wanted_sizes == (3,) and pool.last_replayed


def test_a_size_no_resident_graph_can_serve_is_captured_in_the_step() -> None:
    pool, cap = make(defer_captures=True, **ADMIT)
    pool.warmup([8])
    check(pool, 12)  # nothing larger resident: with room, a miss captures at once, as without defer
    assert cap.captured == [8, 12] and pool.wanted_sizes == ()


def test_a_wanted_size_that_stopped_being_frequent_is_dropped() -> None:
    pool, cap = make(defer_captures=True, **ADMIT)
    _ask_for_six(pool)
    for seed in range(8):  # the window moves on: 6 is no longer admitted, and 8 serves it within the ratio
        check(pool, 8, seed=seed)
    assert pool.wanted_sizes == (6,)
    assert pool.capture_wanted() is False
    assert cap.captured == [8] and pool.wanted_sizes == ()


def test_a_wanted_capture_evicts_as_a_capture_in_the_step_would() -> None:
    pool, cap = make(defer_captures=True, max_graph_pool_size=2, **ADMIT)
    pool.warmup([8, 16])
    for seed in range(3):
        check(pool, 3, seed=seed)  # 3 -> 8 padded (beyond the ratio); admitted, more often than the LRU 16
    assert pool.wanted_sizes == (3,)
    pool.capture_wanted()
    assert sorted(pool.resident_sizes()) == [3, 8] and cap.released == [16]


def test_tensor_parallel_pools_do_not_defer() -> None:
    def same(values: Sequence[int]) -> list[int]:
        return list(values)

    cap = EagerCapturer()
    pool = GraphPool(step, SPECS, PoolConfig(defer_captures=True, **ADMIT), device="cpu",  # type: ignore[arg-type]
                     capturer=cap, capture_sync=same)
    _ask_for_six(pool)
    assert cap.captured == [8, 6] and pool.wanted_sizes == ()


def test_capture_wanted_on_a_closed_or_empty_pool_does_nothing() -> None:
    pool, cap = make(defer_captures=True, **ADMIT)
    assert pool.capture_wanted() is False
    _ask_for_six(pool)
    pool.close()
    assert pool.capture_wanted() is False and cap.captured == [8]
