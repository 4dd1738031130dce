"""Gemma 3's fields of `ModelConfig`, read from a Hugging Face config (transformers 4.x or 5.x layout)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphpool.model.gemma2_config import gemma_layer_types

__all__ = ["gemma3_fields"]


def gemma3_fields(cfg: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """rope_theta and rope_freq_factors (the global layers' rotary: Gemma's linear scaling divides every
    frequency by one factor), local_rope_theta and local_layers (the sliding-window layers, their own
    unscaled rotary), query_pre_attn_scalar, sliding_window and sliding_layers (the local layers),
    final_logit_softcapping and tie_word_embeddings (tied unless it says not); what graphpool cannot run is refused."""
    if cfg.get("attn_logit_softcapping") is not None:
        # NOTE: transformers' Gemma 3 attention does not apply it, so no behaviour to match
        raise ValueError(f"attn_logit_softcapping={cfg['attn_logit_softcapping']} is not supported for Gemma 3 (its "
                         "checkpoints have none, and transformers' Gemma 3 attention does not apply it)")
    final_cap = cfg.get("final_logit_softcapping")
    layers = int(cfg["num_hidden_layers"])
    pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
    types = gemma_layer_types(cfg, "Gemma 3", ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                               for i in range(layers)])
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5.x: one rotary per layer type
        full, local = dict(params["full_attention"]), dict(params.get("sliding_attention") or {})
    else:  # transformers 4.x: the global rotary, its scaling, the local base
        full = {"rope_theta": cfg.get("rope_theta", 1e6), **(cfg.get("rope_scaling") or {})}
        local = {"rope_theta": cfg.get("rope_local_base_freq", 10000.0)}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rope type {local['rope_type']!r} of the sliding-window layers (default is)")
    kind = full.get("rope_type", full.get("type", "default"))
    if kind not in ("default", "linear"):
        raise ValueError(f"unsupported Gemma 3 rope type {kind!r} (supported: default, linear)")
    local_layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    window = cfg.get("sliding_window") if local_layers else None
    return {
        "rope_theta": float(full.get("rope_theta", 1e6)),
        "rope_freq_factors": (float(full["factor"]),) * (head_dim // 2) if kind == "linear" else None,
        "local_rope_theta": float(local.get("rope_theta", 10000.0)),
        "local_layers": local_layers,
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar") or head_dim),
        "sliding_window": None if window is None else int(window),
        "sliding_layers": None if window is None else local_layers,
        "final_logit_softcapping": None if final_cap is None else float(final_cap),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),  # transformers' default for Gemma
    }
