"""Sliding-window families past their window: tiny random transformers models (eager attention, float32) with
windows of 8-16 positions; graphpool's paged decode and the engine (chunked prefill, graph decode) give
transformers' greedy tokens token for token over prompts and generations well past the window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.model import ModelConfig, load_model
from graphpool.pool.testing import EagerCapturer
from model_reference import hf_greedy, paged_greedy, run_waves, tiny_hf_model

# kind -> (tiny_hf_model overrides, the sliding layers graphpool should read)
CASES: dict[str, tuple[dict[str, Any], tuple[int, ...] | None]] = {
    "mistral": ({"sliding_window": 8}, None),  # every layer
    "phi3": ({"sliding_window": 12}, None),
    "gemma2": ({"sliding_window": 16}, (0, 2)),  # sliding, full, sliding
    "gemma3": ({"sliding_window": 10}, (0, 1)),  # sliding, sliding, full
    "qwen2": ({"use_sliding_window": True, "sliding_window": 9, "max_window_layers": 1}, (1,)),
}
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=list(CASES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    hf = tiny_hf_model(kind, tied=kind.startswith("gemma"), **CASES[kind][0])
    hf.set_attn_implementation("eager")
    hf.save_pretrained(folder, safe_serialization=True)
    return kind, folder, hf


def _prompts(lengths: tuple[int, ...]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in lengths]


def test_config_reads_the_window_and_its_layers(saved: tuple[str, Path, Any]) -> None:
    kind, folder, hf = saved
    cfg = ModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    overrides, layers = CASES[kind]
    assert cfg.sliding_window == overrides["sliding_window"] and cfg.sliding_layers == layers
    want = [overrides["sliding_window"] if t == "sliding_attention" else 0 for t in hf.config.layer_types] if (
        getattr(hf.config, "layer_types", None)) else [overrides["sliding_window"]] * cfg.num_layers
    assert [cfg.layer_window(i) for i in range(cfg.num_layers)] == want


def test_paged_decode_past_the_window_equals_transformers(saved: tuple[str, Path, Any]) -> None:
    """One batched prefill, then paged decode (block size 4: windows start mid-block) to 24 tokens past
    prompts shorter than, near and far past the window; full attention over the same weights gives other
    tokens, so the window is what makes them equal."""
    _, folder, hf = saved
    model, _, _ = load_model(folder, dtype=torch.float32, max_positions=256)
    prompts = _prompts((5, 19, 47))
    got = paged_greedy(model, prompts, NEW_TOKENS, block_size=4)
    for i, p in enumerate(prompts):
        assert got[i] == hf_greedy(hf, p, NEW_TOKENS), i
    for layer in model.layers:
        layer.self_attn.set_window(0)
    assert paged_greedy(model, prompts, NEW_TOKENS, block_size=4) != got


def test_engine_chunked_prefill_and_graph_decode_past_the_window(saved: tuple[str, Path, Any]) -> None:
    """The engine with max_model_len past the window (no longer capped there), a 16-token prefill budget (the
    prompts' later chunks resume over the paged cache) and decode through its graph path: transformers'
    tokens."""
    _, folder, hf = saved
    prompts = _prompts((3, 29, 61))
    config = EngineConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=128, num_kv_blocks=64,
                          max_num_batched_tokens=16, graph_miss_policy="capture", graph_warmup="none")
    engine = LLMEngine(config, capturer=EagerCapturer())
    got = run_waves(engine, prompts, [[0, 1, 2]], NEW_TOKENS)
    stats = engine.graph_stats()
    assert stats is not None and stats.hits + stats.padded_hits > 0, stats
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == hf_greedy(hf, p, NEW_TOKENS), i


def test_sliding_layers_need_a_window() -> None:
    base = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=2, num_kv_heads=2,
                head_dim=16)
    with pytest.raises(ValueError, match="sliding_layers"):
        ModelConfig(**base, sliding_layers=(0,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sliding_layers"):
        ModelConfig(**base, sliding_window=8, sliding_layers=(2,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sliding_window"):
        ModelConfig(**base, sliding_window=0)  # type: ignore[arg-type]
    cfg = ModelConfig(**base, sliding_window=8, sliding_layers=(1,))  # type: ignore[arg-type]
    assert (cfg.layer_window(0), cfg.layer_window(1)) == (0, 8)


def test_qwen_window_only_with_use_sliding_window() -> None:
    from graphpool.model.window_config import qwen_sliding_layers

    cfg = {"model_type": "qwen2", "num_hidden_layers": 4, "sliding_window": 32, "max_window_layers": 2}
    assert qwen_sliding_layers(cfg) == (None, None)
    assert qwen_sliding_layers({**cfg, "use_sliding_window": True}) == (32, (2, 3))
    assert qwen_sliding_layers({**cfg, "use_sliding_window": True, "max_window_layers": 4}) == (None, None)
    assert qwen_sliding_layers({**cfg, "model_type": "qwen3_moe", "use_sliding_window": True}) == (32, None)
