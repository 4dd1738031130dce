"""Hub ids (`org/name[@revision]`) resolve through huggingface_hub's cache: a cache laid out as the hub lays
it out (models--org--name/refs, snapshots/<commit>) and HF_HUB_OFFLINE=1, since tests have no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_model_hf import _save_tiny

from graphpool.model.hub import HubRef, parse_hub_id
from graphpool.model.loader import load_model, model_config

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-llama"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding REPO at COMMIT (refs/main), with a tokenizer; plus an unrelated *.bin file that
    allow_patterns must leave alone."""
    from graphpool.model.gguf_loader import default_gguf_path
    from graphpool.model.tokenizer import tokenizer_from_gguf

    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--acme--tiny-llama"
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    _save_tiny("llama", snap, tied=True)
    tokenizer_from_gguf(default_gguf_path(), None, ()).hf.save_pretrained(snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_parse_hub_id() -> None:
    assert parse_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct") == HubRef("HuggingFaceTB/SmolLM2-135M-Instruct", None)
    assert parse_hub_id("Qwen/Qwen3-0.6B@v1.0") == HubRef("Qwen/Qwen3-0.6B", "v1.0")
    for not_hub in ("random:llama3.2-1b", "./a/b", "/abs/path", "model.gguf", "a/b/c", "~/x/y", "smollm2"):
        assert parse_hub_id(not_hub) is None, not_hub


def test_hub_id_loads_the_cached_snapshot_offline(hub_cache: Path, offline: None) -> None:
    snap = hub_cache / "models--acme--tiny-llama" / "snapshots" / COMMIT
    model, config, tok = load_model(REPO, download_dir=str(hub_cache))
    ref_model, ref_config, _ = load_model(snap)
    assert config == ref_config and tok is not None
    ids = torch.tensor([[1, 5, 9, 42]])
    with torch.no_grad():
        for name, p in model.state_dict().items():
            assert torch.equal(p, ref_model.state_dict()[name]), name
    assert model_config(f"{REPO}@{COMMIT}", download_dir=str(hub_cache)) == ref_config
    assert model_config(REPO, revision=COMMIT, download_dir=str(hub_cache)) == ref_config
    assert ids.shape == (1, 4)


def test_hub_errors_are_one_clear_line(hub_cache: Path, offline: None) -> None:
    with pytest.raises(ValueError, match="not in the Hugging Face cache and the hub cannot be reached"):
        model_config("acme/not-there", download_dir=str(hub_cache))
    with pytest.raises(ValueError, match="not in the Hugging Face cache"):
        model_config(REPO, revision="v9", download_dir=str(hub_cache))
    with pytest.raises(ValueError, match="disagree"):
        model_config(f"{REPO}@main", revision="v9", download_dir=str(hub_cache))


def test_quantized_checkpoint_is_refused(tmp_path: Path) -> None:
    _save_tiny("llama", tmp_path, tied=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"quantized checkpoints are not supported.*awq"):
        load_model(tmp_path)


def test_generate_with_a_hub_id_offline_and_a_missing_one(hub_cache: Path, tmp_path: Path) -> None:
    """The CLI path end to end with HF_HUB_OFFLINE=1 in the environment; a missing model is one line on
    stderr and exit status 2, no traceback."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    base = [sys.executable, "-m", "graphpool.cli", "generate", "--prompt", "a b", "--max-tokens", "3", "--device", "cpu",
            "--no-progress", "--max-model-len", "256", "--download-dir", str(hub_cache)]
    ok = subprocess.run([*base, "--model", REPO], env=env, capture_output=True, text=True, timeout=None)
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = subprocess.run([*base, "--model", "acme/not-there"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    errors = [line for line in bad.stderr.splitlines() if line.startswith("graphpool generate:")]
    assert len(errors) == 1 and "not in the Hugging Face cache" in errors[0]


def test_mistral_context_runs_past_its_window(tmp_path: Path) -> None:
    """A Mistral window leaves the context whole: max_model_len defaults to max_position_embeddings, past
    which it is refused."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    hf = MistralForCausalLM(MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                          sliding_window=64, tie_word_embeddings=False)).eval()
    hf.save_pretrained(tmp_path)
    assert model_config(tmp_path).sliding_window == 64
    model, _, _ = load_model(tmp_path)
    assert model.max_positions == 256
    assert [layer.self_attn.window for layer in model.layers] == [64, 64]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        load_model(tmp_path, max_positions=257)


def test_generation_config_eos_ids_join_the_models(tmp_path: Path) -> None:
    """An instruct model's turn-end token listed only in generation_config.json still ends generation."""
    _save_tiny("llama", tmp_path, tied=True)
    assert model_config(tmp_path).eos_token_ids == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7], "bos_token_id": 1}))
    assert model_config(tmp_path).eos_token_ids == (2, 7)
    _, config, _ = load_model(tmp_path)
    assert config.eos_token_ids == (2, 7)


def test_serve_with_a_missing_hub_id_is_one_line(hub_cache: Path, tmp_path: Path) -> None:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    bad = subprocess.run([sys.executable, "-m", "graphpool.cli", "serve", "--model", "acme/not-there", "--device", "cpu",
                          "--port", "0", "--download-dir", str(hub_cache)], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    errors = [line for line in bad.stderr.splitlines() if line.startswith("graphpool serve:")]
    assert len(errors) == 1 and "not in the Hugging Face cache" in errors[0], bad.stderr[-2000:]
