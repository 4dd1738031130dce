"""Filling a `LlamaModel` from Hugging Face-named tensors, and random initialisation at real shapes."""

from __future__ import annotations

import re

import torch

from graphpool.model.int4 import GROUP, Int4Blocks, Q8Blocks, Q8Head
from graphpool.model.layers import RMSNorm
from graphpool.model.linear import ColumnLinear, _Linear
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
    "mlp.gate",  # a mixture-of-experts router
    "mlp.experts",  # stacked experts (transformers' in-memory names): gate_up_proj [E, 2I, H], down_proj [E, H, I]
}
# one expert's projection -> (stacked parameter, which half of the expert's rows: 0 gate, 1 up, None all)
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_EXPERT_TARGET = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", None)}
# buffers some checkpoints carry that the model recomputes
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


class WeightLoader:
    """Copies Hugging Face-named tensors into a model (fusing q/k/v and gate/up); `finish()` checks that
    every parameter was written. A linear layer's weight may come as 4-bit `Int4Blocks` (model/int4.py): its
    parts are gathered (a fused layer's from several tensors) and the layer switched to them in `finish()`;
    the LM head's (or the tied embedding's) as 8-bit `Q8Blocks`: loaded dequantized as always, and the model's
    logits then computed from the blocks (`LlamaModel.q8_head`)."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self._params = dict(model.named_parameters())
        self._written: dict[str, int] = {}  # parameter name -> elements written
        self._int4: dict[str, Int4Blocks] = {}  # linear weight name -> its 4-bit parts, filled row by row
        self._int4_rows: dict[str, list[slice]] = {}  # the rows of each that came 4-bit
        self._dense: set[str] = set()  # parameters written from float tensors
        self._q8_head: Q8Blocks | None = None

    def load(self, name: str, tensor: torch.Tensor | Int4Blocks | Q8Blocks) -> None:
        if _IGNORED.search(name):
            return
        if isinstance(tensor, Q8Blocks):  # NOTE: the LM head's blocks: the weight as always, and the 8-bit head
            head = name == "lm_head.weight" or (name == "model.embed_tokens.weight" and self.model.lm_head is None)
            if not head:
                raise ValueError(f"{name}: only the LM head's weight can be loaded 8-bit")
            self._q8_head = tensor
            tensor = tensor.dequantize()
        if isinstance(tensor, torch.Tensor):
            tensor = self.model.from_checkpoint(name, tensor)
        elif not name.endswith("_proj.weight"):
            raise ValueError(f"{name}: only a linear layer's weight can be loaded 4-bit")
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
        expert = _EXPERT.match(rest)
        if expert is not None:  # Hugging Face checkpoints store each expert apart: stacked here
            target, half = _EXPERT_TARGET[expert.group(2)]
            param_name, rows = f"layers.{index}.mlp.experts.{target}", slice(None)
            if half is not None and param_name in self._params:
                size = self._params[param_name].shape[1] // 2
                rows = slice(half * size, (half + 1) * size)
            self._copy(param_name, tensor, (int(expert.group(1)), rows))
        elif module_name in _FUSED:
            target, shard = _FUSED[module_name]
            linear = self.model.layers[index].get_submodule(target)
            assert isinstance(linear, ColumnLinear)
            self._copy(f"layers.{index}.{target}.{kind}", tensor, linear.shard_slice(shard))
        elif module_name in _PLAIN:
            self._copy(f"layers.{index}.{rest}", tensor)
        else:
            raise ValueError(f"unexpected weight {name!r}")

    def _copy(self, param_name: str, tensor: torch.Tensor | Int4Blocks,
              rows: slice | tuple[int, slice] | None = None) -> None:
        param = self._params.get(param_name)
        if param is None:
            raise ValueError(f"the model has no parameter {param_name!r} (config and weights disagree)")
        if isinstance(rows, tuple) and not 0 <= rows[0] < param.shape[0]:
            raise ValueError(f"{param_name} holds {param.shape[0]} experts; the weights have expert {rows[0]}")
        dest = param.data if rows is None else param.data[rows]
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ValueError(
                f"shape mismatch for {param_name}{'' if rows is None else _index_text(rows)}: "
                f"model {tuple(dest.shape)}, weights {tuple(tensor.shape)}"
            )
        if isinstance(tensor, Int4Blocks):
            self._copy_int4(param_name, param, tensor, rows)
        else:
            dest.copy_(tensor)
            self._dense.add(param_name)
        self._written[param_name] = self._written.get(param_name, 0) + dest.numel()

    def _copy_int4(self, param_name: str, param: torch.Tensor, blocks: Int4Blocks,
                   rows: slice | tuple[int, slice] | None) -> None:
        if isinstance(rows, tuple) or param.dim() != 2 or param.shape[1] % GROUP:
            raise ValueError(f"{param_name} cannot hold a 4-bit weight")
        into = self._int4.get(param_name)
        if into is None:
            n, k = param.shape
            into = self._int4[param_name] = Int4Blocks(torch.zeros(n, k, dtype=torch.uint8),
                                                       torch.zeros(n, k // GROUP), torch.zeros(n, k // GROUP))
        span = slice(None) if rows is None else rows
        for dest, part in zip((into.codes, into.scales, into.zeros), (blocks.codes, blocks.scales, blocks.zeros),
                              strict=True):
            dest[span] = part
        self._int4_rows.setdefault(param_name, []).append(span)

    def finish(self) -> None:
        missing = [n for n, p in self._params.items() if self._written.get(n, 0) < p.numel()]
        if missing:
            shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise ValueError(f"{len(missing)} parameters were not found in the weights: {shown}")
        for param_name, blocks in self._int4.items():
            module = self.model.get_submodule(param_name.removesuffix(".weight"))
            if not isinstance(module, _Linear):
                raise ValueError(f"{param_name} is not a linear layer's weight: it cannot be 4-bit")
            if param_name in self._dense:  # NOTE: a fused layer of mixed formats (a Q6_K v beside Q4_K q, k): float
                values = blocks.dequantize()
                for span in self._int4_rows[param_name]:
                    self._params[param_name].data[span] = values[span]
                continue
            module.use_int4(blocks)
        self._int4.clear()
        if self._q8_head is not None:
            self.model.q8_head = Q8Head(self._q8_head)
            self._q8_head = None


def _index_text(rows: slice | tuple[int, slice]) -> str:
    expert, part = rows if isinstance(rows, tuple) else (None, rows)
    span = "" if part.start is None else f"{part.start}:{part.stop}"
    return f"[{expert}, {span or ':'}]" if expert is not None else f"[{span}]"


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
