"""Model loading on the GPU: GGUF blocks dequantized on the device bit-identical to the gguf library on the CPU,
the default model's CUDA weights equal to its CPU weights, random presets seeded on the device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gpu_helpers import require

from gguf_blocks import assert_bits_equal, block_shape, random_blocks
from graphpool.model import load_model
from graphpool.model.gguf_dequant import TORCH_TYPES, dequantize

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("qtype", sorted(TORCH_TYPES, key=lambda q: q.name), ids=lambda q: q.name)
def test_cuda_dequantize_is_bit_identical_to_gguf(qtype: object) -> None:
    gguf = require("gguf")
    for seed in range(3):
        blocks = random_blocks(qtype, seed)  # type: ignore[arg-type]
        raw = torch.from_numpy(blocks.view(np.uint8).copy()).cuda()
        ours = dequantize(raw, qtype, block_shape(qtype))  # type: ignore[arg-type]
        assert ours.device.type == "cuda"
        assert_bits_equal(ours, gguf.quants.dequantize(blocks, qtype))


def test_default_model_cuda_weights_equal_cpu_weights(default_gguf: Path) -> None:
    """float32: every parameter bit for bit (the device path against the library's); bfloat16: the same
    values rounded once."""
    require("gguf")
    cpu, cfg, tok = load_model(default_gguf, "cpu", torch.float32, max_positions=256)
    cuda, cuda_cfg, cuda_tok = load_model(default_gguf, "cuda", torch.float32, max_positions=256)
    bf16, _, _ = load_model(default_gguf, "cuda", torch.bfloat16, max_positions=256)
    assert cfg == cuda_cfg and tok is not None and cuda_tok is not None
    assert cuda_tok.encode("Hello, world") == tok.encode("Hello, world")
    want = dict(cpu.named_parameters())
    for name, p in cuda.named_parameters():
        assert p.device.type == "cuda"
        assert torch.equal(p.cpu(), want[name]), name
    for name, p in bf16.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p.cpu(), want[name].to(torch.bfloat16)), name


def test_random_preset_is_seeded_on_the_device() -> None:
    """The same seed gives the same weights, another seed others; the CPU's generator is never drawn from."""
    cpu_state = torch.get_rng_state()
    name = "random:llama3.2-1b?layers=2"
    a, _, _ = load_model(name, "cuda", torch.bfloat16, seed=0, max_positions=256)
    b, _, _ = load_model(name, "cuda", torch.bfloat16, seed=0, max_positions=256)
    c, _, _ = load_model(name, "cuda", torch.bfloat16, seed=1, max_positions=256)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    for (name_a, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert pa.device.type == "cuda" and torch.isfinite(pa).all(), name_a
        assert torch.equal(pa, pb), name_a
        if "norm" not in name_a:
            assert not torch.equal(pa, pc), name_a
