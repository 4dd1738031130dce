"""A GGUF's Q4_0 / Q4_1 / Q4_K linear weights kept 4-bit on the CPU, and its Q8_0 LM head 8-bit.

A CPU decode step is bound by reading the weights: dequantized to float32 the default model's linear layers are
~420 MB a step. torch's int4 weight-only matmul for the CPU (`aten._weight_int4pack_mm_for_cpu`, bfloat16
activations, one bfloat16 scale and zero per 32 values along the input) reads ~4.5 bits a weight instead, and
the Q4 formats are that layout exactly: Q4_1's value `d * q + m` is `(q - 8) * d + (m + 8 d)`, Q4_0's `d * (q -
8)` the same with zero 0, and a Q4_K block is eight such groups, each with its own scale and min. Only the
scale and zero are rounded (to bfloat16, as a bfloat16 weight would be).
A Q8_0 LM head (the default model's tied embedding) goes through the same int4 kernel as two 4-bit weights:
a code c is 16 h + l with h = c >> 4 in [-8, 7] and l = c & 15, so c d = (h + 8 - 8) 16 d + ((l - 8) d + 8 d),
and the two products are added in float32 (torch's int8 matmul takes one scale a row, which a Q8_0 block's 32
values do not share; one int4 call over both halves side by side would round the logits to bfloat16 once,
tying the top two in a few rows of a hundred).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from graphpool.model.gguf_dequant import f16_at, k_scales, split_nibbles

GROUP = 32  # values per Q4 block: one scale and zero each
# NOTE: past this many rows torch's int4 kernel loses to a dense bfloat16 matmul (docs/benchmarks.md), so a
# prefill or a wide decode step multiplies by a bfloat16 copy of the weight
INT4_MAX_ROWS = 16
# NOTE: up to this many rows the head is about as fast as a bfloat16 copy (faster at one, and a whole step at
# four: it reads half the bytes), past it slower (docs/benchmarks.md, "4-bit weights on the CPU")
Q8_HEAD_MAX_ROWS = 4
INT4_ROWS_MULTIPLE = 16  # the int4 kernel's packing takes whole tiles of output rows
PACK_ROWS = 4096  # rows packed at a time: the packed rows do not depend on the rows around them
_FORMATS = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K)


def int4_matmul_available() -> bool:
    """Whether this torch has the CPU int4 matmul (torch 2.5 and later)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


