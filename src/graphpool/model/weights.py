"""Filling a `LlamaModel` from Hugging Face-named tensors, and random initialisation at real shapes."""

from __future__ import annotations

import re

import torch

from graphpool.model.layers import RMSNorm
from graphpool.model.linear import ColumnLinear
from graphpool.model.llama import LlamaModel

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF sub-name -> (our module path inside the layer, index of the logical projection in a fused weight)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_PLAIN = {
    "self_attn.o_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
    # NOTE: Phi-3 checkpoints hold q/k/v and gate/up fused, in our fused layers' row order
    "self_attn.qkv_proj",
    "mlp.gate_up_proj",
    "self_attn.q_norm",  # Qwen3's per-head norms
    "self_attn.k_norm",
    "pre_feedforward_layernorm",  # Gemma's norms around the MLP
    "post_feedforward_layernorm",
}
# buffers some checkpoints carry that the model recomputes
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


class WeightLoader:
    """Copies Hugging Face-named tensors into a model (fusing q/k/v and gate/up); `finish()` checks that
    every parameter was written."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self._params = dict(model.named_parameters())
        self._written: dict[str, int] = {}  # parameter name -> rows written

    def load(self, name: str, tensor: torch.Tensor) -> None:
        if _IGNORED.search(name):
            return
        tensor = self.model.from_checkpoint(name, tensor)
        if name == "lm_head.weight":
            if self.model.lm_head is None:
                return  # tied: the head is the embedding
            self._copy("lm_head", tensor)
            return
        if name == "model.embed_tokens.weight":
            self._copy("embed_tokens.weight", tensor)
            return
        if name == "model.norm.weight":
            self._copy("norm.weight", tensor)
            return
        m = _LAYER.match(name)
        if m is None:
            raise ValueError(f"unexpected weight {name!r}")
        index, rest = int(m.group(1)), m.group(2)
        module_name, _, kind = rest.rpartition(".")
        if module_name in _FUSED:
            target, shard = _FUSED[module_name]
            linear = self.model.layers[index].get_submodule(target)
            assert isinstance(linear, ColumnLinear)
            self._copy(f"layers.{index}.{target}.{kind}", tensor, linear.shard_slice(shard))
        elif module_name in _PLAIN:
            self._copy(f"layers.{index}.{rest}", tensor)
        else:
            raise ValueError(f"unexpected weight {name!r}")

    def _copy(self, param_name: str, tensor: torch.Tensor, rows: slice | None = None) -> None:
        param = self._params.get(param_name)
        if param is None:
            raise ValueError(f"the model has no parameter {param_name!r} (config and weights disagree)")
        dest = param.data if rows is None else param.data[rows]
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ValueError(
                f"shape mismatch for {param_name}{'' if rows is None else f'[{rows.start}:{rows.stop}]'}: "
                f"model {tuple(dest.shape)}, weights {tuple(tensor.shape)}"
            )
        dest.copy_(tensor)
        self._written[param_name] = self._written.get(param_name, 0) + dest.shape[0]

    def finish(self) -> None:
        missing = [n for n, p in self._params.items() if self._written.get(n, 0) < p.shape[0]]
        if missing:
            shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise ValueError(f"{len(missing)} parameters were not found in the weights: {shown}")


@torch.no_grad()
def init_random_weights(model: LlamaModel, seed: int = 0, std: float = 0.02) -> None:
    """Seeded random weights on the model's own device and dtype: matrices and biases ~ N(0, std),
    norm weights = 1, so activations stay finite in bf16 at any preset's depth."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if isinstance(module, RMSNorm):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=gen)
