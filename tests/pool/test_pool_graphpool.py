"""GraphPool on CPU with the EagerCapturer test double: padding, hits, LRU, pins, budget, policies, reasons."""

from __future__ import annotations

import gc
import logging
import random

import pytest
import torch

from graphpool.pool import Decision, FallbackReason, GraphPool, InputSpec, PoolConfig, Route
from graphpool.pool.testing import EagerCapturer

D = 4
SPECS = (InputSpec("x", (D,), torch.float32, 0.0), InputSpec("ids", (), torch.int64, 0))
W = torch.randn(D, 3, generator=torch.Generator().manual_seed(0))


def step(s: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    # row-wise: row i of the output depends on row i of the inputs only
    return s["x"] @ W + s["ids"].unsqueeze(1).float(), s["ids"] * 2


def batch(bs: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(bs, D, generator=g), "ids": torch.randint(1, 100, (bs,), generator=g)}


def make(cap: EagerCapturer | None = None, **cfg: object) -> tuple[GraphPool, EagerCapturer]:
    cap = cap if cap is not None else EagerCapturer()
    return GraphPool(step, SPECS, PoolConfig(**cfg), device="cpu", capturer=cap), cap  # type: ignore[arg-type]


def check(pool: GraphPool, bs: int, seed: int = 0, **kw: object) -> None:
    b = batch(bs, seed)
    out = pool.run(b, **kw)  # type: ignore[arg-type]
    want = step(b)
    assert out[0].shape == (bs, 3) and out[1].shape == (bs,)
    torch.testing.assert_close(out[0], want[0], rtol=0, atol=1e-6)
    assert torch.equal(out[1], want[1])


def test_replay_equals_eager_with_padding() -> None:
    pool, cap = make(miss_policy="capture")
    for bs in (1, 5, 32, 33, 47, 48, 200, 256):
        check(pool, bs, seed=bs)
    assert cap.captured == [1, 5, 32, 48, 208, 256]
    st = pool.stats()
    assert (st.steps, st.hits, st.misses, st.captures) == (8, 2, 6, 6)  # 33->48 captured, 47/48 hit it
    assert st.eager_steps == 0


def test_padded_rows_take_pad_value_and_never_touch_live_rows() -> None:
    cache = torch.full((64,), -1.0)
    specs = (InputSpec("x", (), torch.float32, 0.0), InputSpec("slot", (), torch.int64, 0))

    def kv_step(s: dict[str, torch.Tensor]) -> torch.Tensor:
        cache.index_copy_(0, s["slot"], s["x"] * 10)  # "KV write"; padded rows write dummy slot 0
        return cache[s["slot"]] + 1

    pool = GraphPool(kv_step, specs, PoolConfig(batch_sizes=(8,)), device="cpu", capturer=EagerCapturer())
    x = torch.arange(1.0, 6.0)
    slot = torch.tensor([3, 9, 4, 20, 7])
    out = pool.run({"x": x, "slot": slot})
    assert torch.equal(out, x * 10 + 1)
    assert torch.equal(cache[slot], x * 10)
    assert cache[0] == 0.0  # pad rows wrote the dummy slot with the pad value
    assert set(torch.nonzero(cache != -1).flatten().tolist()) == {0, 3, 4, 7, 9, 20}


def test_hits_and_views_are_static() -> None:
    pool, cap = make()
    a = pool.run(batch(5, 1))
    b = pool.run(batch(5, 2))
    assert a[0].data_ptr() == b[0].data_ptr()  # views into the graph's static outputs
    torch.testing.assert_close(b[0], step(batch(5, 2))[0], rtol=0, atol=1e-6)
    c = pool.run(batch(5, 3), clone=True)
    assert c[0].data_ptr() != b[0].data_ptr()
    assert pool.stats().hits == 2 and cap.captured == [5]


def test_lru_order_capture_policy() -> None:
    pool, cap = make(miss_policy="capture", max_graph_pool_size=2)
    for bs in (1, 2, 1, 3):
        check(pool, bs)
    assert pool.resident_sizes() == (1, 3)
    assert cap.released == [2]
    assert pool.stats().evictions == 1


def test_pinned_never_evicted() -> None:
    pool, cap = make(miss_policy="capture", max_graph_pool_size=2, pinned=(1,))
    for bs in (1, 2, 3, 4, 5, 2):
        check(pool, bs)
    assert 1 in pool.resident_sizes()
    assert 1 not in cap.released
    assert pool.evict(1) and 1 not in pool.resident_sizes()  # explicit eviction may drop a pin


def test_capacity_one_alternating() -> None:
    pool, _ = make(miss_policy="capture", max_graph_pool_size=1)
    for i in range(200):
        check(pool, 3 if i % 2 else 7, seed=i)
    st = pool.stats()
    assert st.captures == 200 and st.evictions == 199 and st.resident_graphs == 1


def test_budget_eviction_and_never_exceeded() -> None:
    budget = 2000
    pool, _ = make(EagerCapturer(footprint=lambda s: 100 * s), miss_policy="capture", graph_memory_budget=budget)
    rng = random.Random(0)
    for i in range(300):
        bs = rng.randint(1, 19)
        check(pool, bs, seed=i)
        st = pool.stats()
        assert st.resident_bytes <= budget
        assert st.resident_bytes == sum(100 * s for s in st.resident_sizes)
    assert pool.stats().evictions > 0
    assert pool.stats().fallbacks == {}


def test_budget_counts_the_shared_arena() -> None:
    budget = 3000
    cap = EagerCapturer(footprint=lambda s: 10 * s, arena=lambda s: 100 * s)
    pool, _ = make(cap, miss_policy="capture", graph_memory_budget=budget)
    rng = random.Random(0)
    for i in range(300):
        check(pool, rng.randint(1, 40), seed=i)
        st = pool.stats()
        assert st.resident_bytes <= budget
        assert st.resident_bytes == sum(10 * s for s in st.resident_sizes) + st.arena_bytes
        # the arena is as large as the largest capture since it opened, and goes with the last graph
        assert st.arena_bytes >= 100 * max(st.resident_sizes, default=0)
        assert st.arena_bytes == 0 or st.resident_graphs
    assert pool.stats().evictions > 0


def test_a_capture_that_grows_the_arena_past_the_budget_empties_the_pool() -> None:
    cap = EagerCapturer(footprint=10, arena=lambda s: 100 * s)
    pool, _ = make(cap, miss_policy="capture", graph_memory_budget=1000)
    for bs in (1, 2, 4):
        check(pool, bs)
    assert pool.stats().resident_bytes == 30 + 400
    check(pool, 16)  # the arena would be 1600 bytes: the size is refused, and the arena goes back
    st = pool.stats()
    assert st.fallbacks == {FallbackReason.OVER_BUDGET: 1} and st.resident_graphs == 0 and st.arena_bytes == 0
    check(pool, 16)
    check(pool, 2)  # a fresh arena, as small as the graphs in it need
    st = pool.stats()
    assert st.fallbacks == {FallbackReason.OVER_BUDGET: 2} and st.resident_bytes == 10 + 200
    assert cap.arenas_opened == 2


def test_outputs_are_valid_until_the_next_run_of_any_size_and_clones_stay() -> None:
    pool, cap = make(miss_policy="capture")
    pool.warmup([9, 5])
    a, b = batch(5, 1), batch(9, 2)
    kept = pool.run(a, clone=True)
    view = pool.run(a)
    want = step(a)
    torch.testing.assert_close(view[0], want[0], rtol=0, atol=1e-6)
    other = pool.run(b)  # another graph: it writes the memory the first one's outputs are in
    assert other[0].data_ptr() == view[0].data_ptr()
    assert not torch.equal(view[1], want[1])  # overwritten, as the contract allows
    torch.testing.assert_close(kept[0], want[0], rtol=0, atol=1e-6)  # a clone is the caller's
    assert torch.equal(kept[1], want[1]) and cap.captured == [9, 5]


def test_graph_alone_over_budget_falls_back_and_is_not_recaptured() -> None:
    pool, cap = make(EagerCapturer(footprint=lambda s: 100 * s), graph_memory_budget=1000)
    check(pool, 4)
    check(pool, 16)
    check(pool, 16)
    st = pool.stats()
    assert st.fallbacks == {FallbackReason.OVER_BUDGET: 2}
    assert cap.captured == [4, 16] and cap.released == [16]
    assert st.resident_sizes == (4,) and st.resident_bytes == 400


def test_capture_failure_falls_back_logs_once_and_never_replays(caplog: pytest.LogCaptureFixture) -> None:
    cap = EagerCapturer(fail_sizes={3})
    pool, _ = make(cap)
    with caplog.at_level(logging.WARNING, logger="graphpool.pool.pool"):
        for i in range(5):
            check(pool, 3, seed=i)
    assert len([r for r in caplog.records if "capture of bs=3 failed" in r.getMessage()]) == 1
    st = pool.stats()
    assert st.capture_failures == 1 and st.fallbacks == {FallbackReason.CAPTURE_FAILED: 5}
    cap.fail_sizes.clear()
    check(pool, 3)  # still never replayed
    check(pool, 4)  # the pool keeps working
    assert cap.captured == [4] and pool.stats().fallbacks[FallbackReason.CAPTURE_FAILED] == 6


def test_runtime_error_during_capture_is_a_capture_failure() -> None:
    pool, _ = make(EagerCapturer(fail_sizes={2}, error=RuntimeError))
    check(pool, 2)
    assert pool.stats().capture_failures == 1


def test_static_fallback_reasons() -> None:
    pool, _ = make(max_len_in_batch=100)
    check(pool, 257)
    check(pool, 4, max_len_in_batch=101)
    assert not pool.can_run(257, 1) and not pool.can_run(4, 101) and pool.can_run(4, 100)
    assert pool.stats().fallbacks == {FallbackReason.BATCH_TOO_LARGE: 1, FallbackReason.LEN_TOO_LARGE: 1}
    off, cap = make(enabled=False)
    check(off, 4)
    assert off.stats().fallbacks == {FallbackReason.DISABLED: 1} and not off.can_run(4) and cap.captured == []
    nocuda = GraphPool(step, SPECS, PoolConfig(), device="cpu")
    b = batch(4)
    assert torch.equal(nocuda.run(b)[1], step(b)[1])
    assert nocuda.stats().fallbacks == {FallbackReason.NO_CUDA: 1} and nocuda.stats().eager_steps == 1


def test_route_answers_first_with_one_reason() -> None:
    """The routing every decision starts from: no CUDA, then a length past the bound, then graphs off, then a
    batch above the ladder; it neither observes nor counts."""
    pool, _ = make(max_len_in_batch=100)
    assert pool.route(33, 100) == Route(48) and pool.route(257) == Route(None, FallbackReason.BATCH_TOO_LARGE)
    assert pool.route(33, 101) == Route(48, FallbackReason.LEN_TOO_LARGE)
    assert pool.route(257, 101) == Route(None, FallbackReason.LEN_TOO_LARGE)
    assert pool.stats().steps == 0 and pool.decide(33, 101) == Decision.eager(FallbackReason.LEN_TOO_LARGE, 48)
    off, _ = make(enabled=False, max_len_in_batch=100)
    assert off.graphs_off is FallbackReason.DISABLED and off.route(4) == Route(None, FallbackReason.DISABLED)
    assert off.route(4, 101) == Route(None, FallbackReason.LEN_TOO_LARGE)
    nocuda = GraphPool(step, SPECS, PoolConfig(enabled=False, max_len_in_batch=100), device="cpu")
    assert nocuda.graphs_off is FallbackReason.NO_CUDA and nocuda.route(4, 101) == Route(None, FallbackReason.NO_CUDA)
    assert pool.graphs_off is None


def test_admit_padded_hits_and_not_admitted() -> None:
    pool, cap = make(max_graph_pool_size=1, admit_after=3, admit_window=16, max_padding_ratio=0.5)
    check(pool, 8)  # room: captured
    check(pool, 6)  # no room, rare: served padded by 8 (6*1.5 >= 8)
    assert pool.last_replayed
    check(pool, 2)  # no room, rare, none within ratio: the larger graph still beats an eager step
    assert pool.last_replayed
    check(pool, 12)  # no room, rare, no larger graph: eager
    assert not pool.last_replayed
    st = pool.stats()
    assert (st.hits, st.padded_hits, st.captures) == (0, 2, 1)
    assert st.fallbacks == {FallbackReason.NOT_ADMITTED: 1}
    check(pool, 2)
    check(pool, 2)  # third request of 2 within the window, more often than 8: admitted
    assert pool.resident_sizes() == (2,) and cap.captured == [8, 2]


def _captures(policy: str, seq: list[int]) -> int:
    pool, _ = make(miss_policy=policy, batch_sizes=tuple(range(1, 13)), max_graph_pool_size=4, max_padding_ratio=0.0)
    for i, bs in enumerate(seq):
        check(pool, bs, seed=i)
    return pool.stats().captures


def test_admit_frequent_does_not_thrash_on_a_working_set_larger_than_the_pool() -> None:
    rng = random.Random(1)
    hot = [1, 2, 3]
    seq = [rng.choice(hot) if rng.random() < 0.7 else rng.randint(4, 12) for _ in range(600)]
    thrash = _captures("capture", seq)
    admit = _captures("admit", seq)
    assert thrash > 150
    assert admit < thrash / 5


def test_microbatches_one_graph_two_inputs() -> None:
    def step2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[object, object]:
        return step(a), step(b)

    cap = EagerCapturer()
    pool = GraphPool(step2, SPECS, PoolConfig(num_microbatches=2), device="cpu", capturer=cap)
    a, b = batch(5, 1), batch(3, 2)
    out = pool.run([a, b])
    assert cap.captured == [5]
    for got, want in zip(out, (step(a), step(b)), strict=True):
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)
        assert torch.equal(got[1], want[1])
    assert out[1][0].shape == (3, 3)
    out = pool.run([b, a])
    assert pool.stats().hits == 1
    torch.testing.assert_close(out[1][0], step(a)[0], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="microbatch"):
        pool.run(a)


