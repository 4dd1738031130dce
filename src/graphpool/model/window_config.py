"""Which layers of a Hugging Face config slide, and how far: `ModelConfig`'s sliding_window and sliding_layers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["check_sliding", "qwen_sliding_layers", "sliding_layers_of", "smollm3_layers"]

# transformers' default of Qwen2's and Qwen3's max_window_layers (the layers below it attend to everything)
_QWEN_MAX_WINDOW_LAYERS = 28


def check_sliding(window: int | None, layers: tuple[int, ...] | None, num_layers: int) -> None:
    """`ModelConfig`'s check of sliding_window (a positive int or None) and sliding_layers (None, or layer
    indices, with a window)."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ValueError(f"ModelConfig.sliding_window must be a positive int (or None), got {window!r}")
    if layers is not None and (window is None or not layers or any(not 0 <= i < num_layers for i in layers)):
        raise ValueError(f"sliding_layers must be layer indices below {num_layers}, with a sliding_window; got "
                         f"{layers} (window {window})")


def sliding_layers_of(types: Sequence[str]) -> tuple[int, ...] | None:
    """The indices of the sliding_attention entries of `layer_types`, None when there are none."""
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    return layers or None


def qwen_sliding_layers(cfg: Mapping[str, Any]) -> tuple[int | None, tuple[int, ...] | None]:
    """(sliding_window, sliding_layers) of a Qwen2 / Qwen3 / Qwen3-MoE config, as transformers reads it: no
    window unless use_sliding_window; then Qwen3-MoE slides in every layer (None), Qwen2 and Qwen3 in the
    sliding_attention entries of layer_types, by default the layers from max_window_layers on."""
    window = cfg.get("sliding_window")
    if not cfg.get("use_sliding_window", False) or window is None:
        return None, None
    if cfg.get("model_type") == "qwen3_moe":
        return int(window), None
    layers = int(cfg["num_hidden_layers"])
    first = int(cfg.get("max_window_layers", _QWEN_MAX_WINDOW_LAYERS))
    types = cfg.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    sliding = sliding_layers_of(types)
    return (None, None) if sliding is None else (int(window), sliding)


def smollm3_layers(cfg: Mapping[str, Any]) -> tuple[tuple[int, ...], int | None, tuple[int, ...] | None]:
    """(nope_layers, sliding_window, sliding_layers) of a SmolLM3 config, as transformers reads it: `no_rope_layers`
    holds 1 for a layer with the rotary (by default every `no_rope_layer_interval`-th layer has none); with
    use_sliding_window, the sliding_attention entries of layer_types slide (by default the NoPE layers)."""
    layers = int(cfg["num_hidden_layers"])
    interval = int(cfg.get("no_rope_layer_interval", 4))
    uses_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    if len(uses_rope) != layers:
        raise ValueError(f"no_rope_layers has {len(uses_rope)} entries for {layers} layers")
    nope = tuple(i for i, rope in enumerate(uses_rope) if not rope)
    window = cfg.get("sliding_window")
    if not cfg.get("use_sliding_window", False) or window is None:
        return nope, None, None
    types = cfg.get("layer_types") or ["full_attention" if rope else "sliding_attention" for rope in uses_rope]
    sliding = sliding_layers_of(types)
    return nope, (None if sliding is None else int(window)), sliding
