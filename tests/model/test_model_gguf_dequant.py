"""The torch dequantization (what runs on a CUDA device) is bit-identical to the gguf library's on the CPU for
every format it covers; the reader over a plain view of the map reads what gguf's own reader reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from gguf_blocks import assert_bits_equal, block_shape, random_blocks
from graphpool.model.gguf_dequant import TORCH_TYPES, dequantize
from graphpool.model.gguf_loader import dequantize_tensor, open_gguf

# NOTE: random scales include NaN and infinity; the library's numpy multiply warns about them.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
Q = gguf.GGMLQuantizationType
@pytest.mark.parametrize("qtype", sorted(TORCH_TYPES, key=lambda q: q.name), ids=lambda q: q.name)
def test_torch_dequantize_is_bit_identical_to_gguf(qtype: Q) -> None:
    for seed in range(3):
        blocks = random_blocks(qtype, seed)
        ref = gguf.quants.dequantize(blocks, qtype)
        ours = dequantize(torch.from_numpy(blocks.view(np.uint8).copy()), qtype, block_shape(qtype))
        assert_bits_equal(ours, ref)


def test_torch_dequantize_refuses_partial_blocks() -> None:
    with pytest.raises(ValueError, match="whole number"):
        dequantize(torch.zeros(36, dtype=torch.uint8), Q.Q4_1, (2, 16))


def test_written_file_dequantizes_like_gguf(tmp_path: Path) -> None:
    """Tensors of a GGUF file through `dequantize_tensor`: the torch path on the CPU (as a CUDA device runs it)
    and the loader's CPU path both equal the library, library-only formats (TQ2_0) included."""
    rng = np.random.default_rng(0)
    path = tmp_path / "mixed.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    kinds = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.TQ2_0]
    for i, qtype in enumerate(kinds):
        values = rng.standard_normal((4, 256)).astype(np.float32)
        w.add_tensor(f"t{i}.weight", gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    for qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):  # no Python quantizer: random blocks
        blocks = random_blocks(qtype, 1)
        w.add_tensor(f"{qtype.name}.weight", blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    reader = open_gguf(path)
    assert {t.tensor_type for t in reader.tensors} >= set(kinds) - {Q.F32}  # the writer may store F32 plainly
    for t in reader.tensors:
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        assert_bits_equal(dequantize_tensor(t, "cpu"), ref.reshape(dequantize_tensor(t).shape))
        if t.tensor_type in TORCH_TYPES:
            shape = tuple(reversed(t.shape.tolist()))
            raw = torch.from_numpy(t.data.reshape(-1).view(np.uint8))
            assert_bits_equal(dequantize(raw, t.tensor_type, shape), ref.reshape(shape))


def assert_same_fields(ours: Any, theirs: Any) -> None:
    """Every field as the library builds it: contents, types, data indices and the bytes of every part."""
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert mine.contents() == field.contents(), key
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data), key
        assert [p.tobytes() for p in mine.parts] == [p.tobytes() for p in field.parts], key


def test_reader_reads_what_gguf_reads(default_gguf_reader: tuple[object, object]) -> None:
    ours, theirs = default_gguf_reader
    assert len(ours.fields["tokenizer.ggml.tokens"].contents()) == 49152
    assert_same_fields(ours, theirs)
    assert [(t.name, t.tensor_type, t.data_offset) for t in ours.tensors] == [
        (t.name, t.tensor_type, t.data_offset) for t in theirs.tensors
    ]
    for a, b in zip(ours.tensors[:8], theirs.tensors[:8], strict=True):
        assert np.array_equal(a.data, b.data) and type(a.data) is np.ndarray


def test_reader_reads_every_array_kind_as_gguf_does(tmp_path: Path) -> None:
    path = tmp_path / "arrays.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("a.strings", ["", "a", "\u00e9t\u00e9", "x" * 300])
    w.add_array("a.empty", [])
    w.add_array("a.ints", [1, -2, 3])
    w.add_array("a.floats", [0.5, -1.25])
    w.add_array("a.bools", [True, False, True])
    w.add_array("a.nested", [[1, 2], [3]])
    w.add_string("s", "plain")
    w.add_uint32("u", 7)
    w.add_tensor("t.weight", np.ones((2, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours, theirs = open_gguf(path), gguf.GGUFReader(str(path))
    assert ours.fields["a.strings"].contents() == ["", "a", "\u00e9t\u00e9", "x" * 300]
    assert ours.fields["a.ints"].contents() == [1, -2, 3]
    assert_same_fields(ours, theirs)
    assert np.array_equal(ours.tensors[0].data, theirs.tensors[0].data)


def test_default_model_tensors_torch_path_equals_gguf(default_gguf_reader: tuple[object, object]) -> None:
    """The embedded model's formats (F32, Q4_1, Q8_0), one tensor of each through the torch path."""
    reader, _ = default_gguf_reader
    first = {}
    for t in reader.tensors:
        first.setdefault(t.tensor_type, t)
    assert set(first) >= {Q.F32, Q.Q4_1, Q.Q8_0}
    for qtype, t in first.items():
        shape = tuple(reversed(t.shape.tolist()))
        raw = torch.from_numpy(t.data.reshape(-1).view(np.uint8))
        assert_bits_equal(dequantize(raw, qtype, shape), gguf.quants.dequantize(t.data, qtype).reshape(shape))


@pytest.fixture(scope="module")
def default_gguf_reader() -> tuple[object, object]:
    from graphpool.model.gguf_loader import default_gguf_path

    path = default_gguf_path()
    return open_gguf(path), gguf.GGUFReader(str(path))
