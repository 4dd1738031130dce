"""`bench trace --model` takes what the engine takes: random presets, the default model, GGUF files, HF folders."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from graphpool.bench.trace.config import TraceBenchConfig, model_architecture
from graphpool.bench.trace.run import config_from_args
from graphpool.cli import build_parser
from graphpool.model.gguf_loader import default_gguf_path

KV_GIB = 0.01
# float32 on the CPU, 16-token blocks: K and V of every layer
SMOLLM2_BLOCK_BYTES = 2 * 30 * 16 * 3 * 64 * 4  # SmolLM2-135M: 30 layers, 3 KV heads of 64


def _trace_args(model: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "trace", "--model", model, "--device", "cpu"])


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gguf-path"])
def test_the_default_model_and_a_gguf_path_size_the_kv_cache_from_their_own_architecture(model: str) -> None:
    name = str(default_gguf_path()) if model == "gguf-path" else model
    cfg = config_from_args(_trace_args(name))
    assert cfg.model == name
    engine_cfg = TraceBenchConfig(model=cfg.model, device="cpu", kv_gib=KV_GIB).engine_config({})
    assert engine_cfg.model == name
    # NOTE: a GGUF on the CPU runs in bfloat16 (4-bit weights): half the float32 block
    assert engine_cfg.int4_weights and engine_cfg.num_kv_blocks == int(KV_GIB * (1 << 30)) // (SMOLLM2_BLOCK_BYTES // 2)


def test_a_hugging_face_folder_is_read_from_its_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 2,
    }))
    arch = model_architecture(str(tmp_path))
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (5, 2, 32)
    blocks = TraceBenchConfig(model=str(tmp_path), device="cpu", kv_gib=KV_GIB).engine_config({}).num_kv_blocks
    assert blocks == int(KV_GIB * (1 << 30)) // (2 * 5 * 16 * 2 * 32 * 4)


def test_random_presets_still_work_and_an_unknown_model_is_refused_with_what_is_accepted() -> None:
    assert model_architecture("random:llama3.2-1b").num_layers == 16
    for bad in ("random:no-such-preset", "no-such-model.gguf"):
        with pytest.raises(ValueError, match=r"unknown model .*accepted models: 'smollm2-135m-instruct'"):
            TraceBenchConfig(model=bad, device="cpu").engine_config({})
