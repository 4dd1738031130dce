"""The one-row GEMV (kernels/gemv.py), its few-row form and programmatic dependent launch (kernels/pdl.py) on the
GPU: the GEMV against float64 at the projections' shapes of llama3.2-1b and llama3-8b (no worse than cuBLAS's
own error by more than an output rounding), at two rows too (each row the one-row kernel's bits where K fits
one tile); a chain of norm -> GEMV -> SwiGLU -> GEMV layers captured in a CUDA graph gives the same bits with
and without PDL (a GEMV reading x before the kernel ahead of it finished would not) and replays as it ran
eagerly; inside the engine (random llama3.2-1b, bf16, one sequence at a time, so every decode step has one
row; then four at a time) against cuBLAS: argmaxes agree except at near-ties, and a graph step equals an eager
one. An engine with a bitwise kernel switched off (`--disable-kernels`: the qkv GEMV + rotary + KV write, the
step's argmax) gives the defaults' very logits; the qkv GEMV + rotary + KV write also against the GEMV and the
rotary kernel it replaces (bitwise, over 96 rows at random positions), eagerly and replayed."""

from __future__ import annotations

import random

import pytest
import torch
from gpu_helpers import report
from test_engine_gpu import MAX_MODEL_LEN, PRESET, Record, compare, run
from test_kernels_gpu import _capture
from test_kernels_silu_mul_gpu import build

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.kernels.pdl import pdl_on
from graphpool.model.ops import ModelOps, argmax_torch, kernel_ops, no_fusion

SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (4096, 14336), (896, 130)]


def _max_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemv_is_as_close_to_float64_as_cublas(n: int, k: int, dtype: torch.dtype) -> None:
    from graphpool.kernels._triton_gemv import gemv_triton

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    x = torch.randn(1, k, device="cuda", generator=gen).to(dtype)
    for b in (None, bias):
        ref = x.double() @ w.double().T + (0.0 if b is None else b.double())
        cublas = torch.nn.functional.linear(x, w, b)
        ulp = float(ref.abs().max()) * torch.finfo(dtype).eps  # one rounding at the largest output
        for pdl in (False, True):
            y = gemv_triton(x, w, b, pdl=pdl)
            assert y.shape == cublas.shape and y.dtype == dtype
            assert _max_err(y, ref) <= _max_err(cublas, ref) + ulp, (b is not None, pdl)


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_two_row_gemv_is_as_close_to_float64_as_cublas_and_each_row_the_one_row_kernels(n: int, k: int) -> None:
    """Two rows (bf16): no further from float64 than cuBLAS plus one output rounding; with K in one tile each
    row is the one-row kernel's very bits (so a sequence decodes alike at batch sizes 1 and 2); a replay in a
    CUDA graph gives the eager bits."""
    from graphpool.kernels._triton_gemv import MAX_BLOCK_K, gemv_triton

    m = 2
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    bias = torch.randn(n, device="cuda", generator=gen).bfloat16()
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    for b in (None, bias):
        ref = x.double() @ w.double().T + (0.0 if b is None else b.double())
        cublas = torch.nn.functional.linear(x, w, b)
        ulp = float(ref.abs().max()) * torch.finfo(torch.bfloat16).eps
        y = gemv_triton(x, w, b)
        assert y.shape == cublas.shape and _max_err(y, ref) <= _max_err(cublas, ref) + ulp, b is not None
        if k <= MAX_BLOCK_K:
            one = torch.cat([gemv_triton(x[i:i + 1], w, b) for i in range(m)])
            assert torch.equal(y, one)
    eager, graph = _graph_outputs(lambda: [gemv_triton(x, w, bias)])
    assert torch.equal(eager[0], graph[0])


def _chain(layers: list[tuple[torch.Tensor, ...]], x: torch.Tensor, ops: ModelOps) -> list[torch.Tensor]:
    """norm -> gate_up GEMV -> silu*mul -> down GEMV (+ residual), per layer, with the op set `ops`: the GEMVs
    follow the kernels that trigger their early launch."""
    outs = []
    residual = x
    h = ops.rms_norm(x, layers[0][0], 1e-5)
    for norm_w, gate_up, down in layers:
        y = ops.linear(ops.silu_mul(ops.linear(h, gate_up, None)), down, None)
        outs.append(y)
        h, residual = ops.add_rms_norm(y, residual, norm_w, 1e-5)
    return outs


def _graph_outputs(fn):
    """(fn's outputs run eagerly, the same from a replay of fn captured in a CUDA graph)."""
    eager = [t.clone() for t in fn()]
    graph, outs = _capture(fn)
    graph.replay()
    torch.cuda.synchronize()
    return eager, [t.clone() for t in outs]


