"""Hugging Face folder loading: tiny random transformers models saved as safetensors, logits compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphpool.model import load_model
from model_reference import hf_greedy, paged_greedy, prefill_logits_match, tiny_hf_model


def _save_tiny(kind: str, folder: Path, tied: bool) -> torch.nn.Module:
    model = tiny_hf_model(kind, tied)
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.mark.parametrize(("kind", "tied"), [("llama", False), ("llama", True), ("qwen2", True)])
def test_hf_folder_logits_match_transformers(kind: str, tied: bool, tmp_path: Path) -> None:
    hf = _save_tiny(kind, tmp_path, tied)
    model, cfg, tok = load_model(tmp_path, dtype=torch.float32)
    assert tok is None  # no tokenizer files saved
    assert cfg.attention_bias == (kind == "qwen2") and cfg.tie_word_embeddings == tied
    assert (cfg.rope_scaling is not None) == (kind == "llama")
    assert (model.lm_head is None) == tied
    if kind == "qwen2":
        assert model.layers[0].self_attn.qkv_proj.bias is not None
    # positions past original_max_position_embeddings exercise the llama3 frequency scaling
    ids = prefill_logits_match(model, hf, cfg.vocab_size)
    # and the paged decode path continues the same sequence as transformers would
    prompt = ids[:20].tolist()
    tokens = paged_greedy(model, [prompt], 8, block_size=4)[0]
    assert tokens == hf_greedy(hf, prompt, 8)


def test_hf_folder_errors_are_clear(tmp_path: Path) -> None:
    _save_tiny("llama", tmp_path, tied=False)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        load_model(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model_type"):
        load_model(tmp_path)


def test_hf_folder_missing_weight_is_reported(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _save_tiny("llama", tmp_path, tied=False)
    (file,) = tmp_path.glob("*.safetensors")
    tensors = load_file(str(file))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.1\.self_attn\.qkv_proj\.weight"):
        load_model(tmp_path)


def test_hf_folder_with_tokenizer(tmp_path: Path) -> None:
    from graphpool.model.gguf_loader import default_gguf_path
    from graphpool.model.tokenizer import tokenizer_from_gguf

    _save_tiny("llama", tmp_path, tied=True)
    path = default_gguf_path()
    tokenizer_from_gguf(path, None, ()).hf.save_pretrained(tmp_path)
    _, _, tok = load_model(tmp_path)
    assert tok is not None
    text = "Tokenizers from a folder work too."
    assert tok.decode(tok.encode(text)) == text
    assert 2 in tok.eos_token_ids
