from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from graphpool.bench.cli import main
from graphpool.bench.decode import DecodeSetup, build_random_model
from graphpool.bench.profile import events as pe
from graphpool.bench.profile.prefill import _stepper, cprofile_python, prefill_engine
from graphpool.bench.profile.run import (
    PARTS,
    DecodeProfile,
    ProfileConfig,
    profile_decode,
    run_profile_bench,
)
from graphpool.model.config import ModelConfig

TINY = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=8)


def _check_decode(d: DecodeProfile) -> None:
    total = d.kernels_per_step
    assert total > 0 and float(total).is_integer()  # every profiled step runs the same ops
    assert set(d.layer_counts) == set(range(d.num_layers)) and min(d.layer_counts.values()) > 0
    assert d.per_layer_min <= d.per_layer <= d.per_layer_max
    assert d.per_layer * d.num_layers + sum(d.outside_layers.values()) == pytest.approx(total)
    assert set(d.outside_layers) == {PARTS[r] for r in ("gp.embedding", "gp.model", "gp.step", "gp.sampling")}
    assert min(d.outside_layers.values()) > 0
    assert d.kinds == {"cpu op": total}
    rows = d.rows
    assert sum(r.per_step for r in rows) == pytest.approx(total)
    assert sum(r.in_layers_per_layer for r in rows) == pytest.approx(d.per_layer)
    assert sum(r.outside_layers_per_step for r in rows) == pytest.approx(sum(d.outside_layers.values()))
    assert sum(r.share_pct for r in rows) == pytest.approx(100.0, abs=0.01)
    assert sum(r.us_per_step for r in rows) == pytest.approx(d.device_us_per_step, rel=1e-6)
    assert [r.us_per_step for r in rows] == sorted((r.us_per_step for r in rows), reverse=True)
    assert 0 < d.layers_share_pct < 100


def test_profile_bench_cpu_tables_are_consistent(tmp_path: Path) -> None:
    cfg = ProfileConfig(model=TINY, batch_sizes=(1, 3), context_len=20, prefill_tokens=8, steps=2, warmup=0,
                        reps=1, device="cpu")
    res = run_profile_bench(cfg, tmp_path, ["graphpool", "bench", "profile"])
    assert not res["cuda"] and [d.batch_size for d in res["decode"]] == [1, 3]
    for d in res["decode"]:
        _check_decode(d)
        assert d.graph_kernels is None  # graphs need CUDA
    p = res["prefill"]
    assert p.prompt_tokens == 8 and p.kernels > TINY.num_layers
    assert p.first_step_ms > 0 and p.warm_step_ms > 0 and p.stack_step_ms > 0
    assert p.kernel_ms > 0 and p.busy_ms <= p.profiled_step_ms + 1e-6 and 0 <= p.idle_share < 1
    assert sum(r.share_pct for r in p.top_kernels) <= 100.0 + 1e-6
    assert p.top_ops and all(us >= 0 for _, _, us in p.top_ops)
    funcs = [name for name, _, _ in p.top_python]
    assert p.python_source.startswith("torch.profiler with_stack") and p.stack_python_events > 0
    assert funcs and all(pe.is_python(f) and "bench/" not in f for f in funcs), funcs
    assert p.launches == 0 and "kernel launch calls" not in (tmp_path / "profile.md").read_text()  # no CUDA
    assert any("engine/runner.py" in f and f.endswith(": prefill") for f in funcs), funcs
    assert any("engine/engine.py" in f and f.endswith(": step") for f in funcs), funcs
    md = (tmp_path / "profile.md").read_text()
    assert "CPU only" in md and "command: `graphpool bench profile`" in md and "### Prefill step" in md
    data = json.loads((tmp_path / "profile.json").read_text())
    assert [d["batch_size"] for d in data["results"]["decode"]] == [1, 3]
    assert data["results"]["prefill"]["kernels"] == p.kernels