def chain_layers(seed: int, hidden: int = 2048, inter: int = 8192, count: int = 24):
    """(`count` layers of (norm weight, gate/up weight, down weight), an input row), bf16, seeded."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layers = [
        (torch.rand(hidden, device="cuda", generator=gen).bfloat16() + 0.5,
         (torch.randn(2 * inter, hidden, device="cuda", generator=gen) / hidden**0.5).bfloat16(),
         (torch.randn(hidden, inter, device="cuda", generator=gen) / inter**0.5).bfloat16())
        for _ in range(count)
    ]  # fmt: skip
    return layers, torch.randn(1, hidden, device="cuda", generator=gen).bfloat16()


def pdl_keeps_the_bits(chain, layers, x):  # type: ignore[no-untyped-def]
    """`chain(layers, x, ops)` with and without PDL, eagerly and replayed: every output is the plain eager
    run's bits; returns {mode: (eager, graph outputs)}."""
    modes = {"plain": kernel_ops(["pdl"]), "pdl": kernel_ops()}
    results = {mode: _graph_outputs(lambda ops=ops: chain(layers, x, ops)) for mode, ops in modes.items()}
    plain_eager = results["plain"][0]
    for mode, (eager, graph) in results.items():
        for kind, got in (("eager", eager), ("graph", graph)):
            assert all(torch.equal(a, b) for a, b in zip(got, plain_eager, strict=True)), (mode, kind)
    return results


def test_pdl_gives_the_bits_of_plain_launches() -> None:
    layers, x = chain_layers(0)
    results = pdl_keeps_the_bits(_chain, layers, x)
    cublas = _chain(layers, x, kernel_ops(["gemv", "pdl"]))
    pdl_graph = results["pdl"][1]
    # NOTE: reported, not bounded: through 24 norms the two summation orders drift apart; each GEMV's own
    # error is bounded by the test above
    drift = [
        float((a.float() - b.float()).abs().max() / b.float().abs().max())
        for a, b in zip(pdl_graph, cublas, strict=True)
    ]
    report(
        "gemv chain: relative difference from cuBLAS after layers 1 / 24",
        [round(drift[0], 4), round(drift[-1], 4)],
    )
    assert all(d == d for d in drift)  # no NaN


def _engine(loaded, max_num_seqs: int = 1, **kwargs) -> LLMEngine:
    config = EngineConfig(model=PRESET, device="cuda", dtype="bfloat16", max_model_len=MAX_MODEL_LEN,
                          num_kv_blocks=200, max_num_seqs=max_num_seqs, **kwargs)  # fmt: skip
    return LLMEngine(config, loaded=loaded)


def _work(seed: int):
    rng = random.Random(seed)
    return [
        ([rng.randrange(1000, 120000) for _ in range(rng.randint(4, 200))],
         SamplingParams(temperature=0, max_tokens=rng.randint(20, 60), ignore_eos=True))
        for _ in range(4)
    ]  # fmt: skip


def test_engine_with_the_gemv_matches_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.kernels import _triton_gemv

    loaded = build(torch.bfloat16, kernel_ops())
    calls = []
    launch = _triton_gemv.gemv_triton
    monkeypatch.setattr(
        _triton_gemv,
        "gemv_triton",
        lambda *a, **kw: calls.append(pdl_on(a[0].device, kw["pdl"])) or launch(*a, **kw),
    )
    ref = run(_engine(None, graph_miss_policy="capture", disabled_kernels="gemv,pdl"), _work(0))
    assert not calls
    got: Record = run(_engine(loaded, graph_miss_policy="capture"), _work(0), forced=ref)
    assert got.graph_steps > 50 and calls and all(calls)
    near_ties_only_then_graph_as_eager(ref, got, loaded, "gemv engine bf16 argmax flips vs cuBLAS")


def near_ties_only_then_graph_as_eager(ref: Record, got: Record, loaded, label: str) -> None:  # type: ignore[no-untyped-def]
    """`got` (forced with `ref`'s tokens) flips argmaxes only at near-ties (the count reported as `label`); then
    an engine over `loaded` replaying graphs against one running eagerly, the same way."""
    compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    flips = sum(got.argmax[k] != ref.argmax[k] for k in ref.argmax)
    report(label, f"{flips} of {len(ref.argmax)}")
    eager = run(_engine(loaded, disable_cudagraph=True), _work(1))
    graphed = run(_engine(loaded, graph_miss_policy="capture"), _work(1), forced=eager)
    compare(eager, graphed, tie=0.3, logit_tol=0.3, min_agree=0.93)


