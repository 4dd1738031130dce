"""Model families beyond Llama/Qwen2 (Qwen3, Phi-3, Gemma 2, Gemma 3, SmolLM3, OLMo 2, Granite): tiny random transformers models saved as safetensors
folders, loaded by graphpool; logits, paged decode and the engine's greedy tokens equal transformers'."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from gloo_ranks import run_ranks
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.model import AttentionMetadata, ModelConfig, load_model
from graphpool.model.config import GraniteScales
from graphpool.model.families import build_model, model_class
from graphpool.model.gemma2 import Gemma2Model
from graphpool.model.gemma3 import Gemma3Model
from graphpool.model.olmo2 import Olmo2Model
from graphpool.model.parallel import check_shardable, shard_model
from graphpool.model.qwen3 import Qwen3Model
from graphpool.model.tp_group import TPGroup
from graphpool.model.weights import init_random_weights
from graphpool.pool.testing import EagerCapturer
from model_reference import hf_greedy, paged_greedy, prefill_logits_match, run_waves, tiny_hf_model

FAMILIES = ["qwen3", "phi3", "gemma2", "gemma3", "smollm3", "olmo2", "granite"]
NEW_TOKENS = 10


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, torch.nn.Module]:
    """(kind, folder, transformers model) of one family, saved once per module (lm head tied for Gemmas
    and SmolLM3, as their checkpoints are, untied otherwise)."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = tiny_hf_model(request.param, tied=request.param.startswith(("gemma", "smollm3")))
    hf.save_pretrained(folder, safe_serialization=True)
    return request.param, folder, hf


def test_config_reads_the_family(saved: tuple[str, Path, torch.nn.Module]) -> None:
    kind, folder, _ = saved
    cfg = ModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    assert not cfg.attention_bias
    if kind == "qwen3":
        assert cfg.family == "qwen3" and cfg.head_dim == 32 and cfg.q_size == 128 != cfg.hidden_size
        assert cfg.sliding_window is None  # use_sliding_window is off
        assert model_class(cfg) is Qwen3Model
    elif kind == "gemma3":
        assert cfg.family == "gemma3" and model_class(cfg) is Gemma3Model and cfg.tie_word_embeddings
        assert cfg.local_layers == (0, 1) and cfg.local_rope_theta == 1e4 and cfg.rope_theta == 1e6
        assert cfg.rope_freq_factors == (8.0,) * 16 and cfg.query_pre_attn_scalar == 24 and cfg.sliding_window == 128
        assert cfg.sliding_layers == (0, 1)
        assert [layer.self_attn.window for layer in load_model(folder, max_positions=256)[0].layers] == [128, 128, 0]
        with pytest.raises(ValueError, match="tensor parallel does not support Gemma 3"):
            check_shardable(cfg, 2)
    elif kind == "gemma2":
        assert cfg.family == "gemma2" and model_class(cfg) is Gemma2Model and cfg.tie_word_embeddings
        assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (2.0, 3.0)
        assert cfg.query_pre_attn_scalar == 24 and cfg.sliding_window == 128 and cfg.rope_theta == 1e4
        assert cfg.local_rope_theta is None and cfg.head_dim == 32
        assert cfg.sliding_layers == (0, 2)
        assert [layer.self_attn.window for layer in load_model(folder, max_positions=256)[0].layers] == [128, 0, 128]
        with pytest.raises(ValueError, match="tensor parallel does not support Gemma 2"):
            check_shardable(cfg, 2)
    elif kind == "granite":
        assert cfg.family == "granite" and cfg.granite is not None and cfg.granite.logits_scaling == 8.0
        assert cfg.granite.attention_multiplier == 0.015625 and cfg.rope_theta == 1e7
    elif kind == "olmo2":
        assert cfg.family == "olmo2" and model_class(cfg) is Olmo2Model and cfg.head_dim == 16
        with pytest.raises(ValueError, match="tensor parallel does not support OLMo 2"):
            check_shardable(cfg, 2)
    elif kind == "smollm3":
        assert cfg.family == "llama" and cfg.nope_layers == (1, 3) and cfg.rope_theta == 2e6 and cfg.tie_word_embeddings
        assert cfg.sliding_window is None
        model = load_model(folder, max_positions=256)[0]
        assert [layer.self_attn.rotary is model.rotary for layer in model.layers] == [True, False, True, False]
    else:
        assert cfg.family == "llama" and cfg.head_dim == 16 and cfg.sliding_window == 200


