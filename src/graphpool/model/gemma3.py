"""Gemma 3 (text): Gemma 2's layers (model/gemma2.py) with Qwen3's attention (per-head q/k norms) and the
sliding-window layers' own rotary base; no soft caps. Those layers' windows are set by `LlamaModel`
(`ModelConfig.layer_window`)."""

from __future__ import annotations

import dataclasses

from graphpool.model.config import ModelConfig
from graphpool.model.gemma2 import Gemma2DecoderLayer, Gemma2Model
from graphpool.model.layers import RotaryEmbedding
from graphpool.model.qwen3 import Qwen3Attention

__all__ = ["Gemma3Model"]


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_cls = Qwen3Attention  # its scale follows query_pre_attn_scalar (LlamaAttention)


class Gemma3Model(Gemma2Model):
    """`Gemma2Model` with Gemma 3's layers and a second rotary for its sliding-window layers."""

    layer_cls = Gemma3DecoderLayer

    def __init__(self, config: ModelConfig, **kwargs: object) -> None:
        super().__init__(config, **kwargs)
        assert config.local_rope_theta is not None
        local = dataclasses.replace(config, rope_theta=config.local_rope_theta, rope_scaling=None,
                                    rope_freq_factors=None)
        # NOTE: a second shared cache, the sliding-window layers' (their base, no scaling)
        self.local_rotary = RotaryEmbedding(local, self.max_positions, self.device)
        for i in config.local_layers:
            self.layers[i].self_attn.rotary = self.local_rotary
