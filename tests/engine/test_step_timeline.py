"""The engine's step timeline, the server's GET /debug/steps, and the attribution of client gaps to causes."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest

from graphpool import LLM, SamplingParams
from graphpool.bench.serve.attribution import (
    CAUSES,
    attribute,
    attribute_ttft,
    cause_table,
    gap_parts,
    merge,
    step_summary,
    step_table,
    ttft_table,
)
from graphpool.engine.timeline import StepRecord, StepTimeline, records_from_export
from graphpool.pool.testing import EagerCapturer


def _step(start: float, seconds: float, kind: str = "decode", graph: bool = True, captures: int = 0,
          chained: bool = False) -> StepRecord:
    return StepRecord(kind=kind, batch_size=4, num_tokens=4 if kind == "decode" else 40, seconds=seconds,
                      graph=graph, start=start, captures=captures, chained=chained)


def test_engine_records_every_step_in_order() -> None:
    llm = LLM(model="random:smollm2-135m", device="cpu", max_model_len=64, num_kv_blocks=16,
              record_step_timeline=True)
    assert llm.engine.timeline is not None
    before = time.monotonic()
    llm.generate([[5, 6, 7], [8, 9]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    steps = records_from_export(llm.engine.timeline.export())
    assert [s.kind for s in steps] == ["prefill"] + ["decode"] * 3  # both prompts in one prefill, then 3 decodes
    assert [s.batch_size for s in steps] == [2, 2, 2, 2] and steps[0].num_tokens == 5
    assert steps[0].start >= before
    for a, b in itertools.pairwise(steps):
        assert a.start + a.seconds <= b.start  # one engine thread: steps never overlap
    assert all(s.device_seconds is None and s.captures == 0 and not s.graph and not s.chained for s in steps)
    assert LLM(model="random:smollm2-135m", device="cpu", max_model_len=64, num_kv_blocks=16).engine.timeline is None


def _captured_steps(max_tokens: int, **kw) -> list[StepRecord]:
    """The timeline of one 3-token prompt through an engine with the stand-in capturer (`kw`: EngineConfig)."""
    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine

    cfg = EngineConfig(model="random:smollm2-135m", device="cpu", max_model_len=64, num_kv_blocks=16,
                       graph_warmup="none", record_step_timeline=True, **kw)
    engine = LLMEngine(cfg, capturer=EagerCapturer())
    engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return records_from_export(engine.timeline.export())


def test_a_step_that_captures_is_marked() -> None:
    assert [(s.kind, s.captures, s.graph) for s in _captured_steps(3)] == [
        ("prefill", 0, False), ("decode", 1, True), ("decode", 0, True)]


def test_async_scheduling_marks_chained_steps_and_each_capture_once() -> None:
    """A chained step is launched before the step before closes: the capture its launch makes is its own."""
    steps = _captured_steps(4, async_scheduling=True)
    assert [(s.kind, s.chained, s.captures, s.graph) for s in steps] == [
        ("prefill", False, 0, False), ("decode", True, 1, True), ("decode", True, 0, True), ("decode", True, 0, True)]


def test_the_step_summary_counts_chained_steps_by_kind() -> None:
    steps = [_step(0.0, 0.01, "mixed"), _step(0.01, 0.01, "mixed", chained=True), _step(0.02, 0.005, chained=True),
             _step(0.025, 0.005, chained=True), _step(0.03, 0.005)]
    summary = step_summary(steps)
    assert {k: (v["steps"], v["chained"]) for k, v in summary.items()} == {"mixed step": (2, 1),
                                                                           "graph decode step": (3, 2)}
    assert "| steps | chained |" in step_table({"cfg": summary})


def test_timeline_keeps_the_newest_records() -> None:
    tl = StepTimeline(__import__("torch").device("cpu"), capacity=3)
    for i in range(5):
        tl.add(_step(float(i), 0.5), None)
    data = tl.export()
    assert data["dropped"] == 2 and [r.start for r in records_from_export(data)] == [2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="capacity"):
        StepTimeline(__import__("torch").device("cpu"), capacity=0)


def test_gap_parts_split_the_gap_by_what_ran() -> None:
    steps = [_step(0.000, 0.003), _step(0.004, 0.030, kind="prefill", graph=False), _step(0.035, 0.003)]
    ends = [s.start + s.seconds for s in steps]
    # token a arrived at 3.5 ms (after step 0); token b at 40 ms, made by step 2 (ended 38 ms)
    parts = gap_parts(0.0035, 0.040, steps, ends)
    assert parts["prefill step"] == pytest.approx(0.030)
    assert parts["graph decode step"] == pytest.approx(0.003)
    assert parts["engine thread between steps"] == pytest.approx(0.0015)
    assert parts["delivery (HTTP, event loop, client)"] == pytest.approx(0.002)
    assert sum(parts.values()) == pytest.approx(0.040 - 0.0035)


def test_gap_parts_give_a_chained_launch_its_own_time() -> None:
    """Async scheduling: step 1 is launched (and captures a graph) inside step 0's span, whose outputs come
    after it; the capture's time is the capture's, not step 0's."""
    steps = [_step(0.000, 0.060), _step(0.002, 0.061, captures=1)]
    ends = [s.start + s.seconds for s in steps]
    parts = gap_parts(0.001, 0.061, steps, ends)  # token b made by step 0 (ended 60 ms)
    assert parts["graph capture"] == pytest.approx(0.058)
    assert parts["graph decode step"] == pytest.approx(0.001)
    assert parts["delivery (HTTP, event loop, client)"] == pytest.approx(0.001)
    assert sum(parts.values()) == pytest.approx(0.060)


