"""Which module classes build a config's decoder (`ModelConfig.family`)."""

from __future__ import annotations

from typing import Any

from graphpool.model.config import FAMILIES, ModelConfig
from graphpool.model.gemma2 import Gemma2Model
from graphpool.model.gemma3 import Gemma3Model
from graphpool.model.granite import GraniteModel
from graphpool.model.llama import LlamaModel
from graphpool.model.olmo2 import Olmo2Model
from graphpool.model.qwen3 import Qwen3Model
from graphpool.model.qwen3_moe import Qwen3MoeModel

__all__ = ["build_model", "model_class"]

_CLASSES: dict[str, type[LlamaModel]] = {
    "llama": LlamaModel, "qwen3": Qwen3Model, "gemma2": Gemma2Model, "gemma3": Gemma3Model,
    "qwen3_moe": Qwen3MoeModel, "olmo2": Olmo2Model, "granite": GraniteModel,
}
assert set(_CLASSES) == set(FAMILIES), "every family of ModelConfig has its model class"


def model_class(config: ModelConfig) -> type[LlamaModel]:
    return _CLASSES[config.family]


def build_model(config: ModelConfig, **kwargs: Any) -> LlamaModel:
    """The config's model (`LlamaModel` or a family's subclass), parameters uninitialised: see `LlamaModel`."""
    return model_class(config)(config, **kwargs)
