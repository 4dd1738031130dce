"""The step timeline on the GPU: device times come from CUDA events (no sync per step) and resolve to real
numbers; a step that captured a graph is marked, and replayed decode steps follow it."""

from __future__ import annotations

from graphpool import LLM, SamplingParams
from graphpool.engine.timeline import records_from_export


def test_timeline_device_times_and_captures_on_cuda() -> None:
    from gpu_helpers import report

    llm = LLM(model="random:llama3.2-1b", device="cuda", max_model_len=256, num_kv_blocks=64,
              graph_warmup="none", record_step_timeline=True)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.generate([list(range(100, 140)), list(range(200, 220))], params, use_tqdm=False)
    steps = records_from_export(llm.engine.timeline.export())
    assert [s.kind for s in steps] == ["prefill"] + ["decode"] * 15
    assert steps[1].captures == 1 and steps[1].graph  # the first decode of bs 2 captured its graph, then replayed
    assert all(s.graph and s.captures == 0 for s in steps[2:])
    for s in steps:
        assert s.device_seconds is not None and s.device_seconds > 0
        # the forward's GPU time fits in the step's host time (sampling syncs on it before the step ends)
        assert s.device_seconds <= s.seconds + 1e-3, s
    replayed = sorted(s.device_seconds * 1e3 for s in steps[2:])
    report("timeline_gpu ms", {"prefill_60_tokens_host": steps[0].seconds * 1e3,
                               "prefill_60_tokens_device": steps[0].device_seconds * 1e3,
                               "capture_step_host": steps[1].seconds * 1e3,
                               "replayed_decode_bs2_device_p50": replayed[len(replayed) // 2]})
