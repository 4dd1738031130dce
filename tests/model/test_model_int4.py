"""4-bit GGUF linear weights on the CPU (model/int4.py): the Q4 blocks as codes, scales and zeros hold the
library's values, the int4 matmul computes the float matmul within bfloat16's rounding, and the engine's
config picks them only where they apply."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.model.int4 import (
    INT4_MAX_ROWS,
    PACK_ROWS,
    Int4Blocks,
    Int4Linear,
    Q8Head,
    int4_blocks,
    int4_layers,
    int4_matmul_available,
    pack_int4,
    q8_as_int4,
    q8_blocks,
)
from graphpool.model.loader import load_model
from graphpool.model.weights import WeightLoader

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not int4_matmul_available(), reason="this torch has no CPU int4 matmul")


def _q4(qtype: Q, rows: int = 48, cols: int = 96, seed: int = 0) -> tuple[Int4Blocks, np.ndarray]:
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw = gguf.quants.quantize(values, qtype)
    blocks = int4_blocks(torch.from_numpy(raw.view(np.uint8).copy()), qtype, (rows, cols))
    assert blocks is not None
    return blocks, gguf.quants.dequantize(raw, qtype)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_blocks_hold_the_librarys_values(qtype: Q) -> None:
    blocks, ref = _q4(qtype)
    assert blocks.codes.dtype == torch.uint8 and int(blocks.codes.max()) <= 15
    ours = blocks.dequantize().numpy()
    if qtype == Q.Q4_0:  # zero 0: (q - 8) * d is the library's d * (q - 8)
        np.testing.assert_array_equal(ours, ref)
    else:  # (q - 8) * d + (m + 8 d) against d * q + m: float32 rounding only
        np.testing.assert_allclose(ours, ref, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(ref).max())


def test_q8_blocks_hold_the_librarys_values_and_the_head_multiplies_by_them() -> None:
    values = np.random.default_rng(4).standard_normal((300, 96)).astype(np.float32)
    raw = gguf.quants.quantize(values, Q.Q8_0)
    blocks = q8_blocks(torch.from_numpy(raw.view(np.uint8).copy()), Q.Q8_0, (300, 96))
    assert blocks is not None
    ref = gguf.quants.dequantize(raw, Q.Q8_0)
    np.testing.assert_array_equal(blocks.dequantize().numpy(), ref)
    # the head's form: high then low nibbles along the input, their sum the values exactly; padded rows zero
    high, low = (half.dequantize() for half in q8_as_int4(blocks, rows_multiple=16))
    assert high.shape == low.shape == (304, 96) and not high[300:].any() and not low[300:].any()
    np.testing.assert_array_equal((high[:300] + low[:300]).numpy(), ref)
    hidden = torch.randn(5, 96, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    logits = Q8Head(blocks)(hidden)
    exact = hidden.double() @ torch.from_numpy(ref).double().T
    bf16 = torch.nn.functional.linear(hidden, torch.from_numpy(ref).to(torch.bfloat16)).double()
    assert logits.dtype == torch.float32 and logits.shape == (5, 300)
    # NOTE: each half's product comes back in bfloat16 (added in float32): a bfloat16 head's error class
    assert (logits.double() - exact).abs().max() <= 2 * (bf16 - exact).abs().max()
    assert q8_blocks(torch.from_numpy(raw.view(np.uint8).copy()), Q.Q4_0, (300, 96)) is None


def test_other_formats_and_shapes_are_not_blocks() -> None:
    raw = torch.zeros(2 * 34, dtype=torch.uint8)
    assert int4_blocks(raw, Q.Q8_0, (2, 32)) is None
    assert int4_blocks(torch.zeros(3 * 20, dtype=torch.uint8), Q.Q4_1, (3, 20)) is None  # not whole blocks
    assert int4_blocks(torch.zeros(20, dtype=torch.uint8), Q.Q4_1, (32,)) is None  # not a matrix


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("leading", [(3, 5), (2, INT4_MAX_ROWS)], ids=["int4-kernel", "bfloat16-copy"])
def test_int4_matmul_is_the_float_matmul_within_bfloat16(qtype: Q, leading: tuple[int, int]) -> None:
    """Up to INT4_MAX_ROWS rows through the int4 kernel, more through the bfloat16 copy: both within a
    bfloat16 weight's error."""
    blocks, ref = _q4(qtype, rows=80, cols=128, seed=1)
    linear = Int4Linear(blocks)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(*leading, 128, generator=gen).to(torch.bfloat16)  # any leading shape
    bias = torch.randn(80, generator=gen).to(torch.bfloat16)
    exact = x.double() @ torch.from_numpy(ref).double().T + bias.double()
    out = linear(x, torch.empty(0), bias)
    assert out.shape == (*leading, 80) and out.dtype == torch.bfloat16
    # NOTE: the same bound as the bfloat16 weights' own matmul would meet (scale and zero rounded to bfloat16)
    bf16 = torch.nn.functional.linear(x, torch.from_numpy(ref).to(torch.bfloat16), bias)
    err, err_bf16 = (out.double() - exact).abs().max(), (bf16.double() - exact).abs().max()
    assert err <= 2 * err_bf16 and err < 0.02 * exact.abs().max()


