"""The staged few-row linear kernel (kernels/skinny_gemm.py) on the GPU: against float64 at the projections'
shapes of llama3.2-1b and llama3-8b (no worse than cuBLAS's own error by more than an output rounding), graph
replay bitwise equal to eager, and inside the engine (random llama3.2-1b, bf16, at most 4 rows a step) against
cuBLAS: argmaxes agree except at near-ties, and a graph step equals an eager one."""

from __future__ import annotations

import random

import pytest
import torch
from gpu_helpers import report
from test_engine_gpu import MAX_MODEL_LEN, PRESET, Record, compare, run

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.kernels.skinny_gemm import MAX_ROWS
from graphpool.kernels.staging import STAGED_ENV
from graphpool.model.llama import LlamaModel
from graphpool.model.loader import model_source
from graphpool.model.ops import ModelOps, kernel_ops
from graphpool.model.weights import init_random_weights

SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (4096, 14336), (896, 130)]


def _max_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_kernel_is_as_close_to_float64_as_cublas(n: int, k: int, dtype: torch.dtype) -> None:
    from graphpool.kernels._triton_skinny_gemm import skinny_linear_triton

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    for rows in range(1, MAX_ROWS + 1):
        x = torch.randn(rows, k, device="cuda", generator=gen).to(dtype)
        for b in (None, bias):
            ref = x.double() @ w.double().T + (0.0 if b is None else b.double())
            y = skinny_linear_triton(x, w, b)
            cublas = torch.nn.functional.linear(x, w, b)
            ulp = float(ref.abs().max()) * torch.finfo(dtype).eps  # one rounding at the largest output
            assert y.shape == cublas.shape and y.dtype == dtype
            assert _max_err(y, ref) <= _max_err(cublas, ref) + ulp, (rows, b is not None)


def test_graph_replay_equals_eager_and_rows_keep_their_bits() -> None:
    from graphpool.kernels._triton_skinny_gemm import skinny_linear_triton

    w = torch.randn(2048, 8192, device="cuda", dtype=torch.bfloat16) / 90
    static = torch.randn(MAX_ROWS, 8192, device="cuda", dtype=torch.bfloat16)
    skinny_linear_triton(static, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_linear_triton(static, w)
    same_bits = []
    for seed in (1, 2):
        static.copy_(torch.randn(MAX_ROWS, 8192, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, skinny_linear_triton(static, w))
        same_bits.append(
            all(torch.equal(skinny_linear_triton(static[:r], w), out[:r]) for r in range(1, MAX_ROWS))
        )
    # NOTE: reported, not asserted: the tile of rows (1, 2, 4) may change the reduction order
    report("skinny_gemm rows keep their bits in a smaller batch", same_bits)


def _build(ops: ModelOps):
    config = model_source(PRESET)
    assert not isinstance(config, tuple)
    model = LlamaModel(config, device="cuda", dtype=torch.bfloat16, max_positions=MAX_MODEL_LEN, ops=ops)
    init_random_weights(model, seed=0)
    return model.eval(), config, None


def _engine(loaded, **kwargs) -> LLMEngine:
    config = EngineConfig(model=PRESET, device="cuda", dtype="bfloat16", max_model_len=MAX_MODEL_LEN,
                          num_kv_blocks=400, max_num_seqs=MAX_ROWS, **kwargs)  # fmt: skip
    return LLMEngine(config, loaded=loaded)


def _work(seed: int):
    rng = random.Random(seed)
    return [
        ([rng.randrange(1000, 120000) for _ in range(rng.randint(4, 200))],
         SamplingParams(temperature=0, max_tokens=rng.randint(20, 60), ignore_eos=True))
        for _ in range(10)
    ]  # fmt: skip


def test_engine_with_the_kernel_matches_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.kernels import _triton_skinny_gemm

    loaded = _build(kernel_ops())
    calls = []
    launch = _triton_skinny_gemm.skinny_linear_triton
    monkeypatch.setattr(_triton_skinny_gemm, "skinny_linear_triton", lambda *a: calls.append(1) or launch(*a))
    monkeypatch.delenv(STAGED_ENV, raising=False)
    ref = run(_engine(loaded, graph_miss_policy="capture"), _work(0))
    assert not calls
    monkeypatch.setenv(STAGED_ENV, "skinny_gemm")
    engine = _engine(loaded, graph_miss_policy="capture")
    got: Record = run(engine, _work(0), forced=ref)
    assert got.graph_steps > 50 and calls
    compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    flips = sum(got.argmax[k] != ref.argmax[k] for k in ref.argmax)
    report("skinny_gemm engine bf16 argmax flips vs cuBLAS", f"{flips} of {len(ref.argmax)}")
    eager = run(_engine(loaded, disable_cudagraph=True), _work(1))
    graphed = run(_engine(loaded, graph_miss_policy="capture"), _work(1), forced=eager)
    compare(eager, graphed, tie=0.3, logit_tol=0.3, min_agree=0.93)
