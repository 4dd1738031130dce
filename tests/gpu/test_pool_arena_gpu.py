"""The arena layout (the default) on a real GPU, in the driver's view: graphs share one arena and hold no
device memory of their own (their executables live in the driver's heap, reused from one graph to the next),
the last graph gives the arena back, the byte budget counts the arena, capacity 1 / evict_all / a failed
capture stay safe, an output held past its graph stays readable, and replay == eager bit for bit (the real
default model included).

Run: .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/gpu/test_pool_arena_gpu.py
(-s prints the measured figures: lines starting with "[report]").
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from gpu_helpers import report

import budget_probe
from graphpool import LLM, SamplingParams
from graphpool.bench.decode import DecodeSetup, build_random_model, setup_input_specs
from graphpool.bench.memory import Recorder, capture_order
from graphpool.pool import CudaGraphCapturer, FallbackReason, GraphPool, PoolConfig, cuda_state
from model_reference import PARITY_PROMPTS
from toy import TOY_SPECS, ToyDecode

DEV = torch.device("cuda")
MiB = 2**20
ROUNDING = 4 * MiB  # the driver hands out memory in 2 MiB pages; two partly used pages of slack
OWN_TARGET = 4.5 * MiB  # what one resident graph may cost alone at the 1B shape
RESIDENT_TARGET = 115 * MiB  # 16 resident graphs and their arena at the 1B shape: a quarter of vLLM's capture-all


def free_bytes() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def padded(live: dict[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
    pad = torch.zeros(size - live["input_ids"].shape[0], dtype=torch.int64, device=DEV)
    return {k: torch.cat([v, pad]) for k, v in live.items()}


@pytest.fixture(scope="module")
def setup_1b() -> DecodeSetup:
    """The engine's decode step at the llama3.2-1b shape (random weights), bf16, context 1024, up to bs 256."""
    model = build_random_model("llama3.2-1b", DEV, torch.bfloat16, "auto", max_positions=1024 + 16)
    return DecodeSetup.create(model, 256, 1024)


@torch.inference_mode()
def test_1b_graphs_hold_nothing_of_their_own_and_the_last_gives_the_arena_back(setup_1b: DecodeSetup) -> None:
    step = setup_1b.engine_step_fn()
    cuda_state.side_stream(DEV)
    for bs in (1, 256):  # the eager kernels' modules load before the baseline
        step(setup_1b.batch(bs))
    config = PoolConfig(miss_policy="capture", max_len_in_batch=1024, max_graph_pool_size=46)
    assert config.mempool == "arena"  # the default
    groups = capture_order(config, 16)
    cap = CudaGraphCapturer(DEV)
    rec = Recorder(cap)
    base = free_bytes()
    pool = GraphPool(step, setup_input_specs(setup_1b), config, DEV, rec)
    pool.warmup(groups[0] + groups[1])
    st = pool.stats()
    held = base - free_bytes()
    report("arena_1b_16_graphs", {"held_mib": held / MiB, "arena_mib": st.arena_bytes / MiB,
                                  "executables_mib": cap.process_overhead / MiB})
    assert st.resident_graphs == 16 and st.arena_bytes > 0 and st.resident_bytes == st.arena_bytes
    assert all(g.footprint == 0 for g in rec.graphs.values())
    assert cap.process_overhead / 16 <= OWN_TARGET  # the executables, the driver's heap: per graph
    assert held <= RESIDENT_TARGET, held / MiB
    assert held <= st.resident_bytes + cap.process_overhead + ROUNDING
    for s in groups[0] + groups[1]:  # a first launch uploads the executable: nothing more may be taken then
        pool.run(setup_1b.batch(s), max_len_in_batch=1024)
    replayed = base - free_bytes()
    report("arena_1b_16_graphs_after_a_replay_each_mib", replayed / MiB)
    assert replayed <= held + ROUNDING
    # half of them go and as many other sizes come: the arena and the executables' heap serve them as they are
    overhead = cap.process_overhead
    for s in groups[1]:
        assert pool.evict(s)
    pool.warmup(groups[2][: len(groups[1])])
    assert pool.stats().resident_graphs == 16 and pool.stats().arena_bytes == st.arena_bytes
    swapped = base - free_bytes()
    report("arena_1b_swap_5_graphs", {"held_mib": swapped / MiB, "executables_grew_mib": (cap.process_overhead - overhead) / MiB})
    assert swapped <= held + ROUNDING
    # the last graph gives the arena back
    before, arena = free_bytes(), pool.stats().arena_bytes
    assert pool.evict_all() == 16 and pool.stats().resident_bytes == 0
    freed = free_bytes() - before
    report("arena_1b_evict_all", {"arena_mib": arena / MiB, "freed_mib": freed / MiB})
    assert freed >= 0.95 * arena
    pool.close()


