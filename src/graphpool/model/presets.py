"""Named presets with the real shapes of public models (from their Hugging Face config.json files), and one
small mixture-of-experts shape for quick runs."""

from __future__ import annotations

from graphpool.model.config import ModelConfig, RopeScaling
from graphpool.model.moe_config import MoeConfig

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


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}") from None
