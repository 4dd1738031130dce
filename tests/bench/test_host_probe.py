"""benchmarks/host_probe.py on the CPU with a one-layer random model: the engine alone and one streamed request
through the in-process server give a gap (alone: and the launch part of a step) and both threads' CPU time per
token."""

from __future__ import annotations

import host_probe
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams


def test_engine_alone_and_through_the_server() -> None:
    engine = LLMEngine(EngineConfig(model="random:smollm2-135m?layers=1", device="cpu", max_model_len=512,
                                    num_kv_blocks=64))
    params = SamplingParams(max_tokens=host_probe.SKIP + 8, temperature=0.8, ignore_eos=True)
    gap, launch = host_probe.engine_alone(engine, params)
    assert gap > 0 and launch > 0 and engine.before_wait is None
    [(gap, engine_cpu, loop_cpu)] = host_probe.through_server(engine, params, reps=1)
    assert gap > 0 and engine_cpu > 0 and loop_cpu > 0
    assert not engine.has_unfinished_requests()


def test_parts_are_timed_per_call_and_the_methods_restored() -> None:
    """`timed_parts`: one schedule, decode call, draw and output a step (one request, no pool run on the CPU:
    its steps run eagerly), each a positive time; afterwards the instances hold no wrapper."""
    engine = LLMEngine(EngineConfig(model="random:smollm2-135m?layers=1", device="cpu", max_model_len=512,
                                    num_kv_blocks=64))
    params = SamplingParams(max_tokens=host_probe.SKIP + 8, temperature=0.8, ignore_eos=True)
    drawn: list[int] = []

    def no_draw(logits: object, params: object) -> None:  # a kernel draw that declines: the torch draw runs
        drawn.append(1)

    engine.sampler.draw = no_draw
    with host_probe.timed_parts(engine) as times:
        host_probe.engine_alone(engine, params)
    steps = params.max_tokens
    assert len(times["outputs"]) == steps and len(times["draw"]) == steps
    assert len(times["decode call"]) == steps - 1 and not times["pool run (in decode)"]  # the first: prefill
    assert len(times["LM head (in decode)"]) == steps and len(times["kernel draw (in draw)"]) == len(drawn) == steps
    assert len(times["schedule"]) >= steps - 1 and all(t > 0 for v in times.values() for t in v)
    for owner, method in ((engine, "_append"), (engine.scheduler, "schedule"), (engine.runner, "decode"),
                          (engine.runner.pool, "run"), (engine.model, "compute_logits"), (engine.sampler, "sample_step")):
        assert method not in vars(owner)
    assert engine.sampler.draw is no_draw  # an attribute of the instance's own is put back as it was


def test_profile_lists_the_functions_with_the_most_own_time() -> None:
    """`profiled`: at most N rows, most own time first, and the engine's own step among the functions seen."""
    engine = LLMEngine(EngineConfig(model="random:smollm2-135m?layers=1", device="cpu", max_model_len=512,
                                    num_kv_blocks=64))
    params = SamplingParams(max_tokens=host_probe.SKIP + 8, temperature=0.8, ignore_eos=True)
    rows = host_probe.profiled(engine, params, top=400)
    assert 0 < len(rows) <= 400 and [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    assert any(name.startswith("engine.py:") and name.endswith("(step)") for name, _, _ in rows)
    assert all(calls > 0 and own >= 0 for _, calls, own in rows)
    assert len(host_probe.profiled(engine, params, top=3)) == 3


def test_served_variants_each_stream_and_the_switch_interval_comes_back() -> None:
    """`--served`: each variant streams its requests through a server of its own event loop, the interpreter's
    switch interval set for it and given back; a malformed variant is refused with the form it takes."""
    import sys

    import pytest

    engine = LLMEngine(EngineConfig(model="random:smollm2-135m?layers=1", device="cpu", max_model_len=512,
                                    num_kv_blocks=64))
    params = SamplingParams(max_tokens=host_probe.SKIP + 8, temperature=0.8, ignore_eos=True)
    before = sys.getswitchinterval()
    variants = [host_probe.Served.parse("asyncio"), host_probe.Served.parse("asyncio:0.5")]
    assert variants[1].switch_ms == 0.5 and variants[0].switch_ms == 5.0 and str(variants[1]) == "asyncio, switch 0.5 ms"
    rows = host_probe.served_rounds({"": engine}, params, 1, variants)  # NOTE: a server start each: one round
    assert list(rows) == [("", v) for v in variants]
    assert [len(r) for r in rows.values()] == [1, 1] and all(gap > 0 for r in rows.values() for gap, _, _ in r)
    assert sys.getswitchinterval() == before
    for bad in ("tokio", "asyncio:0", "uvloop:x"):
        with pytest.raises(ValueError):
            host_probe.Served.parse(bad)


def test_against_reads_one_config_field() -> None:
    """`--against FIELD=VALUE`: an EngineConfig field and its value as a literal where it reads as one."""
    import pytest

    assert host_probe.config_change("max_num_seqs=4") == {"max_num_seqs": 4}
    assert host_probe.config_change("async_scheduling=False") == {"async_scheduling": False}
    assert host_probe.config_change("graph_warmup=none") == {"graph_warmup": "none"}
    for bad in ("max_num_seqs", "no_such_field=1"):
        with pytest.raises(ValueError, match="FIELD=VALUE"):
            host_probe.config_change(bad)