def test_logits_and_paged_decode_equal_transformers(saved: tuple[str, Path, torch.nn.Module]) -> None:
    kind, folder, hf = saved
    model, cfg, _ = load_model(folder, dtype=torch.float32)
    assert isinstance(model, Qwen3Model) == (kind == "qwen3")
    assert isinstance(model, Gemma3Model) == (kind == "gemma3")
    assert isinstance(model, Gemma2Model) == kind.startswith("gemma")
    # every parameter counted (and loaded: load_model checks that every one was written)
    assert cfg.num_params == sum(p.numel() for p in model.parameters())
    ids = prefill_logits_match(model, hf, cfg.vocab_size)
    prompts = [ids[:20].tolist(), ids[30:37].tolist()]
    got = paged_greedy(model, prompts, NEW_TOKENS, block_size=4)
    assert got == [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


def test_gemma2_soft_caps_shape_the_logits(tmp_path: Path) -> None:
    """The caps are not idle in the Gemma 2 test model: without the attention cap graphpool's logits leave
    transformers', and the final cap folds logits past 3 into (-3, 3)."""
    hf = tiny_hf_model("gemma2", tied=True)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model, cfg, _ = load_model(tmp_path, dtype=torch.float32)
    ids = torch.randint(0, cfg.vocab_size, (60,), generator=torch.Generator().manual_seed(4))
    meta = AttentionMetadata(True, torch.arange(60), torch.arange(60) + 16, seq_lens=[60])
    uncapped = Gemma2Model(dataclasses.replace(cfg, attn_logit_softcapping=None), max_positions=128)
    uncapped.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        hidden = model(ids, meta, model.allocate_kv_caches(6, 16))
        ours, raw = model.compute_logits(hidden), hidden @ model.lm_head_weight.T
        off = uncapped.compute_logits(uncapped(ids, meta, uncapped.allocate_kv_caches(6, 16)))
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    assert (off - ref).abs().max() > 0.05
    assert raw.abs().max() > 3.0 > ours.abs().max()


def test_gemma3_final_logit_soft_cap_equals_transformers(tmp_path: Path) -> None:
    hf = tiny_hf_model("gemma3", tied=True, final_logit_softcapping=3.0)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model, cfg, _ = load_model(tmp_path, dtype=torch.float32)
    assert cfg.final_logit_softcapping == 3.0
    ids = prefill_logits_match(model, hf, cfg.vocab_size)
    with torch.no_grad():
        assert hf(ids[None]).logits.abs().max() < 3.0


def test_engine_greedy_through_graphs_equals_transformers(saved: tuple[str, Path, torch.nn.Module]) -> None:
    """The engine on the CPU, decode through its graph path (a CPU stand-in capturer: static buffers,
    padded rows, replays), float32: token for token transformers' greedy continuation."""
    _, folder, hf = saved
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (3, 11, 26, 40)]
    capturer = EagerCapturer()
    config = EngineConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=128, num_kv_blocks=64,
                          graph_miss_policy="capture", graph_warmup="none")
    engine = LLMEngine(config, capturer=capturer)
    got = run_waves(engine, prompts, [[0, 1, 2], [3]], NEW_TOKENS)
    stats = engine.graph_stats()
    assert stats is not None and stats.captures >= 1 and stats.hits + stats.padded_hits > 0, stats
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == hf_greedy(hf, p, NEW_TOKENS), i


def _sharded_logits(rank: int, world: int, family: str) -> torch.Tensor:
    """Prefill logits of a small random Qwen3 (q/k norm weights not all ones), SmolLM3 (layer 1 NoPE) or Granite
    (its four scales) on this rank's shard."""
    shapes = {"qwen3": {"family": "qwen3"}, "smollm3": {"nope_layers": (1,)},
              "granite": {"family": "granite", "granite": GraniteScales(2.0, 0.1, 0.5, 4.0)}}[family]
    cfg = ModelConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=32, **shapes)
    model = build_model(cfg, max_positions=32)
    init_random_weights(model, seed=3)
    with torch.no_grad():
        for layer in model.layers if family == "qwen3" else ():
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(5))
    shard_model(model, TPGroup(rank, world))
    kv = model.allocate_kv_caches(4, 4)
    meta = AttentionMetadata(True, torch.arange(6), torch.arange(4, 10), seq_lens=[6])
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor([5, 17, 90, 100, 3, 64]), meta, kv))