def test_attribute_names_the_largest_part() -> None:
    steps = [_step(0.0, 0.002), _step(0.002, 0.050, captures=1), _step(0.052, 0.002),
             _step(0.054, 0.030, kind="prefill", graph=False), _step(0.084, 0.002),
             _step(0.200, 0.002)]
    # stream 1: a capture gap (2 -> 54 ms), then a prefill gap (54 -> 86 ms); stream 2: a late delivery
    # (its token was made at 86 ms but arrived at 150 ms), a gap under the threshold, and the engine idle
    # between 86 and 200 ms
    got = attribute([[0.0021, 0.0541, 0.0861], [0.0861, 0.150, 0.152, 0.2021]], steps)
    assert got["gaps"] == 4
    assert got["counts"] == {"graph capture": 1, "prefill step": 1, "graph prefill step": 0, "eager decode step": 0,
                             "graph decode step": 0, "mixed step": 0,
                             "engine thread between steps": 1, "delivery (HTTP, event loop, client)": 1,
                             "client event loop late": 0}
    assert set(got["counts"]) == set(CAUSES)
    assert got["steps"]["prefill step"]["steps"] == 1 and got["steps"]["graph capture"]["host_ms_max"] == 50.0
    # a lower threshold takes the 2 ms gap of stream 2 too (150 -> 152 ms: its token waited to be delivered)
    fine = attribute([[0.0021, 0.0541, 0.0861], [0.0861, 0.150, 0.152, 0.2021]], steps, threshold_ms=1.5)
    assert fine["gaps"] == 5 and fine["counts"]["delivery (HTTP, event loop, client)"] == 2
    merged = merge([fine, fine])
    assert merged["threshold_ms"] == 1.5 and merged["gaps"] == 10
    assert "| gap threshold ms | gaps over it |" in cause_table({"c": merged}) and "| c | 1.5 | 10 |" in cause_table(
        {"c": merged})


