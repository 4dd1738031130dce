"""Llama-shaped models (SmolLM2, Llama 3.x, Qwen2.x, Qwen3, Qwen3-MoE, Mistral, Phi-3, Gemma 2, Gemma 3 text),
presets, weight loading and tokenizer."""

from __future__ import annotations

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig, RopeScaling
from graphpool.model.llama import LlamaModel
from graphpool.model.loader import DEFAULT_MODEL, load_model
from graphpool.model.presets import PRESETS, get_preset
from graphpool.model.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MODEL",
    "PRESETS",
    "AttentionMetadata",
    "LlamaModel",
    "ModelConfig",
    "RopeScaling",
    "Tokenizer",
    "get_preset",
    "load_model",
]