def test_engine_with_the_few_row_gemv_matches_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four sequences at a time (decode steps of 1-4 rows, two through the two-row GEMV): it against cuBLAS
    (`gemv_rows` off), argmaxes agreeing except at near-ties."""
    from graphpool.kernels import _triton_gemv

    loaded = build(torch.bfloat16, kernel_ops())
    rows: list[int] = []
    launch = _triton_gemv.gemv_triton
    monkeypatch.setattr(_triton_gemv, "gemv_triton",
                        lambda *a, **kw: rows.append(a[0].numel() // a[1].shape[1]) or launch(*a, **kw))
    # NOTE: synchronous, as test_engine_gpu.make says why: rows are recorded by their sequence's position
    ref = run(_engine(None, 4, graph_miss_policy="capture", disabled_kernels="gemv_rows", async_scheduling=False),
              _work(3))
    assert rows and max(rows) == 1  # one-row steps only (a sequence decoding alone)
    rows.clear()
    got: Record = run(_engine(loaded, 4, graph_miss_policy="capture", async_scheduling=False), _work(3), forced=ref)
    assert got.graph_steps > 20 and max(rows) > 1
    compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    flips = sum(got.argmax[k] != ref.argmax[k] for k in ref.argmax)
    report("few-row gemv engine bf16 argmax flips vs cuBLAS", f"{flips} of {len(ref.argmax)}")


@pytest.mark.parametrize("switch", ["gemv_rope", "step_argmax"])
def test_engine_with_a_bitwise_kernel_off_matches_the_defaults(switch: str) -> None:
    """The defaults against an engine built with `disabled_kernels` naming a default-on kernel that is bitwise
    what it replaces: the switch reaches the loaded model's op set, and the logits are the very same."""
    loaded = build(torch.bfloat16, kernel_ops())
    ref = run(_engine(loaded, graph_miss_policy="capture"), _work(2))
    engine = _engine(None, graph_miss_policy="capture", disabled_kernels=(switch,))
    ops = engine.model.ops
    assert (ops.fused_linear_rope is no_fusion) == (switch == "gemv_rope")
    assert (ops.step_argmax is argmax_torch) == (switch == "step_argmax")
    got = run(engine, _work(2), forced=ref)
    assert got.graph_steps > 50
    flips = sum(got.argmax[k] != ref.argmax[k] for k in ref.argmax)
    report(f"--disable-kernels {switch}: engine bf16 argmax flips vs the defaults", f"{flips} of {len(ref.argmax)}")
    assert got.chosen_logit == ref.chosen_logit and flips == 0


@pytest.mark.parametrize(("hq", "hkv", "dim", "k", "bias"), [(32, 8, 64, 2048, False), (32, 8, 128, 4096, False),
                                                            (14, 2, 64, 896, True)])  # fmt: skip
def test_gemv_rope_is_the_gemv_then_the_rotary_kernel(hq: int, hkv: int, dim: int, k: int, bias: bool) -> None:
    """Bitwise the GEMV then the rotary kernel (q, k, v and both caches) over 96 rows at random positions: one
    fp32 ulp of another contraction order would show up in about one rotated element of 30,000."""
    from graphpool.kernels._triton_gemv import gemv_triton
    from graphpool.kernels._triton_gemv_rope import gemv_rope_triton
    from graphpool.kernels.norm_rope import apply_rotary_and_write_kv

    gen = torch.Generator(device="cuda").manual_seed(k)
    n = (hq + 2 * hkv) * dim
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda", generator=gen).bfloat16() if bias else None
    xs = torch.randn(96, 1, k, device="cuda", generator=gen).bfloat16()
    freqs = torch.outer(torch.arange(4096.0), 500000.0 ** -(torch.arange(0, dim, 2) / dim)).cuda()
    cos, sin = freqs.cos(), freqs.sin()
    positions = torch.randint(0, 4096, (96, 1), device="cuda", generator=gen)
    slots = torch.randperm(128, device="cuda", generator=gen)[:96, None]
    caches = [torch.zeros(8, 16, hkv, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    x, pos, slot = xs[0].clone(), positions[0].clone(), slots[0].clone()

    def fused() -> list[torch.Tensor]:
        return [gemv_rope_triton(x, w, b, pos, cos, sin, caches[0], caches[1], slot, (hq, hkv, dim))]

    def two_kernels() -> torch.Tensor:
        q, kk, v = gemv_triton(x, w, b).split((hq * dim, hkv * dim, hkv * dim), -1)
        qr, kr = apply_rotary_and_write_kv(pos, q.view(1, hq, dim), kk.view(1, hkv, dim), v.view(1, hkv, dim), cos,
                                           sin, caches[2], caches[3], slot)  # fmt: skip
        return torch.cat([qr.reshape(1, -1), kr.reshape(1, -1), v], -1)

    eager, graph = _graph_outputs(fused)
    assert torch.equal(graph[0], eager[0]) and torch.equal(eager[0], two_kernels())
    differing = 0
    for i in range(96):
        x.copy_(xs[i])
        pos.copy_(positions[i])
        slot.copy_(slots[i])
        got, ref = fused()[0], two_kernels()
        differing += int((got != ref).sum())
    assert caches[0].abs().sum() > 0
    report(f"gemv_rope {hq}/{hkv}x{dim} K={k}: elements differing from the GEMV + rotary kernel",
           f"{differing} of {96 * n}, caches equal: {torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])}")  # fmt: skip
    assert differing == 0
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