@pytest.mark.parametrize("family", ["qwen3", "smollm3", "granite"])
def test_two_shards_give_the_logits_of_the_whole_model(family: str) -> None:
    want = _sharded_logits(0, 1, family)
    for got in run_ranks(_sharded_logits, 2, family):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_refused_families_say_why() -> None:
    base = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    with pytest.raises(ValueError, match="Gemma 2's and Gemma 3's"):
        ModelConfig.from_hf_config({**base, "model_type": "gemma"})
    with pytest.raises(ValueError, match="attention_bias"):
        ModelConfig.from_hf_config({**base, "model_type": "gemma2", "attention_bias": True})
    with pytest.raises(ValueError, match="attn_logit_softcapping must be a positive number"):
        ModelConfig.from_hf_config({**base, "model_type": "gemma2", "attn_logit_softcapping": -50.0})
    with pytest.raises(ValueError, match="mixture-of-experts"):
        ModelConfig.from_hf_config({**base, "model_type": "mixtral"})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        ModelConfig.from_hf_config({**base, "model_type": "phi3", "partial_rotary_factor": 0.75})
    with pytest.raises(ValueError, match="multimodal Gemma 3"):
        ModelConfig.from_hf_config({**base, "model_type": "gemma3"})
    with pytest.raises(ValueError, match="attn_logit_softcapping=50 is not supported for Gemma 3"):
        ModelConfig.from_hf_config({**base, "model_type": "gemma3_text", "attn_logit_softcapping": 50})
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig.from_hf_config({**base, "model_type": "qwen3", "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="family"):
        ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8, family="gemma")


def test_smollm3_nope_and_sliding_layers_as_transformers_derives_them() -> None:
    base = {"model_type": "smollm3", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 8, "num_attention_heads": 4}
    assert ModelConfig.from_hf_config(base).nope_layers == (3, 7)  # every fourth layer by default
    cfg = ModelConfig.from_hf_config({**base, "no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0], "use_sliding_window": True,
                                      "sliding_window": 64})
    assert (cfg.nope_layers, cfg.sliding_window, cfg.sliding_layers) == ((1, 7), 64, (1, 7))
    with pytest.raises(ValueError, match="no_rope_layers has 2 entries for 8 layers"):
        ModelConfig.from_hf_config({**base, "no_rope_layers": [1, 0]})


def test_gemma2_2b_config_as_published() -> None:
    """google/gemma-2-2b-it's config.json (transformers 4.x layout): soft caps 50 and 30, a window of 4096."""
    cfg = ModelConfig.from_hf_config({
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
        "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
        "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
        "vocab_size": 256000,
    })
    assert cfg.family == "gemma2" and (cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (50.0, 30.0)
    assert cfg.sliding_window == 4096 and cfg.tie_word_embeddings and cfg.eos_token_ids == (1, 107)
    assert cfg.query_pre_attn_scalar == 256 and cfg.rope_theta == 1e4 and cfg.rope_scaling is None
    assert 2.60e9 < cfg.num_params < 2.63e9, cfg.num_params  # Gemma 2 2B: 2.61B parameters


def test_gemma3_1b_config_as_published() -> None:
    """google/gemma-3-1b-it's config.json (transformers 4.x layout): every 6th layer global, the rest local."""
    cfg = ModelConfig.from_hf_config({
        "model_type": "gemma3_text", "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "bos_token_id": 2, "eos_token_id": [1, 106], "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "intermediate_size": 6912, "max_position_embeddings": 32768, "num_attention_heads": 4,
        "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
        "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512,
        "sliding_window_pattern": 6, "vocab_size": 262144,
    })
    assert set(range(26)) - set(cfg.local_layers) == {5, 11, 17, 23}
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rope_freq_factors) == (1e6, 1e4, None)
    assert cfg.sliding_window == 512 and cfg.tie_word_embeddings and cfg.eos_token_ids == (1, 106)
    assert 0.99e9 < cfg.num_params < 1.01e9, cfg.num_params
