"""The staged few-row kernel (kernels/_triton_gemv_rows.py, ``GRAPHPOOL_STAGED_KERNELS=gemv_rows``) on the GPU:
against float64 at the projections' shapes of llama3.2-1b and llama3-8b for 2-8 rows (no worse than cuBLAS's
own error by more than an output rounding), with and without PDL; a CUDA graph of it replays with new inputs
as it runs eagerly; inside the engine (random llama3.2-1b, bf16, up to 6 sequences a step) against the
defaults (cuBLAS at 2+ rows): argmaxes agree except at near-ties, graph steps equal eager ones."""

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
from graphpool.kernels.pdl import LaunchFlags
from graphpool.kernels.staging import OFF_ENV, STAGED_ENV
from graphpool.model.ops import kernel_ops

SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (4096, 14336), (896, 130)]


def _max_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max())


@pytest.mark.parametrize("m", [2, 3, 5, 8])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemv_rows_is_as_close_to_float64_as_cublas(n: int, k: int, m: int) -> None:
    from graphpool.kernels._triton_gemv_rows import gemv_rows_triton

    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    bias = torch.randn(n, device="cuda", generator=gen).bfloat16()
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    for b in (None, bias):
        ref = x.double() @ w.double().T + (0.0 if b is None else b.double())
        cublas = torch.nn.functional.linear(x, w, b)
        ulp = float(ref.abs().max()) * torch.finfo(torch.bfloat16).eps
        for pdl in (False, True):
            y = gemv_rows_triton(x, w, b, flags=LaunchFlags(pdl, False))
            assert y.shape == cublas.shape and y.dtype == torch.bfloat16
            assert _max_err(y, ref) <= _max_err(cublas, ref) + ulp, (b is not None, pdl)


def test_gemv_rows_graph_replays_as_eager() -> None:
    from graphpool.kernels._triton_gemv_rows import gemv_rows_triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(3072, 2048, device="cuda", generator=gen) / 2048**0.5).bfloat16()
    x = torch.randn(4, 2048, device="cuda", generator=gen).bfloat16()
    graph, out = _capture(lambda: gemv_rows_triton(x, w))
    for _ in range(3):
        x.copy_(torch.randn(4, 2048, device="cuda", generator=gen))
        graph.replay()
        assert torch.equal(out, gemv_rows_triton(x, w))


def _engine(loaded, **kwargs) -> LLMEngine:
    config = EngineConfig(model=PRESET, device="cuda", dtype="bfloat16", max_model_len=MAX_MODEL_LEN,
                          num_kv_blocks=400, max_num_seqs=6, **kwargs)  # fmt: skip
    return LLMEngine(config, loaded=loaded)


def _work(seed: int):
    rng = random.Random(seed)
    return [
        ([rng.randrange(1000, 120000) for _ in range(rng.randint(4, 120))],
         SamplingParams(temperature=0, max_tokens=rng.randint(20, 50), ignore_eos=True))
        for _ in range(10)
    ]  # fmt: skip


def test_engine_with_gemv_rows_matches_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.kernels import _triton_gemv_rows

    loaded = build(torch.bfloat16, kernel_ops())
    rows: list[int] = []
    launch = _triton_gemv_rows.gemv_rows_triton
    monkeypatch.setattr(
        _triton_gemv_rows, "gemv_rows_triton", lambda *a, **kw: rows.append(a[0].shape[0]) or launch(*a, **kw)
    )
    monkeypatch.delenv(OFF_ENV, raising=False)
    monkeypatch.delenv(STAGED_ENV, raising=False)
    ref = run(_engine(loaded, graph_miss_policy="capture"), _work(0))
    assert not rows
    monkeypatch.setenv(STAGED_ENV, "gemv_rows")
    got: Record = run(_engine(loaded, graph_miss_policy="capture"), _work(0), forced=ref)
    assert got.graph_steps > 50 and rows and set(rows) <= set(range(2, 9)) and len(set(rows)) > 1
    compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    flips = sum(got.argmax[k] != ref.argmax[k] for k in ref.argmax)
    report("staged gemv_rows: engine bf16 argmax flips vs the defaults", f"{flips} of {len(ref.argmax)}")
    eager = run(_engine(loaded, disable_cudagraph=True), _work(1))
    graphed = run(_engine(loaded, graph_miss_policy="capture"), _work(1), forced=eager)
    compare(eager, graphed, tie=0.3, logit_tol=0.3, min_agree=0.93)
