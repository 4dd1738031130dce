from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from graphpool.bench.trace.config import CONFIG_NAMES, TraceBenchConfig, serving_configs
from graphpool.bench.trace.replay import replay_trace
from graphpool.bench.trace.report import summarize_run
from graphpool.bench.trace.warmup import sweep_contexts, warm_contexts, warm_engine
from graphpool.bench.workload import TraceRequest
from graphpool.engine.outputs import RequestOutput, StepInfo
from graphpool.pool import PoolStats


@dataclass
class _Req:
    rid: str
    max_tokens: int
    made: int = 0
    prefilled: bool = False


class FakeEngine:
    """Prefill then decode, one token per running request per step, each step sleeping `step_s`."""

    def __init__(self, step_s: float = 0.002) -> None:
        self.step_s = step_s
        self.running: dict[str, _Req] = {}
        self.prompt_lens: dict[str, int] = {}
        self.decode_batches: list[int] = []
        self.last_step: StepInfo | None = None
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, rid: str, prompt: list[int], params: Any) -> None:
        assert params.ignore_eos and prompt
        self.running[rid] = _Req(rid, params.max_tokens)
        self.prompt_lens[rid] = len(prompt)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def abort_request(self, rid: str) -> None:
        self.running.pop(rid, None)
        self.aborted.append(rid)

    def graph_stats(self) -> PoolStats:
        return PoolStats(steps=self.steps, hits=self.steps, resident_bytes=1000 * min(self.steps, 5))

    def step(self) -> list[RequestOutput]:
        time.sleep(self.step_s)
        new = [r for r in self.running.values() if not r.prefilled]
        batch = new or list(self.running.values())
        kind = "prefill" if new else "decode"
        if kind == "decode":
            self.steps += 1
            self.decode_batches.append(len(batch))
        outs = []
        for r in batch:
            r.prefilled = True
            r.made += 1
            done = r.made >= r.max_tokens
            outs.append(RequestOutput(r.rid, [1], [0] * r.made, [0], "", "", done, "length" if done else None))
            if done:
                del self.running[r.rid]
        self.last_step = StepInfo(kind, len(batch), len(batch), self.step_s, kind == "decode")  # type: ignore[arg-type]
        return outs


def test_replay_records_token_times_in_wall_clock_and_aborts_at_the_end() -> None:
    trace = [TraceRequest(0, 0.0, 5, 3), TraceRequest(1, 0.05, 5, 1000), TraceRequest(2, 10.0, 5, 3)]
    eng = FakeEngine()
    rr = replay_trace(eng, trace, duration_s=0.3)
    first, long, late = rr.timelines
    assert first.finished and len(first.token_times) == 3
    # arrives at 0 s: its first token comes at the end of its prefill step (one 2 ms fake step), on the replay's clock
    assert 0.002 <= first.token_times[0] < rr.duration_s and first.token_times == sorted(first.token_times)
    assert long.token_times[0] >= 0.05  # not served before it arrived
    assert not long.finished and eng.aborted == ["r1"] and rr.aborted == 1
    assert late.token_times == []  # arrives after the window: never added
    assert rr.duration_s >= 0.3  # the window, then the step in flight (no bound: a busy machine is slow)
    assert rr.prefill_steps == 2 and len(rr.decode_batch_sizes) == rr.decode_graph_steps >= 2
    assert set(rr.decode_batch_sizes) <= {1, 2}
    assert rr.peak_resident_bytes == 5000
    # ITLs are one fake step apart (plus scheduling noise)
    assert min(long.itls()) >= 0.002

    ladder = list(range(1, 33))
    run = summarize_run(serving_configs(ladder, 1 << 28)[4], 16.0, 1.5, rr, ladder, window=100)
    assert run.captures_serving == 0 and run.hit_rate == 1.0
    assert run.latency.started == 2 and run.working_set.distinct_buckets == len(set(rr.decode_batch_sizes))
    assert run.tokens_per_s == pytest.approx(run.latency.output_tokens / rr.duration_s)
    assert run.prefill_steps == 2 and run.decode_steps == len(rr.decode_batch_sizes)