@torch.inference_mode()
@pytest.mark.parametrize("layout", ["arena", "per_graph"])
def test_1b_replay_equals_eager_bit_for_bit(setup_1b: DecodeSetup, layout: str) -> None:
    step = setup_1b.engine_step_fn()
    pool = GraphPool(step, setup_input_specs(setup_1b), PoolConfig(miss_policy="capture", mempool=layout,
                                                                   max_len_in_batch=1024), DEV)  # type: ignore[arg-type]
    pool.warmup([256, 64, 8])  # the arena sized by the largest, the smaller ones reuse it
    for bs in (1, 8, 40, 64, 200):
        live = setup_1b.batch(bs)
        hidden = pool.run(live).clone()
        size = pool.ladder.find_closest(bs)
        assert size is not None
        want = _eager_padded(setup_1b, step, bs, size)
        assert hidden.shape[0] == bs and torch.equal(hidden, want[:bs]), (layout, bs)
    assert pool.stats().eager_steps == 0
    pool.close()


def _eager_padded(setup: DecodeSetup, step: Callable[..., Any], bs: int, size: int) -> torch.Tensor:
    """The step run eagerly on the pool's padding of the first ``bs`` rows to ``size`` (specs' pad values)."""
    padded_inputs = {}
    for spec in setup_input_specs(setup):
        live = setup.inputs[spec.name][:bs]
        pad = torch.full((size - bs, *spec.trailing_shape), spec.pad_value, dtype=spec.dtype, device=DEV)
        padded_inputs[spec.name] = torch.cat([live, pad])
    return step(padded_inputs)


def _calibrated_budget() -> int:
    """A budget between what the arena needs at small and at large batch sizes of the probe's step, so
    that the large sizes do not fit with their arena and the small ones do."""
    step, specs = budget_probe.mlp_step(DEV)
    need = {}
    for bs in (32, 512):
        pool = GraphPool(step, specs, PoolConfig(miss_policy="capture", max_batch_size=512), DEV)
        pool.warmup([bs])
        need[bs] = pool.stats().resident_bytes
        pool.close()
    report("arena_budget_calibration_mib", {bs: n / MiB for bs, n in need.items()})
    assert need[512] > need[32] + 8 * MiB, need
    return (need[32] + need[512]) // 2


@pytest.mark.parametrize("keep_outputs", [False, True])
def test_budget_counts_the_arena_in_the_driver_view(keep_outputs: bool) -> None:
    budget = _calibrated_budget()
    r = budget_probe.run(120, budget_mib=budget / MiB, keep_outputs=keep_outputs, layout="arena")
    report(f"arena_budget_keep_outputs_{keep_outputs}", budget_probe.describe(r))
    assert r["captures"] > 5 and r["evictions"] > 0 and 0 < r["arena"] <= budget
    assert r["accounted"] <= budget
    # NOTE: a held output keeps the arena it aliases until the next step: one arena (the largest graph) of slack
    slack = r["footprint"] if keep_outputs else 0
    assert r["held"] <= r["budget"] + r["overhead"] + slack + ROUNDING
    assert r["after_close"] <= r["overhead"] + ROUNDING


@torch.inference_mode()
def test_capacity_one_with_outputs_held_until_the_next_run(small: ToyDecode) -> None:
    pool = GraphPool(small, TOY_SPECS, PoolConfig(miss_policy="capture", max_graph_pool_size=1), device=DEV)
    held_at: dict[int, int] = {}
    base = free_bytes()
    out = None
    for i in range(120):
        bs = (3, 48, 7, 20)[i % 4]
        live = small.inputs(bs, seed=i)
        out = pool.run(live)  # the previous step's output is still referenced while this one evicts its graph
        assert torch.equal(out, small(padded(live, pool.ladder.find_closest(bs) or bs))[:bs])
        if i in (20, 119):
            held_at[i] = base - free_bytes()
    st = pool.stats()
    assert st.captures == 120 and st.evictions == 119 and st.resident_graphs == 1
    assert held_at[119] <= held_at[20] + ROUNDING, held_at  # retired arenas go back: nothing accumulates
    del out
    pool.close()