def test_per_layer_counts_follow_the_number_of_layers() -> None:
    cfg = ProfileConfig(model=TINY, batch_sizes=(2,), warmup=0, device="cpu")
    by_layers = {}
    for n in (2, 4):
        model = build_random_model(replace(TINY, num_layers=n), torch.device("cpu"), torch.float32, "torch", 64)
        setup = DecodeSetup.create(model, max_batch_size=2, context_len=20, block_size=8)
        with torch.inference_mode():
            by_layers[n] = profile_decode(setup, 2, cfg)
    two, four = by_layers[2], by_layers[4]
    # two more layers, each like the second layer of the 2-layer model; the non-layer part is the same
    assert four.kernels_per_step - two.kernels_per_step == 2 * two.layer_counts[1]
    assert four.outside_layers == two.outside_layers
    assert four.layer_counts[1] == four.layer_counts[2] == four.layer_counts[3] == two.layer_counts[1]


def test_kernel_names_group_and_busy_time_counts_overlaps_once() -> None:
    gemm = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)"
    assert pe.group_name(gemm) == "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
    assert pe.group_name("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD (Pinned -> Device)"
    assert pe.kind_of("Memcpy HtoD (Pinned -> Device)", True) == "memcpy" and pe.kind_of("k", False) == "cpu op"
    evs = [pe.DeviceEvent("a", "kernel", "", 10.0, 0.0, 10.0), pe.DeviceEvent("b", "kernel", "", 10.0, 5.0, 15.0),
           pe.DeviceEvent("c", "kernel", "", 5.0, 30.0, 35.0)]
    assert pe.union_us(evs, 0.0, 100.0) == 20.0  # [0, 15] and [30, 35]
    assert pe.union_us(evs, 8.0, 32.0) == 9.0  # [8, 15] and [30, 32]
    assert pe.part_of("gp.layer.3", PARTS) == "layers" and pe.part_of("", PARTS).startswith("unattributed")
    assert math.isclose(pe.kernel_table(evs, 1, 2)[0].share_pct + pe.kernel_table(evs, 1, 2)[1].share_pct, 80.0)


def test_profile_cli_defaults_and_bad_sizes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import argparse

    from graphpool.bench.cli import _add_benches

    p = argparse.ArgumentParser()
    _add_benches(p)
    a = p.parse_args(["profile"])
    assert a.model == "random:llama3.2-1b" and a.batch_sizes == "1,64" and a.context_len == 512
    assert a.prefill_tokens == 40 and a.out == Path("results/profile")
    assert main(["profile", "--batch-sizes", "1,x", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "--batch-sizes must be comma-separated ints" in capsys.readouterr().err
    assert main(["profile", "--batch-sizes", "", "--prefill-tokens", "0", "--device", "cpu"]) == 2
    assert "nothing to profile" in capsys.readouterr().err


def _ev(id_: int, name: str, t0: float, t1: float, dev: DeviceType = DeviceType.CPU, **kw: object) -> FunctionEvent:
    return FunctionEvent(id=id_, name=name, thread=kw.pop("thread", 1), start_us=t0, end_us=t1, device_type=dev,
                         **kw)  # type: ignore[arg-type]


def test_cuda_kernels_link_to_their_launch_call_and_annotations_are_no_kernels() -> None:
    """A CUDA profile's shape (torch.profiler FunctionEvents, as torch builds them from kineto): a Triton
    kernel launched by cuLaunchKernelEx with no aten op above it (the call has kineto's own thread id), an
    aten::mm's kernel, the device-side copies of the gp.* ranges, a kernel linked to nothing."""
    cuda = DeviceType.CUDA
    events = [
        _ev(1, "gp.layer.0", 0, 100, is_user_annotation=True), _ev(2, "gp.sampling", 100, 150, is_user_annotation=True),
        _ev(501, "cuLaunchKernelEx", 10, 14, thread=4242, activity_type="cuda_driver"),
        _ev(7, "aten::mm", 40, 60), _ev(502, "cudaLaunchKernel", 45, 50, thread=4242, linked_correlation_id=7),
        _ev(8, "aten::argmax", 110, 120),
        _ev(501, "_rms_norm_kernel", 20, 25, cuda), _ev(502, "void gemm_kernel<8>(float*)", 52, 70, cuda,
                                                         linked_correlation_id=7),
        _ev(900, "gp.layer.0", 20, 70, cuda, is_user_annotation=True, activity_type="gpu_user_annotation"),
        _ev(901, "gp.sampling", 125, 130, cuda),  # an annotation as a torch without is_user_annotation shows it
        _ev(503, "Memcpy DtoH (Device -> Pinned)", 125, 128, cuda, linked_correlation_id=8),
        _ev(999, "lost_kernel", 140, 141, cuda),
    ]
    evs = pe.device_events(events, cuda=True)
    got = {(e.name, e.region, e.link) for e in evs}
    assert got == {("_rms_norm_kernel", "gp.layer.0", "runtime"), ("gemm_kernel<8>", "gp.layer.0", "runtime"),
                   ("Memcpy DtoH (Device -> Pinned)", "gp.sampling", "op"), ("lost_kernel", "", "")}
    assert sum(e.dur_us for e in evs) == 5 + 18 + 3 + 1  # the annotations' spans are not in the device time
    assert pe.unlinked(evs) == {"lost_kernel": 1}
    assert pe.launch_stats(events, 0, 100) == (2, 9.0) and pe.launch_stats(events, 30, 100) == (1, 5.0)
    assert pe.window_us(events, "gp.layer.0") == (0.0, 100.0)  # the host range, not its device copy


def test_cprofile_python_names_graphpool_functions_like_the_torch_tracer() -> None:
    from graphpool.bench.profile.run import _load

    cfg = ProfileConfig(model=TINY, batch_sizes=(), prefill_tokens=6, device="cpu", dtype="float32")
    loaded = _load(cfg, torch.device("cpu"), torch.float32, 64)
    with torch.inference_mode():
        step = _stepper(prefill_engine(loaded, "tiny", cfg, 64), cfg.prefill_tokens)
        step()
        rows, whole = cprofile_python(step, 50)
    funcs = [f for f, _, _ in rows]
    assert whole  # the CPU step (SDPA prefill attention) keeps every frame
    assert any(f.startswith("engine/engine.py(") and f.endswith(": step") for f in funcs), funcs
    assert any(f.startswith("engine/runner.py(") and f.endswith(": prefill") for f in funcs), funcs
    assert not any("bench/" in f for f in funcs) and all(n >= 1 and us > 0 for _, n, us in rows)
    assert [us for _, _, us in rows] == sorted((us for _, _, us in rows), reverse=True)


def test_cprofile_python_says_when_it_lost_the_outermost_frame() -> None:
    def never_runs() -> float:
        return 0.0

    class Lossy:
        """A step whose own frame (its __code__) is not in the profile: what the H200 showed around the varlen
        attention, where cProfile kept the layers' frames but lost the ones above them."""

        __code__ = never_runs.__code__

        def __call__(self) -> float:
            return 1.0

    _, whole = cprofile_python(Lossy(), 5)
    assert not whole
    _, whole = cprofile_python(never_runs, 5)
    assert whole


def test_graphpool_frames_are_told_by_their_file_whatever_sys_path_strips(monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = Path(pe.__file__).resolve().parents[2]  # src/graphpool
    runner = pkg / "engine" / "runner.py"
    assert pe.graphpool_frame(f"{runner}(66): prefill") == "engine/runner.py(66): prefill"
    assert pe.graphpool_frame(f"{pkg / 'bench' / 'decode.py'}(1): f") is None  # the bench's own frames
    assert pe.graphpool_frame(f"{torch.__file__}(1): f") is None and pe.graphpool_frame("aten::mm") is None
    # graphpool's own folder on sys.path (`python src/graphpool/cli.py`): torch names its files `engine/...`
    monkeypatch.setattr(pe, "_prefixes", lambda: (str(pkg) + "/", str(pkg.parent) + "/"))
    pe.package_file.cache_clear()
    try:
        assert pe.graphpool_frame("engine/runner.py(66): prefill") == "engine/runner.py(66): prefill"
        assert pe.graphpool_frame("graphpool/engine/runner.py(66): prefill") == "engine/runner.py(66): prefill"
        assert pe.graphpool_frame("typing.py(359): inner") is None
    finally:
        pe.package_file.cache_clear()
