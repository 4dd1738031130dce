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