@torch.inference_mode()
def test_evict_all_gives_the_arena_back_and_captures_again(big: ToyDecode) -> None:
    base = free_bytes()
    cap = CudaGraphCapturer(DEV)
    pool = GraphPool(big, TOY_SPECS, PoolConfig(miss_policy="capture"), device=DEV, capturer=cap)
    for round_ in range(3):
        pool.warmup([256, 128, 16, 4])
        st = pool.stats()
        assert st.arena_bytes > 0 and base - free_bytes() >= st.arena_bytes
        for bs in (4, 128, 256):
            live = big.inputs(bs, seed=round_ * 10 + bs)
            assert torch.equal(pool.run(live).clone(), big(live))
        assert pool.evict_all() == 4 and pool.stats().resident_bytes == 0
        # the static inputs and the executables' heap only
        assert base - free_bytes() <= cap.process_overhead + ROUNDING
    pool.close()


@torch.inference_mode()
def test_an_output_held_past_its_arena_stays_readable_then_goes_back(big: ToyDecode) -> None:
    base = free_bytes()
    cap = CudaGraphCapturer(DEV)
    pool = GraphPool(big, TOY_SPECS, PoolConfig(miss_policy="capture", batch_sizes=(256,)), device=DEV, capturer=cap)
    pool.warmup([256])
    arena = pool.stats().arena_bytes
    live = big.inputs(200, seed=1)
    out = pool.run(live)  # an alias into the arena, not a copy
    want = out.clone()
    assert pool.evict_all() == 1
    assert base - free_bytes() >= arena  # the held output keeps its arena
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    del out, want
    pool.run(big.inputs(300, seed=2))  # above the ladder: eager, and every step first drains retired arenas
    assert base - free_bytes() <= cap.process_overhead + ROUNDING
    pool.close()


@torch.inference_mode()
def test_a_failed_capture_seals_the_arena_and_both_go_back(big: ToyDecode) -> None:
    def step(s: dict[str, torch.Tensor]) -> torch.Tensor:
        out = big(s)
        if s["input_ids"].shape[0] == 48 and torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # a host sync under capture: the capture fails
        return out

    base = free_bytes()
    cap = CudaGraphCapturer(DEV)
    pool = GraphPool(step, TOY_SPECS, PoolConfig(miss_policy="capture"), device=DEV, capturer=cap)
    pool.warmup([256])
    first = pool.stats().arena_bytes
    live = big.inputs(40, seed=3)
    assert torch.equal(pool.run(live), big(live))  # bs 48 failed: eager
    assert pool.stats().fallbacks == {FallbackReason.CAPTURE_FAILED: 1}
    pool.warmup([128])  # torch refuses a pool a capture failed in: a second arena
    st = pool.stats()
    assert st.arena_bytes > first and st.resident_graphs == 2
    for bs in (128, 256):  # both arenas' graphs replay
        live = big.inputs(bs, seed=bs)
        assert torch.equal(pool.run(live).clone(), big(live))
    assert pool.stats().hits == 2
    assert pool.evict_all() == 2
    assert base - free_bytes() <= cap.process_overhead + ROUNDING
    pool.close()


def test_default_model_arena_decodes_as_per_graph_token_for_token(default_gguf) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    got: dict[str, list[list[int]]] = {}
    stats = {}
    for layout in ("per_graph", "arena"):
        llm = LLM(device="cuda", max_model_len=256, num_kv_blocks=256, graph_mempool=layout)
        got[layout] = [o.token_ids for o in llm.generate(PARITY_PROMPTS, params, use_tqdm=False)]
        stats[layout] = llm.graph_stats()
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    arena, per = stats["arena"], stats["per_graph"]
    assert arena is not None and per is not None
    report("default_model_graph_mib", {k: (s.resident_graphs, s.resident_bytes / MiB, s.arena_bytes / MiB)
                                       for k, s in stats.items() if s is not None})
    assert got["arena"] == got["per_graph"]
    assert arena.hits + arena.padded_hits > 0 and arena.resident_sizes == per.resident_sizes
    # NOTE: the graphs hold nothing of their own; with the LM head outside them per_graph's pools are small too
    # (each rounded up to its allocator segments), so the shared arena is below their sum, not a fixed share
    assert 0 < arena.arena_bytes == arena.resident_bytes < per.resident_bytes