def test_the_ttft_tail_is_attributed_to_what_it_waited_for() -> None:
    """Ten requests alone in turn: nine prefilled in a 2 ms graph step, one in a 30 ms eager step; only the tail
    (at or over p90) is attributed, the slow one to its eager prefill."""
    steps, waits = [], []
    for i in range(10):
        t = 0.1 * i
        eager = i == 7
        steps.append(_step(t + 0.001, 0.030 if eager else 0.002, kind="prefill", graph=not eager))
        waits.append((t, t + (0.0325 if eager else 0.0045)))
    got = attribute_ttft(waits, steps)
    assert got["percentile"] == 90.0 and got["ttfts"] == 1
    assert got["counts"]["prefill step"] == 1 and sum(got["counts"].values()) == 1
    assert got["seconds"]["prefill step"] == pytest.approx(0.030)
    wide = attribute_ttft(waits, steps, percent=0.0)
    assert wide["ttfts"] == 10 and wide["counts"]["graph prefill step"] == 9
    merged = merge([{**attribute([], steps), "ttft_tail": got}, {**attribute([], steps), "ttft_tail": wide}])
    assert merged["ttft_tail"]["ttfts"] == 11 and merged["ttft_tail"]["counts"]["prefill step"] == 2
    assert "| c | p90 | 11 |" in ttft_table({"c": merged["ttft_tail"]})
    assert "ttft_tail" not in merge([attribute([], steps)])  # runs recorded before it have none


def test_server_serves_the_timeline_only_when_asked() -> None:
    pytest.importorskip("fastapi")
    from graphpool.server.main import serve_in_thread

    for record in (False, True):
        llm = LLM(model="random:smollm2-135m", device="cpu", max_model_len=64, num_kv_blocks=16,
                  record_step_timeline=record)
        with serve_in_thread(llm.engine) as (base_url, _):
            r = httpx.post(f"{base_url}/v1/completions", json={"model": llm.engine.model_name, "prompt": [5, 6],
                                                                "max_tokens": 3, "ignore_eos": True}, timeout=60)
            assert r.status_code == 200
            got = httpx.get(f"{base_url}/debug/steps", timeout=60)
        if not record:
            assert got.status_code == 404 and "--record-step-timeline" in got.json()["error"]["message"]
            continue
        assert got.status_code == 200
        steps = records_from_export(got.json())
        assert [s.kind for s in steps] == ["prefill", "decode", "decode"]


def test_a_gap_the_client_was_late_for_is_the_clients() -> None:
    steps = [_step(0.000, 0.003), _step(0.003, 0.003), _step(0.006, 0.003), _step(0.009, 0.003),
             _step(0.012, 0.003), _step(0.015, 0.003), _step(0.018, 0.003), _step(0.021, 0.003)]
    # the engine made a token every 3 ms, but the client's loop was late from 4 to 22 ms: a burst at 23 ms
    times = [0.0031, 0.023, 0.0231]
    late = [(0.004, 0.022)]
    got = attribute([times], steps, late_spans=[late])
    assert got["gaps"] == 1 and got["counts"]["client event loop late"] == 1
    assert got["seconds"]["client event loop late"] == pytest.approx(0.018)
    assert sum(got["seconds"].values()) == pytest.approx(0.023 - 0.0031)
    blind = attribute([times], steps)  # without the client's spans the same gap looks like decode steps
    assert blind["counts"]["graph decode step"] == 1


def test_client_processes_share_one_time_axis() -> None:
    pytest.importorskip("openai")
    from graphpool.bench.serve.clients import run_trace_processes
    from graphpool.bench.workload import TraceRequest
    from graphpool.server.main import serve_in_thread

    llm = LLM(model="random:smollm2-135m", device="cpu", max_model_len=64, num_kv_blocks=32)
    trace = [TraceRequest(i, 0.05 * i, 4, 3) for i in range(6)]
    with serve_in_thread(llm.engine) as (base_url, _):
        t = time.monotonic()
        run = run_trace_processes(base_url, llm.engine.model_name, trace, 0, True, None, "test", processes=2,
                                  progress_every_s=0)
    assert run.processes == 2 and [r.index for r in run.results] == list(range(6))
    assert [r.worker for r in run.results] == [0, 1, 0, 1, 0, 1]
    assert all(r.error is None and r.completion_tokens == 3 for r in run.results), run.errors_sample
    assert t < run.t0_monotonic and len(run.late_spans) == 2 and run.cpu_share > 0
    for r in run.results:  # sent on schedule (never early; late on a busy machine), on the shared axis
        assert r.scheduled_s - 0.01 <= r.timeline.arrival_s < r.scheduled_s + 30
        assert r.timeline.token_times[0] > r.timeline.arrival_s
