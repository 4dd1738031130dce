"""Gemma 2's fields of `ModelConfig`, read from a Hugging Face config (transformers 4.x or 5.x layout)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphpool.model.window_config import sliding_layers_of

__all__ = ["gemma2_fields", "gemma_layer_types"]


def gemma_layer_types(cfg: Mapping[str, Any], name: str, default: list[str]) -> list[str]:
    """The Gemmas' checks in common (causal attention, the tanh GeLU) and their `layer_types` (`default` when
    the config has none), each full_attention or sliding_attention."""
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=True is not supported (graphpool's attention is causal)")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"{name} hidden_activation {act!r} is not supported (gelu_pytorch_tanh is)")
    types = cfg.get("layer_types") or default
    layers = int(cfg["num_hidden_layers"])
    if len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types must be {layers} of full_attention / sliding_attention, got {types}")
    return list(types)


def gemma2_fields(cfg: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """query_pre_attn_scalar, the two soft caps (attention scores, final logits), sliding_window and
    sliding_layers (the sliding_attention layers) and tie_word_embeddings (tied unless it says not); the rotary is
    read as every family's. What graphpool cannot run is refused."""
    if cfg.get("attention_bias"):
        raise ValueError("attention_bias=True is not supported for Gemma 2 (its o_proj bias has no place here)")
    layers = int(cfg["num_hidden_layers"])
    # transformers' default: sliding, full, sliding, full, ...
    types = gemma_layer_types(cfg, "Gemma 2", ["sliding_attention" if i % 2 == 0 else "full_attention"
                                               for i in range(layers)])
    sliding = sliding_layers_of(types)
    window = cfg.get("sliding_window") if sliding else None
    caps = {}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = cfg.get(key)
        caps[key] = None if value is None else float(value)
    return {
        **caps,
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar") or head_dim),
        "sliding_window": None if window is None else int(window),
        "sliding_layers": None if window is None else sliding,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),  # transformers' default for Gemma
    }
