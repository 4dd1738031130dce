"""Named presets with the real shapes of public models (from their Hugging Face config.json files), and one
small mixture-of-experts shape for quick runs."""

from __future__ import annotations

import dataclasses

from graphpool.model.config import ModelConfig, RopeScaling
from graphpool.model.moe_config import MoeConfig

# The newer families from their published config.json fields (those graphpool reads), through the same reading
# as a Hugging Face folder, so a family's derived fields (layer types, soft caps, rotary bases) come out alike.
_HF_CONFIGS: dict[str, dict[str, object]] = {
    # Qwen/Qwen3-8B: 8.2B parameters (6.95B without the embeddings)
    "qwen3-8b": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 40960,
        "tie_word_embeddings": False, "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151645,
    },
    # google/gemma-2-2b: 2.61B parameters; layers alternate a 4096-token window and full attention
    "gemma2-2b": {
        "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 8192,
        "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "bos_token_id": 2, "eos_token_id": 1,
    },
    # google/gemma-3-1b-it (text only): 1B parameters; five 512-token window layers to one full attention layer
    "gemma3-1b": {
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
        "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "max_position_embeddings": 32768, "query_pre_attn_scalar": 256, "sliding_window": 512,
        "sliding_window_pattern": 6, "final_logit_softcapping": None, "attn_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1,
    },
    # microsoft/Phi-3-mini-4k-instruct: 3.8B parameters; a 2047-token sliding window
    "phi3-mini-4k": {
        "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 4096, "sliding_window": 2047,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 32000,
    },
}

PRESETS: dict[str, ModelConfig] = {
    # HuggingFaceTB/SmolLM2-135M(-Instruct)
    "smollm2-135m": ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    # Qwen/Qwen2.5-0.5B
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_ids=(151643,),
        attention_bias=True,
    ),
    # meta-llama/Llama-3.2-1B
    "llama3.2-1b": ModelConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(
            factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        ),
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_ids=(128001,),
    ),
    # meta-llama/Meta-Llama-3-8B
    "llama3-8b": ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_ids=(128001,),
    ),
    # Qwen/Qwen3-30B-A3B: 128 experts of width 768 in every layer, 8 routed per token (~3.3B active parameters)
    "qwen3-30b-a3b": ModelConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_ids=(151645,),
        family="qwen3_moe",
        moe=MoeConfig(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
    ),
    # not a public model: Qwen3-MoE's layout at a small shape (16 experts, top-4, layer 1 dense) for quick runs
    "qwen3-moe-tiny": ModelConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_ids=(2,),
        family="qwen3_moe",
        moe=MoeConfig(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128, norm_topk_prob=True,
                      mlp_only_layers=(1,)),
    ),
}
PRESETS.update({name: ModelConfig.from_hf_config(cfg) for name, cfg in _HF_CONFIGS.items()})


def first_layers(config: ModelConfig, num_layers: int) -> ModelConfig:
    """The config's first `num_layers` layers, the same shapes otherwise (per-layer index lists cut to them)."""
    local = tuple(i for i in config.local_layers if i < num_layers)
    window, sliding = config.sliding_window, config.sliding_layers
    if sliding is not None:
        sliding = tuple(i for i in sliding if i < num_layers) or None
        window = window if sliding else None  # no sliding layer left: no window
    return dataclasses.replace(config, num_layers=num_layers, local_layers=local, sliding_window=window,
                               sliding_layers=sliding)


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}") from None
