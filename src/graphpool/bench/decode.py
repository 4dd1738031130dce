"""A decode step at a fixed context, in the engine's static-input layout, for the step and memory benches.

Static inputs (docs/architecture.md): input_ids [bs] int64, positions [bs] int64, slot_mapping [bs] int64,
block_tables [bs, max_blocks] int32, context_lens [bs] int32. Sequence i owns its own blocks (block 0 is the
reserved dummy block), holds `context_len` tokens including the current one, and writes its new K/V at the
last position: the step is idempotent, so it can be run, captured and replayed on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from graphpool.engine.decode_step import decode_forward, decode_head, decode_hidden, decode_input_specs
from graphpool.model.config import ModelConfig
from graphpool.model.families import build_model
from graphpool.model.llama import LlamaModel
from graphpool.model.ops import default_attn_backend
from graphpool.model.presets import get_preset
from graphpool.model.qwen3_moe import SparseMoe
from graphpool.model.weights import init_random_weights
from graphpool.pool import InputSpec

StepFn = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]


def model_label(model: str | ModelConfig) -> str:
    if isinstance(model, str):
        return model.removeprefix("random:")
    return f"custom(h={model.hidden_size},L={model.num_layers})"


def build_random_model(
    model: str | ModelConfig, device: torch.device, dtype: torch.dtype, attn_backend: str, max_positions: int
) -> LlamaModel:
    """A model with seeded random weights at a preset's real shapes (or at an explicit config's)."""
    cfg = get_preset(model.removeprefix("random:")) if isinstance(model, str) else model
    backend = default_attn_backend(attn_backend, device)
    m = build_model(cfg, device=device, dtype=dtype, attn_backend=backend, max_positions=max_positions)
    init_random_weights(m, seed=0)
    return m.eval()


@dataclass
class DecodeSetup:
    model: LlamaModel
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    inputs: dict[str, torch.Tensor]  # for max_batch_size rows; `batch(bs)` slices the first bs
    context_len: int
    block_size: int

    @classmethod
    def create(
        cls, model: LlamaModel, max_batch_size: int, context_len: int, block_size: int = 16, seed: int = 0
    ) -> DecodeSetup:
        if context_len < 1 or max_batch_size < 1:
            raise ValueError(f"context_len and max_batch_size must be >= 1, got {context_len}, {max_batch_size}")
        dev = model.device
        blocks_per_seq = -(-context_len // block_size)
        num_blocks = 1 + max_batch_size * blocks_per_seq
        kv = model.allocate_kv_caches(num_blocks, block_size)
        gen = torch.Generator(device=dev).manual_seed(seed)
        # NOTE: random cache contents, never zeros (zeros can hide wrong indexing and time differently).
        for k, v in kv:
            k.normal_(0.0, 1.0, generator=gen)
            v.normal_(0.0, 1.0, generator=gen)
        rows = torch.arange(max_batch_size, device=dev)
        # [bs, blocks_per_seq]: sequence i owns blocks 1 + i*blocks_per_seq ...
        block_tables = (1 + rows[:, None] * blocks_per_seq + torch.arange(blocks_per_seq, device=dev)).to(torch.int32)
        last = context_len - 1
        slot = block_tables[:, last // block_size].to(torch.int64) * block_size + last % block_size
        inputs = {
            "input_ids": torch.randint(0, model.config.vocab_size, (max_batch_size,), device=dev, generator=gen),
            "positions": torch.full((max_batch_size,), last, device=dev, dtype=torch.int64),
            "slot_mapping": slot,
            "block_tables": block_tables,
            "context_lens": torch.full((max_batch_size,), context_len, device=dev, dtype=torch.int32),
        }
        return cls(model=model, kv_caches=kv, inputs=inputs, context_len=context_len, block_size=block_size)

    def batch(self, bs: int) -> dict[str, torch.Tensor]:
        """Fresh (contiguous) tensors for the first bs sequences."""
        return {k: v[:bs].clone() for k, v in self.inputs.items()}

    def step_fn(self) -> StepFn:
        """The engine's decode step on static inputs (`graphpool.engine.decode_step`), at this context."""
        model, kv, bound = self.model, self.kv_caches, self.context_len
        return lambda static: decode_forward(model, kv, static, bound)

    def engine_step_fn(self) -> StepFn:
        """The step the engine's pool captures: the final hidden rows (`decode_hidden`); `head` follows it."""
        model, kv, bound = self.model, self.kv_caches, self.context_len
        return lambda static: decode_hidden(model, kv, static, bound)

    def head(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's greedy step after the replay: logits (`decode_head`) and their row argmaxes (the
        sampler's `step_argmax`)."""
        logits = decode_head(self.model, hidden)
        return logits, self.model.ops.step_argmax(logits)

    def full_step_fn(self) -> Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
        """`engine_step_fn` then `head` as one callable (every kernel of the engine's step, in one graph)."""
        model, kv, bound = self.model, self.kv_caches, self.context_len
        return lambda static: self.head(decode_hidden(model, kv, static, bound))

    def weight_bytes_read(self, bs: int) -> int:
        """Bytes of weights one decode step must read: every matrix once; an untied input embedding only
        its bs rows (a tied one is read whole by the logits); of a mixture of experts at most bs * top-k experts
        (the most a step can route to, a floor: the step reads more where the experts form does, moe_ops.py)."""
        m = self.model
        seen: set[int] = set()
        total = 0
        for p in m.parameters():
            if p.data_ptr() in seen:
                continue
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
        for block in (b for b in m.modules() if isinstance(b, SparseMoe)):
            stacked = (block.experts.gate_up_proj, block.experts.down_proj)
            experts = stacked[0].shape[0]
            unread = experts - min(experts, bs * block.top_k)
            total -= sum(w[0].numel() * w.element_size() for w in stacked) * unread
        if m.lm_head is not None:
            emb = m.embed_tokens.weight
            total -= emb.numel() * emb.element_size()
            total += bs * emb.shape[1] * emb.element_size()
        return total

    def kv_bytes_read(self, bs: int) -> int:
        cfg = self.model.config
        elt = self.kv_caches[0][0].element_size()
        return bs * self.context_len * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * elt


def setup_input_specs(setup: DecodeSetup) -> list[InputSpec]:
    """The pool's input specs for the engine's decode layout at this setup's block-table width."""
    return decode_input_specs(setup.inputs["block_tables"].shape[1])
