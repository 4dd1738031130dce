"""The fused SwiGLU silu(gate) * up on the GPU: against the torch reference (bitwise expected, one or two
output ulps tolerated), in a CUDA graph, and inside the engine (random llama3.2-1b) against the unfused ops.

The bitwise tests check the claim of `graphpool.kernels.silu_mul` (torch's op order, expf and IEEE division);
the default decision rests on the tolerance tests and the engine comparisons.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_engine_gpu import MAX_MODEL_LEN, PRESET, Record, compare, make, run, workload
from test_kernels_silu_mul import ulp_distance

from graphpool.kernels.silu_mul import silu_mul, silu_mul_ref, silu_mul_unchecked
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.llama import LlamaModel
from graphpool.model.loader import model_source
from graphpool.model.ops import ModelOps, kernel_ops
from graphpool.model.weights import init_random_weights

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# tolerance: one ulp of the rounded silu can move the product by up to two output ulps; fp32 a few ulps
MAX_ULP = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4}
SHAPES = [(1, 8192), (7, 8192), (64, 8192), (512, 8192), (1, 14336), (64, 14336), (7, 1000), (64, 3)]


def make_input(tokens: int, inter: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(tokens, 2 * inter, device="cuda", generator=gen) * 4).to(dtype)
    # exp over/underflow, signed zeros, a subnormal gate, large products
    edge = [0.0, -0.0, -90.0, 90.0, -1e4, 1e-40 if dtype != torch.float16 else 1e-7, 30.0, -30.0]
    n = min(len(edge), inter)
    x[0, :n] = torch.tensor(edge[:n], device="cuda").to(dtype)
    return x


def report(out: torch.Tensor, ref: torch.Tensor) -> str:
    d = ulp_distance(out, ref)
    return f"max {int(d.max())} ulp, {float((d == 0).float().mean()):.6f} bitwise"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "inter"), SHAPES)
def test_kernel_matches_reference_within_tolerance(tokens: int, inter: int, dtype: torch.dtype) -> None:
    x = make_input(tokens, inter, dtype, seed=tokens + inter)
    out, ref = silu_mul(x), silu_mul_ref(x)
    assert out.shape == (tokens, inter) and out.dtype == dtype and out.is_cuda
    assert not torch.isnan(out).any()
    assert int(ulp_distance(out, ref).max()) <= MAX_ULP[dtype], report(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_is_bitwise_the_reference(dtype: torch.dtype) -> None:
    for i, (tokens, inter) in enumerate(SHAPES):
        x = make_input(tokens, inter, dtype, seed=100 + i)
        out, ref = silu_mul(x), silu_mul_ref(x)
        assert torch.equal(out, ref), f"{tokens}x{inter} {dtype}: {report(out, ref)}"


@pytest.mark.parametrize("block", [128, 256, 2048])
def test_tile_size_and_strided_rows_do_not_change_the_result(block: int) -> None:
    from graphpool.kernels._triton_silu_mul import silu_mul_triton

    wide = make_input(9, 1100, torch.bfloat16, seed=block)
    view = wide[:, : 2 * 1000]  # row stride 2200: read in place
    assert torch.equal(silu_mul_triton(view, block=block), silu_mul_triton(view.contiguous()))
    x3 = wide[:8].reshape(2, 4, 2200)
    assert torch.equal(silu_mul(x3), silu_mul(wide[:8]).view(2, 4, 1100))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_graph_replay_equals_eager(dtype: torch.dtype) -> None:
    static = make_input(64, 8192, dtype, seed=1)
    silu_mul(static)  # JIT-compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = silu_mul(static)
    for seed in (2, 3):
        static.copy_(make_input(64, 8192, dtype, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, silu_mul(static))
        assert int(ulp_distance(out, silu_mul_ref(static)).max()) <= MAX_ULP[dtype]


def unfused_ops() -> ModelOps:
    return dataclasses.replace(kernel_ops(), silu_mul=silu_mul_unchecked)


def build(dtype: torch.dtype, ops: ModelOps):
    """What load_model builds for the random preset (same seed: same weights), with the given op set."""
    config = model_source(PRESET)
    assert not isinstance(config, tuple)
    model = LlamaModel(config, device="cuda", dtype=dtype, max_positions=MAX_MODEL_LEN, ops=ops)
    init_random_weights(model, seed=0)
    return model.eval(), config, None


def test_model_uses_the_fused_kernel_and_prefill_logits_match_bitwise() -> None:
    fused, unfused = build(torch.bfloat16, kernel_ops())[0], build(torch.bfloat16, unfused_ops())[0]
    assert fused.layers[0].mlp.ops.silu_mul is silu_mul
    assert unfused.layers[0].mlp.ops.silu_mul is silu_mul_unchecked
    assert torch.equal(fused.embed_tokens.weight, unfused.embed_tokens.weight)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1000, 120000, (300,), generator=gen).cuda()
    meta = AttentionMetadata(True, torch.arange(300, device="cuda"), torch.arange(300, device="cuda") + 16,
                             seq_lens=[300])  # fmt: skip
    logits = []
    with torch.no_grad():
        for model in (fused, unfused):
            kv = model.allocate_kv_caches(32, 16)
            logits.append(model.compute_logits(model(tokens, meta, kv)))
    diff = (logits[0] - logits[1]).abs().max().item()
    assert torch.equal(logits[0], logits[1]), f"prefill logits differ by up to {diff}"


def test_engine_greedy_output_fp32_is_exact() -> None:
    """fp32, CUDA-graph decode (the default engine): fused and unfused give the same tokens and logits."""
    work = workload(3)
    records: list[Record] = []
    for ops in (unfused_ops(), kernel_ops()):
        engine = make(build(torch.float32, ops), "float32", graph_miss_policy="capture")
        records.append(run(engine, work))
        assert records[-1].graph_steps > 50
        del engine
    ref, got = records
    assert got.outputs == ref.outputs
    assert got.argmax == ref.argmax and got.chosen_logit == ref.chosen_logit


@pytest.fixture(scope="module")
def bf16_pair():
    return build(torch.bfloat16, unfused_ops()), build(torch.bfloat16, kernel_ops())


def test_engine_greedy_bf16_fused_matches_unfused(bf16_pair) -> None:
    """Teacher-forced (see test_engine_gpu): argmaxes agree except at near-ties, chosen logits close."""
    unfused, fused = bf16_pair
    work = workload(4)
    ref = run(make(unfused, "bfloat16"), work)
    got = run(make(fused, "bfloat16"), work, forced=ref)
    assert got.graph_steps > 50
    compare(ref, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    flips = sum(got.argmax[k] != ref.argmax[k] for k in ref.argmax)
    # NOTE: a bitwise kernel gives identical logits; printed so the run shows which case held
    print(f"bf16 fused vs unfused: {flips} argmax flips of {len(ref.argmax)}")


def test_engine_graph_decode_equals_eager_with_the_fused_kernel(bf16_pair) -> None:
    _, fused = bf16_pair
    eager = run(make(fused, "bfloat16", disable_cudagraph=True), workload(5))
    engine = make(fused, "bfloat16", graph_miss_policy="capture")
    got = run(engine, workload(5), forced=eager)
    compare(eager, got, tie=0.3, logit_tol=0.3, min_agree=0.93)
    stats = engine.graph_stats()
    assert stats is not None and stats.hits + stats.padded_hits > 50 and got.graph_steps > 50
