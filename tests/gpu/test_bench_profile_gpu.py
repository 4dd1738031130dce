"""`bench profile` on the GPU: kernels counted per layer from the CUDA activity (bf16, random Llama-3.2-1B
shapes; at one row no norm or SwiGLU kernel of a layer's own), and the prefill step's device time. No timing
assertions: only that the tables are consistent."""

from __future__ import annotations

from pathlib import Path

import pytest

import replay_probe
from graphpool.bench.profile.run import PARTS, ProfileConfig, run_profile_bench
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine


def test_profile_bench_counts_the_kernels_of_a_bf16_decode_step(tmp_path: Path) -> None:
    cfg = ProfileConfig(model="random:llama3.2-1b", batch_sizes=(1,), context_len=512, prefill_tokens=40,
                        warmup=2, reps=3)
    res = run_profile_bench(cfg, tmp_path, ["test"])
    assert res["cuda"] and res["dtype"] == "torch.bfloat16"
    (d,) = res["decode"]
    n = d.num_layers
    assert n == 16 and d.kernels_per_step > n and d.kinds.get("kernel", 0) > n
    # every kernel was linked to the range that launched it, so every layer has its own count
    assert set(d.layer_counts) == set(range(n)) and d.per_layer >= 3
    assert not any(k.startswith("unattributed") for k in d.outside_layers), (d.outside_layers, d.unlinked)
    assert not d.unlinked
    # the device-side copies of the gp.* ranges are no kernels; the Triton kernels (no aten op above their
    # cuLaunchKernelEx) are in their layer
    assert not any(r.name.startswith("gp.") for r in d.rows), [r.name for r in d.rows]
    assert d.per_layer_min == d.per_layer_max
    # NOTE: at one row the norms and SwiGLU fold into the GEMVs: the final norm, outside the layers, is left
    rows = {r.name: r for r in d.rows}
    assert rows["_gemv_rope_kernel"].in_layers_per_layer == rows["_gemv_swiglu_kernel"].in_layers_per_layer == 1
    assert "_silu_mul_kernel" not in rows and rows["_rms_norm_kernel"].in_layers_per_layer == 0
    assert rows["_rms_norm_kernel"].outside_layers_per_step == 1
    assert d.layers_share_pct > 50  # 16 layers' weights against one LM head
    assert d.outside_layers[PARTS["gp.step"]] >= 1  # the LM head's GEMM
    assert d.per_layer * n + sum(d.outside_layers.values()) == pytest.approx(d.kernels_per_step)
    assert sum(r.share_pct for r in d.rows) == pytest.approx(100.0, abs=0.01)
    assert sum(r.per_step for r in d.rows) == pytest.approx(d.kernels_per_step)
    assert d.device_us_per_step > 0 and d.graph_note  # what the profiler shows of a graph replay
    p = res["prefill"]
    assert p.kernels > n and p.kernel_ms > 0 and p.busy_ms <= p.profiled_step_ms + 1e-3 and 0 <= p.idle_share < 1
    assert not any(r.name.startswith("gp.") for r in p.top_kernels)
    assert p.kernel_ms <= p.profiled_step_ms and p.launches > n and p.launch_host_us > 0
    # NOTE: on torch 2.11 / Python 3.12 cProfile has lost the frames above the layers; where it does,
    # the report says so (profile/prefill.LOST_FRAMES_NOTE) rather than show a table that looks whole
    assert p.top_python and any(f.startswith("model/") for f, _, _ in p.top_python), p.top_python
    lost = "cProfile lost the frames" in p.python_source
    assert lost or any(f.endswith(": prefill") for f, _, _ in p.top_python), (p.python_source, p.top_python)
    print(p.python_source)
    assert "activities CPU + CUDA" in (tmp_path / "profile.md").read_text()


def test_replay_probe_counts_one_graph_launch_and_one_input_copy_a_decode_step() -> None:
    """benchmarks/replay_probe.py's pieces on a random SmolLM2: a replay times on both clocks, and a sampled
    decode step launches one graph and copies its host inputs once (the pool's one copy), the draw's
    parameters once, the tokens to the host once, and no more than that and the next input ids."""
    engine = LLMEngine(EngineConfig(model="random:smollm2-135m"))
    idle, behind, other, (gpu_ms,) = replay_probe.time_replays(*replay_probe.small_graphs(engine))
    assert len(idle) == len(behind) == len(other) == replay_probe.REPLAYS
    assert all(h > 0 for h in idle + behind + other) and gpu_ms > 0
    in_steps = replay_probe.replays_in_steps(engine, steps=10)
    assert len(in_steps) == 10 and all(h > 0 for h in in_steps)
    assert "replay" not in vars(engine.runner.pool._capturer)  # the timing wrapper is gone
    calls = replay_probe.api_calls(engine)
    assert calls["cudaGraphLaunch"] == 1
    assert calls["cudaMemcpyAsync"] <= 4, calls