def test_warmup_default_is_bounded_padding_cover() -> None:
    seen: list[tuple[int, int, int]] = []
    pool, cap = make(pinned=(7,))
    captured = pool.warmup(progress=lambda d, n, s: seen.append((d, n, s)))
    assert captured == sorted(captured, reverse=True)
    assert 7 in captured and 256 in captured and 1 in captured
    assert len(captured) <= 16 and cap.captured == captured
    assert [d for d, _, _ in seen] == list(range(1, len(seen) + 1))


def test_warmup_respects_count_and_budget_without_evicting() -> None:
    pool, cap = make(max_graph_pool_size=3)
    assert pool.warmup(range(1, 9)) == [8, 7, 6]
    assert cap.released == []
    pool, cap = make(EagerCapturer(footprint=lambda s: 100 * s), graph_memory_budget=1000)
    assert pool.warmup([16, 8, 2, 1]) == [8, 2]  # 16 alone too big; 1 would exceed 1000
    assert pool.stats().resident_bytes <= 1000


def test_warmup_freezes_the_collector_while_it_captures_and_restores_it() -> None:
    seen: list[tuple[bool, bool]] = []  # (collector on, objects frozen) during each capture's step

    def watched(s: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
        return step(s)

    assert gc.isenabled() and gc.get_freeze_count() == 0
    pool = GraphPool(watched, SPECS, PoolConfig(), device="cpu", capturer=EagerCapturer())
    assert pool.warmup([4, 2]) == [4, 2]
    assert seen and all(state == (False, True) for state in seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    seen.clear()
    failing = GraphPool(watched, SPECS, PoolConfig(), device="cpu",
                           capturer=EagerCapturer(fail_sizes=[4], error=RuntimeError))
    gc.disable()
    try:
        assert failing.warmup([4, 2]) == [2]  # a failed capture inside the warm-up restores the same way
        assert not gc.isenabled() and gc.get_freeze_count() == 0  # off before, off after
    finally:
        gc.enable()
    pool.run(batch(3))
    assert seen[-1] == (True, False)  # a step after the warm-up sees the collector as the caller has it


def test_evict_all_then_reuse_and_close() -> None:
    pool, cap = make()
    for bs in (1, 2, 3):
        check(pool, bs)
    assert pool.evict_all() == 3 and pool.resident_sizes() == ()
    assert not pool.evict(2)
    check(pool, 2)
    assert pool.resident_sizes() == (2,)
    pool.close()
    assert cap.released == [1, 2, 3, 2]
    with pytest.raises(RuntimeError, match="close"):
        pool.run(batch(2))


def test_input_validation() -> None:
    pool, _ = make()
    with pytest.raises(ValueError, match="keys"):
        pool.run({"x": torch.zeros(2, D)})
    with pytest.raises(ValueError, match="shape"):
        pool.run({"x": torch.zeros(2, D + 1), "ids": torch.zeros(2, dtype=torch.int64)})
    with pytest.raises(ValueError, match="shape"):
        pool.run({"x": torch.zeros(2, D), "ids": torch.zeros(3, dtype=torch.int64)})
    with pytest.raises(ValueError, match="empty"):
        pool.run({"x": torch.zeros(0, D), "ids": torch.zeros(0, dtype=torch.int64)})
    with pytest.raises(ValueError, match="distinct"):
        GraphPool(step, (SPECS[0], SPECS[0]), device="cpu")


def test_stats_capture_seconds_and_eviction_log_does_not_flood(caplog: pytest.LogCaptureFixture) -> None:
    pool, _ = make(EagerCapturer(seconds=0.25), miss_policy="capture", max_graph_pool_size=1)
    with caplog.at_level(logging.INFO, logger="graphpool.pool.pool"):
        for i in range(250):
            check(pool, 1 + i % 2, seed=i)
    st = pool.stats()
    assert st.capture_seconds_total == pytest.approx(250 * 0.25) and st.capture_seconds_max == 0.25
    assert st.evictions == 249
    assert len([r for r in caplog.records if "evict" in r.getMessage()]) <= 10


def test_inference_mode_in_and_out() -> None:
    with torch.inference_mode():
        pool, _ = make(batch_sizes=(8, 16))
        pool.warmup([8])
        check(pool, 5)
    check(pool, 7)  # replays a graph captured under inference_mode, outside it
    check(pool, 9)  # captures outside inference_mode into static buffers built inside it
    with torch.inference_mode():
        check(pool, 9)
    assert pool.stats().captures == 2 and pool.stats().hits == 3


def test_drifting_batch_sizes_admit_with_padding_stalls_far_less() -> None:
    rng = random.Random(0)
    bs, seq = 20, []
    for _ in range(3000):  # a continuous-batching-like drift over ~29 buckets, more than the pool holds
        bs = max(1, min(40, bs + rng.choice((-2, -1, -1, 0, 0, 0, 1, 1, 2)) + (1 if bs < 10 else -1 if bs > 30 else 0)))
        seq.append(bs)
    stats = {}
    for policy in ("capture", "admit"):
        pool, _ = make(miss_policy=policy)
        for i, b in enumerate(seq):
            out = pool.run(batch(b, i))
            assert out[0].shape == (b, 3)
        stats[policy] = pool.stats()
    thrash, admit = stats["capture"], stats["admit"]
    assert thrash.captures > 60
    assert admit.captures < thrash.captures / 4
    assert admit.padded_hits > 0 and admit.eager_steps < len(seq) / 50


def test_resident_decision_borrows_resident_graphs_without_capturing_or_observing() -> None:
    pool, cap = make(miss_policy="capture")
    assert pool.resident_decision(5) is None  # nothing resident: no capture offered
    pool.warmup([8, 64])
    before = pool.stats()
    hit, pad = pool.resident_decision(8), pool.resident_decision(20)
    assert hit is not None and (hit.action, hit.bucket, hit.size) == ("hit", 8, 8)
    assert pad is not None and (pad.action, pad.bucket, pad.size) == ("pad", 20, 64)
    assert pool.resident_decision(65) is None  # above every resident graph
    assert pool.resident_decision(300) is None  # above the ladder
    assert pool.resident_decision(8, max_len_in_batch=pool.config.max_len_in_batch + 1) is None
    assert pool.stats() == before and cap.captured == [64, 8]  # a query: nothing counted or captured
    b = batch(20, seed=3)
    out = pool.run(b, decision=pad)
    torch.testing.assert_close(out[0], step(b)[0], rtol=0, atol=1e-6)
    st = pool.stats()
    assert (st.padded_hits, st.misses, st.captures) == (1, 0, 2) and cap.captured == [64, 8]
    off, _ = make(enabled=False)
    assert off.resident_decision(1) is None