def test_warm_contexts_hit_every_64_token_interval_up_to_the_longest_context() -> None:
    ctx = warm_contexts(2047)
    assert ctx[0] >= 2 and ctx[-1] == 2047 and ctx == sorted(set(ctx))
    # every interval (64k, 64k+64] that holds a reachable context holds a warmed one
    assert {(c - 1) // 64 for c in ctx} == set(range(32))
    assert warm_contexts(2) == [2] and warm_contexts(70) == [32, 70]
    with pytest.raises(ValueError):
        warm_contexts(1)


def test_warm_sweep_runs_one_request_at_a_time_with_one_decode_at_each_context() -> None:
    eng = FakeEngine(step_s=0.0)
    times = sweep_contexts(eng, [2, 100, 2047])
    assert eng.prompt_lens == {"c2": 1, "c100": 99, "c2047": 2046}  # decode context = prompt + 1 token
    assert eng.decode_batches == [1, 1, 1] and len(times) == 3  # alone: the step's bound is that context
    rep = warm_engine(FakeEngine(step_s=0.001), 200)
    assert rep.contexts == [32, 96, 160, 200]
    assert rep.decode_steps == 2 * 4 + 17  # two sweeps + batches shrinking 17 -> 1 (17 steps)
    # every fake step sleeps 1 ms: each pass's slowest decode step is at least that, in milliseconds, and the
    # warm-up's wall time covers its 25 decode and 9 prefill steps
    assert rep.first_pass_max_ms >= 1.0 and rep.second_pass_max_ms >= 1.0
    assert rep.seconds >= 34 * 0.001


def test_trace_bench_config_max_context_is_the_longest_reachable() -> None:
    assert TraceBenchConfig().max_context == 2047
    assert TraceBenchConfig(prompt_cap=100, output_cap=50).max_context == 149


def test_every_serving_config_is_a_valid_engine_config() -> None:
    cfg = TraceBenchConfig(device="cpu")
    probe = cfg.engine_config({})
    ladder = list(probe.pool_config.ladder().sizes)
    assert len(ladder) == 46
    configs = serving_configs(ladder, 256 << 20)
    assert [c.key for c in configs] == list(CONFIG_NAMES)
    built = {c.key: cfg.engine_config(c.overrides) for c in configs}
    assert built["no-graphs"].disable_cudagraph
    assert built["capture-all"].graph_warmup == tuple(ladder) and built["capture-all"].max_graph_pool_size == 46
    assert built["lazy-unbounded"].graph_warmup == "none" and built["lazy-unbounded"].pool_config.miss_policy == "capture"
    assert built["lru16-capture-on-miss"].max_graph_pool_size == 16 and built["lru16-capture-on-miss"].pool_config.mempool == "shared"
    assert built["lru16-capture-on-miss"].graph_warmup == tuple(range(1, 17))  # what LightLLM's LRU keeps after its warm-up
    cover = built["warm-cover"].graph_warmup
    assert isinstance(cover, tuple) and 256 in cover and 1 in cover and len(cover) <= 16
    assert built["no-warmup"].pool_config.miss_policy == "admit" and built["no-warmup"].pool_config.mempool == "arena"
    assert built["budget"].pool_config.graph_memory_budget == 256 << 20
    # one fixed KV cache for every configuration (8 GiB of llama3.2-1b KV in 16-token blocks)
    assert len({b.num_kv_blocks for b in built.values()}) == 1
    assert built["no-graphs"].num_kv_blocks == (8 << 30) // (2 * 16 * 16 * 8 * 64 * 4)  # fp32 on CPU
    assert all(not b.profile_steps for b in built.values())


def test_trace_bench_rotates_config_order_per_load_and_reports_after_every_run(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from test_bench_report import _run

    from graphpool.bench.trace import run as trace
    from graphpool.bench.trace.warmup import WarmupReport

    ran: list[tuple[float, str]] = []

    def fake_run_one(cfg: Any, sc: Any, rate: float, ladder: Any) -> Any:
        ran.append((rate, sc.key))
        r = _run(sc.key, 4.0, rate=rate)
        r.label = sc.label
        return r

    monkeypatch.setattr(trace, "run_one", fake_run_one)
    monkeypatch.setattr(trace, "warm_process", lambda cfg: WarmupReport(contexts=[32, 2047], decode_steps=4))
    a, b, c = "no-graphs", "capture-all", "lazy-unbounded"
    cfg = TraceBenchConfig(rates=(4.0, 16.0, 40.0), configs=(a, b, c), device="cpu")
    res = trace.run_trace_bench(cfg, tmp_path, ["test"])
    assert [k for _, k in ran] == [a, b, c, b, c, a, c, a, b]  # no policy always first
    runs = res["runs"]
    assert [(r["rate"], r["config"], r["run_order"]) for r in runs[3:6]] == [(16.0, b, 0), (16.0, c, 1), (16.0, a, 2)]
    assert json.loads((tmp_path / "trace.json").read_text())["results"]["process_warmup"]["decode_steps"] == 4
    md = (tmp_path / "trace.md").read_text()
    table16 = md.split("## 16 requests/s")[1].split("##")[0]
    assert [ln[3:ln.index(")")] for ln in table16.splitlines() if ln.startswith("| (")] == [a, b, c]  # in order
    assert "process warm-up (graphs off) ran 4 eager decode steps at 2 context lengths up to 2047" in md


def test_a_run_replays_with_the_heap_before_it_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the server freezes its start-up heap, so a collection during a run walks only what the run makes."""
    import gc

    from graphpool.bench.trace import run as trace

    class Stop(Exception):
        pass

    frozen: list[int] = []

    def replay(*args: Any, **kwargs: Any) -> Any:
        frozen.append(gc.get_freeze_count())
        raise Stop

    class Engine:
        def __init__(self, cfg: Any) -> None:
            pass

    monkeypatch.setattr(trace, "replay_trace", replay)
    monkeypatch.setattr("graphpool.engine.engine.LLMEngine", Engine)
    cfg = TraceBenchConfig(device="cpu", configs=("no-graphs",))
    sc = next(c for c in serving_configs([1, 2], 1 << 20) if c.key == "no-graphs")
    with pytest.raises(Stop):
        trace.run_one(cfg, sc, 4.0, [1, 2])
    assert frozen and frozen[0] > 0
    assert gc.get_freeze_count() == 0  # given back after the run
