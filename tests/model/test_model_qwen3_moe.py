"""Qwen3-MoE: tiny random transformers models (its own Qwen3MoeConfig, saved with save_pretrained) loaded by
graphpool; logits, paged decode and the engine's greedy tokens equal transformers' `generate`, float32 on the
CPU. Two layouts: layer 1 dense by mlp_only_layers with renormalised top-k, and every second layer sparse by
decoder_sparse_step without renormalisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.model import ModelConfig, load_model
from graphpool.model.families import model_class
from graphpool.model.loader import model_config
from graphpool.model.parallel import check_shardable
from graphpool.model.qwen3_moe import Qwen3MoeModel, SparseMoe
from graphpool.pool.testing import EagerCapturer
from model_reference import paged_greedy, prefill_logits_match, run_waves, tiny_hf_model

NEW_TOKENS = 10
LAYOUTS = {
    "only-layer-1-dense": {},
    "sparse-step-2": {"decoder_sparse_step": 2, "mlp_only_layers": [], "norm_topk_prob": False},
}


def hf_generate(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy `generate` (the model has no end-of-text id: it runs n tokens)."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp(request.param)
    hf = tiny_hf_model("qwen3_moe", tied=False, eos_token_id=None, **LAYOUTS[request.param])
    hf.save_pretrained(folder, safe_serialization=True)
    return folder, hf


def test_config_and_layers_follow_transformers(saved: tuple[Path, torch.nn.Module]) -> None:
    folder, hf = saved
    raw = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig.from_hf_config(raw)
    assert cfg.family == "qwen3_moe" and model_class(cfg) is Qwen3MoeModel and cfg.moe is not None
    assert (cfg.moe.num_experts, cfg.moe.num_experts_per_tok, cfg.moe.moe_intermediate_size) == (8, 2, 48)
    assert cfg.moe.norm_topk_prob == hf.config.norm_topk_prob and cfg.sliding_window is None
    model, _, _ = load_model(folder)
    ours = [isinstance(layer.mlp, SparseMoe) for layer in model.layers]
    theirs = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf.model.layers]
    assert ours == theirs and any(ours) and not all(ours)
    assert cfg.num_params == sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in hf.parameters())


def test_logits_and_paged_decode_equal_transformers_generate(saved: tuple[Path, torch.nn.Module]) -> None:
    folder, hf = saved
    model, cfg, _ = load_model(folder, dtype=torch.float32)
    ids = prefill_logits_match(model, hf, cfg.vocab_size)  # prefill: the experts one by one
    prompts = [ids[:20].tolist(), ids[30:37].tolist(), ids[60:62].tolist()]
    assert paged_greedy(model, prompts, NEW_TOKENS, block_size=4) == [hf_generate(hf, p, NEW_TOKENS) for p in prompts]
    # one sequence: decode gathers its top-k experts (three decode with all experts, masked)
    assert paged_greedy(model, prompts[:1], NEW_TOKENS, block_size=4) == [hf_generate(hf, prompts[0], NEW_TOKENS)]


def test_engine_greedy_through_graphs_equals_transformers_generate(saved: tuple[Path, torch.nn.Module]) -> None:
    """The engine on the CPU, decode through its graph path (a CPU stand-in capturer: static buffers, padded
    rows, replays), float32: token for token transformers' greedy `generate`."""
    folder, hf = saved
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (3, 11, 26, 40)]
    config = EngineConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=128, num_kv_blocks=64,
                          graph_miss_policy="capture", graph_warmup="none")
    engine = LLMEngine(config, capturer=EagerCapturer())
    got = run_waves(engine, prompts, [[0, 1, 2], [3]], NEW_TOKENS)
    stats = engine.graph_stats()
    assert stats is not None and stats.captures >= 1 and stats.hits + stats.padded_hits > 0, stats
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == hf_generate(hf, p, NEW_TOKENS), i


def test_stacked_and_sharded_checkpoints_load_the_same(saved: tuple[Path, torch.nn.Module],
                                                        tmp_path: Path) -> None:
    """transformers' in-memory names (experts stacked [E, ...]) and a checkpoint sharded over several files
    load the same weights as the per-expert one."""
    folder, hf = saved
    want, _, _ = load_model(folder)
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    (stacked / "config.json").write_text((folder / "config.json").read_text())
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    save_file(state, str(stacked / "model.safetensors"))
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    assert len(list(sharded.glob("*.safetensors"))) > 1
    for other in (stacked, sharded):
        got, _, _ = load_model(other)
        for (name, a), (_, b) in zip(want.state_dict().items(), got.state_dict().items(), strict=True):
            assert torch.equal(a, b), (other.name, name)


def test_missing_or_extra_experts_are_refused(saved: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = saved[0]
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    sparse = next(k for k in state if ".mlp.experts.7.up_proj." in k)
    save_file({k: v for k, v in state.items() if k != sparse}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"not found in the weights: .*mlp\.experts\.gate_up_proj"):
        load_model(tmp_path)
    extra = sparse.replace(".experts.7.", ".experts.8.")
    save_file({**state, extra: state[sparse].clone()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="holds 8 experts; the weights have expert 8"):
        load_model(tmp_path)


def test_tensor_parallel_is_refused(saved: tuple[Path, torch.nn.Module]) -> None:
    cfg = model_config(saved[0])
    check_shardable(cfg, 1)
    with pytest.raises(ValueError, match="tensor parallel does not support mixture-of-experts"):
        check_shardable(cfg, 2)
