"""Random GGML blocks and a bitwise float comparison: the dequantization tests on the CPU and on the GPU."""

from __future__ import annotations

import gguf
import numpy as np
import torch

ROWS = 6
BLOCKS_PER_ROW = 3


def random_blocks(qtype: gguf.GGMLQuantizationType, seed: int) -> np.ndarray:
    """(ROWS, bytes per row) random bytes: every bit pattern, NaN and infinite scales included."""
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(ROWS, BLOCKS_PER_ROW * type_size), dtype=np.uint8)
    if qtype == gguf.GGMLQuantizationType.F32:
        return raw.view(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16)
    return raw


def block_shape(qtype: gguf.GGMLQuantizationType) -> tuple[int, int]:
    """The dequantized shape of `random_blocks(qtype, ...)`."""
    return ROWS, BLOCKS_PER_ROW * gguf.GGML_QUANT_SIZES[qtype][0]


def assert_bits_equal(ours: torch.Tensor, ref: np.ndarray | torch.Tensor) -> None:
    """Same NaN positions, the same 32 bits everywhere else (signed zeros and infinities included)."""
    theirs = ref if isinstance(ref, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32))
    ours = ours.cpu()
    assert ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape
    nan = torch.isnan(theirs)
    assert torch.equal(torch.isnan(ours), nan)
    assert torch.equal(ours[~nan].view(torch.int32), theirs[~nan].view(torch.int32))
