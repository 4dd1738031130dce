"""ModelConfig validation, presets, HF config parsing, Llama-3 rope scaling, name resolution."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphpool.model import PRESETS, AttentionMetadata, ModelConfig, get_preset, load_model
from graphpool.model.layers import rope_inv_freq
from graphpool.model.llama import LlamaModel
from graphpool.model.weights import init_random_weights


def test_presets_have_the_real_shapes() -> None:
    l1 = PRESETS["llama3.2-1b"]
    assert (l1.hidden_size, l1.num_layers, l1.num_heads, l1.num_kv_heads, l1.head_dim) == (
        2048,
        16,
        32,
        8,
        64,
    )
    assert (l1.intermediate_size, l1.vocab_size, l1.rope_theta) == (8192, 128256, 500000.0)
    assert l1.rope_scaling is not None and l1.rope_scaling.factor == 32.0 and l1.tie_word_embeddings
    l8 = PRESETS["llama3-8b"]
    assert (l8.hidden_size, l8.num_layers, l8.num_heads, l8.num_kv_heads, l8.intermediate_size) == (
        4096,
        32,
        32,
        8,
        14336,
    )
    assert not l8.tie_word_embeddings and l8.rope_scaling is None
    q = PRESETS["qwen2.5-0.5b"]
    assert (q.hidden_size, q.num_layers, q.num_heads, q.num_kv_heads, q.intermediate_size) == (
        896,
        24,
        14,
        2,
        4864,
    )
    assert q.vocab_size == 151936 and q.attention_bias and q.rope_theta == 1e6 and q.tie_word_embeddings
    s = PRESETS["smollm2-135m"]
    assert (s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads, s.intermediate_size) == (
        576,
        30,
        9,
        3,
        1536,
    )
    assert s.vocab_size == 49152 and s.rope_theta == 100000.0 and s.tie_word_embeddings
    # published parameter counts: ~135M, ~494M, ~1.24B, ~8.03B
    assert 130e6 < s.num_params < 140e6
    assert 490e6 < q.num_params < 500e6
    assert 1.2e9 < l1.num_params < 1.3e9
    assert 8.0e9 < l8.num_params < 8.1e9


def test_config_validation_is_clear() -> None:
    base = PRESETS["smollm2-135m"]
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(base, num_kv_heads=4)
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        dataclasses.replace(base, hidden_size=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        dataclasses.replace(base, eos_token_ids=(base.vocab_size,))
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("gpt-5")


def test_from_hf_config_reads_both_rope_formats() -> None:
    common = {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    }
    scaling = {
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    v4 = ModelConfig.from_hf_config(
        {**common, "rope_theta": 500000.0, "rope_scaling": {**scaling, "rope_type": "llama3"}}
    )
    v5 = ModelConfig.from_hf_config(
        {**common, "rope_parameters": {**scaling, "rope_type": "llama3", "rope_theta": 500000.0}}
    )
    assert v4 == v5
    assert dataclasses.replace(v4, eos_token_ids=(128001,)) == PRESETS["llama3.2-1b"]
    with pytest.raises(ValueError, match="unsupported model_type"):
        ModelConfig.from_hf_config({**common, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="unsupported rope type"):
        ModelConfig.from_hf_config({**common, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_llama3_rope_scaling_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = PRESETS["llama3.2-1b"]
    assert cfg.rope_scaling is not None
    hf_cfg = LlamaConfig(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rope_scaling={"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)},
    )
    expected, scale = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, torch.device("cpu"))
    ours = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    assert scale == 1.0
    torch.testing.assert_close(ours, expected.float(), rtol=1e-6, atol=0)
    plain = rope_inv_freq(cfg.head_dim, cfg.rope_theta, None)
    # scaling leaves the high frequencies alone and slows the low ones by `factor`
    assert ours[0] == plain[0] and torch.isclose(ours[-1], plain[-1] / 32.0)


@pytest.mark.parametrize("bad", ["gpt-5", "random:llama9-1t", "/no/such/model.gguf", "random:"])
def test_unknown_model_names_raise_clearly(bad: str) -> None:
    with pytest.raises(ValueError, match="accepted models") as info:
        load_model(bad)
    assert "random:llama3.2-1b" in str(info.value) and "smollm2-135m-instruct" in str(info.value)


def test_bad_attn_backend_raises() -> None:
    with pytest.raises(ValueError, match="attn_backend"):
        LlamaModel(PRESETS["smollm2-135m"], attn_backend="cuda")  # type: ignore[arg-type]


def test_triton_backend_falls_back_to_torch_on_cpu() -> None:
    tiny = dataclasses.replace(
        PRESETS["smollm2-135m"], num_layers=1, vocab_size=64, bos_token_id=1, eos_token_ids=(2,)
    )
    with pytest.warns(UserWarning, match="torch backend"):
        model = LlamaModel(tiny, attn_backend="triton")
    assert model.attn_backend == "torch"


def test_random_weights_are_seeded_and_finite() -> None:
    tiny = dataclasses.replace(
        PRESETS["qwen2.5-0.5b"], num_layers=2, vocab_size=512, bos_token_id=1, eos_token_ids=(2,)
    )
    outs = []
    for seed in (0, 0, 1):
        model = LlamaModel(tiny, dtype=torch.bfloat16)
        init_random_weights(model, seed=seed)
        kv = model.allocate_kv_caches(4, 8)
        meta = AttentionMetadata(True, torch.arange(6), torch.arange(6) + 8, seq_lens=[6])
        with torch.no_grad():
            outs.append(model.compute_logits(model(torch.arange(6), meta, kv)))
    assert torch.isfinite(outs[0]).all() and outs[0].dtype == torch.float32
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    assert outs[0].std() > 0.1


def test_random_preset_loads_without_tokenizer() -> None:
    model, cfg, tok = load_model("random:smollm2-135m", dtype=torch.bfloat16)
    assert tok is None and cfg == PRESETS["smollm2-135m"]
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.layers[0].input_layernorm.weight.eq(1).all()


def test_kernel_ops_wiring_matches_torch_ops() -> None:
    """The `graphpool.kernels` entry points (their torch references on CPU) slot into the model with the same
    argument order and residual-stream semantics as the torch ops: same logits for prefill and decode."""
    from graphpool.model.ops import TORCH_OPS, kernel_ops
    from model_reference import paged_greedy

    tiny = dataclasses.replace(
        PRESETS["llama3.2-1b"],
        num_layers=2,
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        bos_token_id=1,
        eos_token_ids=(2,),
    )
    models = []
    for ops in (TORCH_OPS, kernel_ops()):
        m = LlamaModel(tiny, ops=ops)
        init_random_weights(m, seed=3, std=0.1)
        models.append(m)
    assert models[1].attn_backend == "triton"
    prompts = [[5, 9, 200, 7, 7, 31], [1, 2, 3]]
    assert paged_greedy(models[0], prompts, 6, block_size=4) == paged_greedy(
        models[1], prompts, 6, block_size=4
    )
    kv = [m.allocate_kv_caches(4, 8) for m in models]
    meta = AttentionMetadata(True, torch.arange(6), torch.arange(6) + 8, seq_lens=[6])
    with torch.no_grad():
        a, b = (
            m.compute_logits(m(torch.tensor(prompts[0]), meta, c)) for m, c in zip(models, kv, strict=True)
        )
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