def test_only_a_linear_weight_loads_4bit() -> None:
    model, _, _ = load_model("random:smollm2-135m?layers=1", "cpu", torch.bfloat16)
    blocks, _ = _q4(Q.Q4_1, rows=576, cols=576)
    with pytest.raises(ValueError, match="linear layer"):
        WeightLoader(model).load("model.layers.0.input_layernorm.weight", blocks)


def test_4bit_loading_needs_the_cpu_and_bfloat16() -> None:
    with pytest.raises(ValueError, match="4-bit weights need"):
        load_model(None, "cpu", torch.float32, int4=True)


def test_engine_config_picks_4bit_weights_for_a_gguf_on_the_cpu() -> None:
    default = EngineConfig(device="cpu")
    assert default.int4_weights is True and default.torch_dtype == torch.bfloat16
    # an explicit dtype, a random preset, several ranks: as before (float32 unless asked)
    assert EngineConfig(device="cpu", dtype="float32").int4_weights is False
    assert EngineConfig(device="cpu", dtype="bfloat16").int4_weights is False
    preset = EngineConfig(model="random:smollm2-135m", device="cpu")
    assert preset.int4_weights is False and preset.torch_dtype == torch.float32
    two_ranks = EngineConfig(device="cpu", tensor_parallel_size=2)  # NOTE: shards cut float weights
    assert two_ranks.int4_weights is False and two_ranks.torch_dtype == torch.float32
    with pytest.raises(ValueError, match="int4_weights needs"):
        EngineConfig(device="cpu", tensor_parallel_size=2, int4_weights=True)
    off = EngineConfig(device="cpu", int4_weights=False)
    assert off.torch_dtype == torch.float32
    assert EngineConfig(device="cpu", dtype="bfloat16", int4_weights=True).int4_weights is True
    with pytest.raises(ValueError, match="int4_weights needs"):
        EngineConfig(device="cpu", dtype="float32", int4_weights=True)


def test_the_default_model_loads_its_linear_layers_4bit_and_says_so() -> None:
    from types import SimpleNamespace

    from graphpool.server.startup_log import describe_startup

    model, config, _ = load_model(None, "cpu", torch.bfloat16, int4=True)
    assert int4_layers(model) == 4 * config.num_layers  # q|k|v, o, gate|up, down
    assert model.q8_head is not None  # the tied Q8_0 embedding as the LM head
    assert int4_layers(load_model("random:smollm2-135m?layers=1", "cpu", torch.bfloat16)[0]) == 0
    stats = SimpleNamespace(num_kv_blocks=4, num_free_kv_blocks=4)
    engine = SimpleNamespace(model=model, model_name="m", max_model_len=64, stats=lambda: stats,
                             graph_stats=lambda: None, graphs_off="no_cuda")
    line = describe_startup(engine, EngineConfig(device="cpu"), 1.0)[0]
    assert f"on cpu (bfloat16, {4 * config.num_layers} linear layers 4-bit)" in line



def test_q4_k_blocks_hold_the_librarys_values() -> None:
    """Q4_K (llama.cpp's Q4_K_M files are mostly it): each 256-value block is eight 32-value groups with a
    6-bit scale and min under the block's float16 ones, so the same codes, scale and zero layout."""
    from gguf_blocks import block_shape, random_blocks

    raw = random_blocks(Q.Q4_K, 3)
    fields = raw.reshape(-1, gguf.GGML_QUANT_SIZES[Q.Q4_K][1])
    scales = np.random.default_rng(4).uniform(1e-3, 1e-2, size=(fields.shape[0], 2)).astype(np.float16)
    fields[:, :4] = scales.view(np.uint8)  # NOTE: finite block scales (random bytes include NaN and infinity)
    shape = block_shape(Q.Q4_K)
    blocks = int4_blocks(torch.from_numpy(raw.copy()).reshape(-1), Q.Q4_K, shape)
    assert blocks is not None and int(blocks.codes.max()) <= 15
    ref = gguf.quants.dequantize(raw, Q.Q4_K)
    ours = blocks.dequantize().numpy()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=8 * np.finfo(np.float32).eps * np.abs(ref).max())
    assert int4_blocks(torch.from_numpy(raw.copy()).reshape(-1), Q.Q4_K, (shape[0] * 2, shape[1] // 2)) is None


@pytest.mark.skipif(not int4_matmul_available(), reason="this torch has no CPU int4 matmul")
def test_packing_a_few_thousand_rows_at_a_time_is_packing_all_at_once() -> None:
    rows = 2 * PACK_ROWS + 16  # whole chunks and a last one of one tile
    codes = torch.randint(0, 16, (rows, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    zeros = torch.zeros(rows, 2)
    packed, _ = pack_int4(Int4Blocks(codes, zeros, zeros))
    assert torch.equal(packed, torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1))