@dataclass(frozen=True)
class Int4Blocks:
    """A weight as 4-bit codes: value = (code - 8) * scale + zero, one scale and zero per `GROUP` columns."""

    codes: torch.Tensor  # uint8 (rows, cols), 0..15
    scales: torch.Tensor  # float32 (rows, cols // GROUP)
    zeros: torch.Tensor  # float32 (rows, cols // GROUP)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Int4Blocks:
        """The same weight with `fn` (a function of a tensor's rows, e.g. a row permutation) applied to each part."""
        return Int4Blocks(fn(self.codes), fn(self.scales), fn(self.zeros))

    def dequantize(self) -> torch.Tensor:
        """float32 values (rows, cols): what the matmul multiplies by, before its bfloat16 rounding of scale and zero."""
        rows, cols = self.shape
        q = self.codes.reshape(rows, cols // GROUP, GROUP).float() - 8
        return (q * self.scales[..., None] + self.zeros[..., None]).reshape(rows, cols)


def int4_blocks(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> Int4Blocks | None:
    """A 2-D Q4_0 / Q4_1 / Q4_K tensor's raw bytes (uint8) as `Int4Blocks`; None for any other format or shape."""
    if qtype not in _FORMATS or len(shape) != 2 or shape[1] % GGML_QUANT_SIZES[qtype][0]:
        return None
    type_size = GGML_QUANT_SIZES[qtype][1]
    rows, cols = shape
    blocks = raw.reshape(-1, type_size)
    if qtype == GGMLQuantizationType.Q4_K:  # eight groups of 32 a block: value d q - m = (q - 8) d + (8 d - m)
        d, m = k_scales(blocks)
        codes = split_nibbles(blocks[:, 16:], 32).reshape(rows, cols)
        return Int4Blocks(codes, d.reshape(rows, cols // GROUP), (8 * d - m).reshape(rows, cols // GROUP))
    # Q4_0 / Q4_1: the scale (and min) in float16, then 16 bytes of nibbles
    d = f16_at(blocks, 0).reshape(rows, cols // GROUP)
    codes = split_nibbles(blocks[:, type_size - 16 :], 16).reshape(rows, cols)
    if qtype == GGMLQuantizationType.Q4_0:
        return Int4Blocks(codes, d, torch.zeros_like(d))
    m = f16_at(blocks, 2).reshape(rows, cols // GROUP)
    return Int4Blocks(codes, d, m + 8 * d)


def pack_int4(blocks: Int4Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """`blocks` in the CPU int4 kernel's layout: the packed codes, and (cols // GROUP, rows, 2) bfloat16 scale
    and zero of each group."""
    # NOTE: the packing takes int32 codes: a few thousand rows at a time, not 4 bytes a weight of a whole head
    packed = torch.cat([torch.ops.aten._convert_weight_to_int4pack_for_cpu(part.to(torch.int32), 1)
                        for part in blocks.codes.split(PACK_ROWS)])
    scales_zeros = torch.stack([blocks.scales, blocks.zeros], dim=-1).transpose(0, 1).contiguous()
    return packed, scales_zeros.to(torch.bfloat16)


class Int4Linear:
    """`x @ W.T + bias` for a `LinearFn` slot (`model.linear`): up to `INT4_MAX_ROWS` rows through torch's CPU
    int4 matmul (W packed once), more through a bfloat16 copy of W (the same values, scale and zero applied
    in float32 before one rounding). The weight argument it is called with (the layer's placeholder) is not
    read."""

    def __init__(self, blocks: Int4Blocks) -> None:
        self.out_features, self.in_features = blocks.shape
        self.packed, self.scales_zeros = pack_int4(blocks)
        self.dense = blocks.dequantize().to(torch.bfloat16)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > INT4_MAX_ROWS:
            return torch.nn.functional.linear(x, self.dense, bias)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if bias is None else out + bias


def int4_layers(model: torch.nn.Module | None) -> int:
    """How many of `model`'s linear layers multiply by 4-bit weights (0 for None)."""
    return 0 if model is None else sum(isinstance(getattr(m, "linear", None), Int4Linear) for m in model.modules())


@dataclass(frozen=True)
class Q8Blocks:
    """A Q8_0 weight: value = code * scale, one scale per `GROUP` columns."""

    codes: torch.Tensor  # int8 (rows, cols)
    scales: torch.Tensor  # float32 (rows, cols // GROUP)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def dequantize(self) -> torch.Tensor:
        """float32 values (rows, cols), the gguf library's to the bit (one rounding of code * scale)."""
        rows, cols = self.shape
        return (self.codes.reshape(rows, cols // GROUP, GROUP).float() * self.scales[..., None]).reshape(rows, cols)


def q8_blocks(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> Q8Blocks | None:
    """A 2-D Q8_0 tensor's raw bytes (uint8) as `Q8Blocks`; None for any other format or shape."""
    if qtype != GGMLQuantizationType.Q8_0 or len(shape) != 2 or shape[1] % GROUP:
        return None
    rows, cols = shape
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])  # the scale in float16, then 32 int8 codes
    scales = f16_at(blocks, 0).reshape(rows, cols // GROUP)
    return Q8Blocks(blocks[:, 2:].contiguous().view(torch.int8).reshape(rows, cols), scales)


def q8_as_int4(blocks: Q8Blocks, rows_multiple: int = 1) -> tuple[Int4Blocks, Int4Blocks]:
    """A Q8_0 weight as the sum of two 4-bit weights (the module's note): its high nibbles with scale 16 d and
    zero 0, and its low nibbles with scale d and zero 8 d; rows of zeros added up to a multiple of
    `rows_multiple`."""
    rows, _ = blocks.shape
    pad = -rows % rows_multiple
    codes = torch.nn.functional.pad(blocks.codes, (0, 0, 0, pad))
    scales = torch.nn.functional.pad(blocks.scales, (0, 0, 0, pad))
    high, low = (codes >> 4) + 8, codes & 15  # int8: an arithmetic shift, and two's complement's low nibble
    return (Int4Blocks(high.to(torch.uint8), 16 * scales, torch.zeros_like(scales)),
            Int4Blocks(low.to(torch.uint8), scales, 8 * scales))


class Q8Head:
    """The LM head's `hidden @ W.T` (float32 logits) for W in Q8_0 blocks, through torch's CPU int4 matmul
    (`q8_as_int4`, bfloat16 activations). It reads a byte a weight where a bfloat16 head reads two, for each
    row: the model uses it for up to `Q8_HEAD_MAX_ROWS` rows."""

    def __init__(self, blocks: Q8Blocks) -> None:
        self.rows, _ = blocks.shape
        self.halves = [pack_int4(half) for half in q8_as_int4(blocks, INT4_ROWS_MULTIPLE)]

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.to(torch.bfloat16)
        high, low = (torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros)
                     for packed, scales_zeros in self.halves)
        logits = high.float()
        logits += low  # NOTE: promoted to float32 as it is added: no float32 copy of it
        return logits[:, : self.rows]
