"""Mixture-of-experts fields of `ModelConfig` (Qwen3-MoE), and their reading from a Hugging Face config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MOE_REFUSED", "MoeConfig", "moe_fields"]

# NOTE: other mixture-of-experts model types, refused by name: their routers or experts differ from Qwen3-MoE's
MOE_REFUSED = {
    name: f"{label}'s mixture-of-experts layers are not implemented (Qwen3-MoE's, qwen3_moe, are)"
    for name, label in {
        "mixtral": "Mixtral",
        "qwen2_moe": "Qwen2-MoE (shared expert)",
        "qwen3_next": "Qwen3-Next",
        "deepseek_v2": "DeepSeek-V2",
        "deepseek_v3": "DeepSeek-V3",
        "olmoe": "OLMoE",
        "phimoe": "PhiMoE",
        "granitemoe": "GraniteMoE",
        "gpt_oss": "gpt-oss",
        "dbrx": "DBRX",
        "llama4_text": "Llama 4",
    }.items()
}


@dataclass(frozen=True)
class MoeConfig:
    """Qwen3-MoE's sparse MLP: a router (softmax over `num_experts`, the top `num_experts_per_tok`, renormalised
    when `norm_topk_prob`) and SwiGLU experts of width `moe_intermediate_size`. Layer i is sparse unless it is in
    `mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`; the others keep the dense MLP of
    `ModelConfig.intermediate_size` (transformers' rule)."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MoeConfig.{name} must be a positive int, got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be at most num_experts "
                             f"({self.num_experts})")
        if any(not isinstance(i, int) or i < 0 for i in self.mlp_only_layers):
            raise ValueError(f"mlp_only_layers must be layer indices >= 0, got {self.mlp_only_layers}")

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    def sparse_mlp_params(self, hidden_size: int) -> int:
        """Router plus every expert's gate, up and down projections."""
        return self.num_experts * (hidden_size + 3 * hidden_size * self.moe_intermediate_size)


def moe_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`family` and `moe` of a `qwen3_moe` config.json; with no experts every layer is dense, as in transformers:
    the model is then a Qwen3."""
    experts = int(cfg.get("num_experts", cfg.get("num_local_experts")) or 0)
    if experts == 0:
        return {"family": "qwen3", "moe": None}
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        if key not in cfg:
            raise ValueError(f"a qwen3_moe config needs {key}")
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list | tuple):
        raise ValueError(f"mlp_only_layers must be a list of layer indices, got {only!r}")
    return {"family": "qwen3_moe", "moe": MoeConfig(
        num_experts=experts,
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        decoder_sparse_step=int(cfg.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(int(i) for i in only),
    )}
