"""Llama-family decoder (Llama 3.x, SmolLM2, Qwen2.x) in plain torch modules. No graph logic here."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn

from graphpool.model.attention import AttentionMetadata
from graphpool.model.attn_ops import (
    paged_decode_attention_torch,
    prefill_attention,
    write_kv,
)
from graphpool.model.config import ModelConfig
from graphpool.model.layers import RMSNorm, RotaryEmbedding, SwiGLU
from graphpool.model.linear import ColumnLinear, RowLinear

AttnBackend = Literal["torch", "triton"]
KVCache = tuple[torch.Tensor, torch.Tensor]
DecodeAttnFn = Callable[..., torch.Tensor]


def resolve_decode_attention(backend: AttnBackend, device: torch.device) -> tuple[AttnBackend, DecodeAttnFn]:
    """The decode attention function for `backend`, and the backend actually used."""
    if backend not in ("torch", "triton"):
        raise ValueError(f"attn_backend must be 'torch' or 'triton', got {backend!r}")
    if backend == "triton":
        if device.type != "cuda":
            warnings.warn("triton attention needs a CUDA device; using the torch backend", stacklevel=3)
            return "torch", paged_decode_attention_torch
        try:
            from graphpool.kernels.decode_attention import paged_decode_attention
        except ImportError as exc:
            warnings.warn(
                f"triton decode attention unavailable ({exc}); using the torch backend", stacklevel=3
            )
            return "torch", paged_decode_attention_torch
        return "triton", paged_decode_attention
    return "torch", paged_decode_attention_torch


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        decode_attn: DecodeAttnFn,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.scale = config.head_dim**-0.5
        self.qkv_proj = ColumnLinear(
            config.hidden_size,
            (config.q_size, config.kv_size, config.kv_size),
            config.attention_bias,
            device,
            dtype,
        )
        self.o_proj = RowLinear(config.q_size, config.hidden_size, False, device, dtype)
        self.rotary = rotary
        self.decode_attn = decode_attn

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(meta.positions, q, k)
        k_cache, v_cache = kv_cache
        write_kv(k_cache, v_cache, meta.slot_mapping, k, v)
        if meta.is_prefill:
            if meta.seq_lens is None:
                raise ValueError("prefill AttentionMetadata needs seq_lens")
            o = prefill_attention(q, k, v, meta.seq_lens, self.scale)
        else:
            if meta.block_tables is None or meta.context_lens is None:
                raise ValueError("decode AttentionMetadata needs block_tables and context_lens")
            o = self.decode_attn(
                q, k_cache, v_cache, meta.block_tables, meta.context_lens, self.scale, meta.max_len_bound
            )
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        decode_attn: DecodeAttnFn,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.self_attn = LlamaAttention(config, rotary, decode_attn, device, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.mlp = SwiGLU(config, device, dtype)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), meta, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """`model(input_ids [T], meta, kv_caches) -> hidden [T, hidden]`; `compute_logits(hidden) -> [T, vocab]`.

    Parameters are allocated uninitialised on `device` in `dtype`; a loader fills them.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        attn_backend: AttnBackend = "torch",
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.config = config
        self.dtype = dtype
        self.attn_backend, decode_attn = resolve_decode_attention(attn_backend, device)
        self.max_positions = max_positions or config.max_position_embeddings
        self.embed_tokens = nn.Embedding(
            config.vocab_size,
            config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size, device=device, dtype=dtype),
            _freeze=True,
        )
        # NOTE: one rotary cache shared by all layers (a buffer, never reallocated per step).
        self.rotary = RotaryEmbedding(config, self.max_positions, device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, self.rotary, decode_attn, device, dtype)
            for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.lm_head: nn.Parameter | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Parameter(
                torch.empty(config.vocab_size, config.hidden_size, device=device, dtype=dtype),
                requires_grad=False,
            )

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head

    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_caches: Sequence[KVCache]
    ) -> torch.Tensor:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} per-layer KV caches, got {len(kv_caches)}")
        x = self.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, meta, kv_cache)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> float32 logits [T, vocab]."""
        return nn.functional.linear(hidden, self.lm_head_weight).float()

    def allocate_kv_caches(self, num_blocks: int, block_size: int) -> list[KVCache]:
        """Zeroed per-layer caches `[num_blocks, block_size, num_kv_heads, head_dim]` (for tests and tools)."""
        shape = (num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
        return [
            (
                torch.zeros(shape, device=self.device, dtype=self.dtype),
                torch.zeros(shape, device=self.device, dtype=self.dtype),
            )
            for _ in self.layers
        ]
