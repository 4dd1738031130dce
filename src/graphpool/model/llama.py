"""Llama-family decoder (Llama 3.x, SmolLM2, Qwen2.x) in plain torch modules. No graph logic here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from graphpool.kernels.gemv import RowNorm
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.attn_ops import prefill_attention
from graphpool.model.config import ModelConfig
from graphpool.model.int4 import Q8_HEAD_MAX_ROWS, Q8Head
from graphpool.model.layers import NoRotary, RMSNorm, RotaryEmbedding, SwiGLU
from graphpool.model.linear import ColumnLinear, RowLinear
from graphpool.model.ops import AttnBackend, ModelOps, resolve_ops
from graphpool.model.tp_group import DONE, SINGLE, TPGroup

__all__ = ["AttnBackend", "KVCache", "LlamaModel"]

KVCache = tuple[torch.Tensor, torch.Tensor]


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        ops: ModelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        # NOTE: Gemma scales by query_pre_attn_scalar, every other family by head_dim
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        # NOTE: Gemma 2's soft cap of the scores (0: off), passed only when on: ops without it serve the rest
        self.softcap = config.attn_logit_softcapping or 0.0
        self.set_window(0)
        self.qkv_proj = ColumnLinear(
            config.hidden_size,
            (config.q_size, config.kv_size, config.kv_size),
            config.attention_bias,
            device,
            dtype,
            ops.linear,
        )
        self.o_proj = RowLinear(config.q_size, config.hidden_size, False, device, dtype, ops.linear)
        self.rotary = rotary
        self.ops = ops

    def set_window(self, window: int) -> None:
        """This layer's sliding window in positions (0: the whole context); the model sets it per layer."""
        self.window = window
        # NOTE: softcap and window passed only when on: ops without them serve the other families
        self._attn_kw: dict[str, float | int] = {"softcap": self.softcap} if self.softcap else {}
        if window:
            self._attn_kw["window"] = window

    fuses_rope = True  # decode may fold the rotary and the KV write into the projection (not with q/k norms)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache, reduce: bool = True) -> torch.Tensor:
        """`reduce=False`: the output before o_proj's all-reduce (a rank's partial sum under tensor parallel)."""
        fused = self._fused_qkv(x, None, meta, kv_cache)
        if fused is not None:
            return self._attend(self._query(fused[0]), None, meta, kv_cache, reduce)
        k_cache, v_cache = kv_cache
        q, k, v = self.project(x)
        q, k = self.ops.rotary_and_write_kv(
            meta.positions, q, k, v, self.rotary.cos, self.rotary.sin, k_cache, v_cache, meta.slot_mapping
        )
        return self._attend(q, (k, v), meta, kv_cache, reduce)

    def forward_normed(
        self, x: torch.Tensor, norm: RowNorm, meta: AttentionMetadata, kv_cache: KVCache, reduce: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`forward` of the RMSNorm `norm` of x, the norm folded into the fused qkv projection: (the output, the
        stream (`kernels.gemv.fused_linear_rope`'s)), or None where that fusion does not apply (the caller norms
        and calls `forward`)."""
        fused = self._fused_qkv(x, norm, meta, kv_cache)
        if fused is None:
            return None
        qkv, stream = fused
        return self._attend(self._query(qkv), None, meta, kv_cache, reduce), stream

    def _fused_qkv(
        self, x: torch.Tensor, norm: RowNorm | None, meta: AttentionMetadata, kv_cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if meta.is_prefill or not self.fuses_rope:
            return None
        proj = self.qkv_proj
        return self.ops.fused_linear_rope(
            x, proj.weight, proj.bias, meta.positions, self.rotary.cos, self.rotary.sin, *kv_cache,
            meta.slot_mapping, (self.num_heads, self.num_kv_heads, self.head_dim), norm=norm,
        )  # fmt: skip

    def _query(self, qkv: torch.Tensor) -> torch.Tensor:
        return qkv[:, : self.qkv_proj.sizes[0]].view(-1, self.num_heads, self.head_dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x -> q, k, v in heads, before the rotary."""
        proj = self.qkv_proj
        q, k, v = proj(x).split(proj.sizes, dim=-1)
        return (q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))

    def _attend(
        self, q: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor] | None, meta: AttentionMetadata,
        kv_cache: KVCache, reduce: bool,
    ) -> torch.Tensor:  # fmt: skip
        """Attention of the rotated q, then o_proj; `new_kv`: the step's own rotated k and v (prefill attends
        to them; decode reads them from the caches, where they are already stored)."""
        k_cache, v_cache = kv_cache
        if meta.is_prefill:
            if meta.seq_lens is None or new_kv is None:
                raise ValueError("prefill AttentionMetadata needs seq_lens (and the step's k, v)")
            o = prefill_attention(q, *new_kv, meta.seq_lens, self.scale, **self._attn_kw)  # type: ignore[arg-type]
        else:
            if meta.block_tables is None or meta.context_lens is None:
                raise ValueError("decode AttentionMetadata needs block_tables and context_lens")
            o = self.ops.decode_attention(
                q, k_cache, v_cache, meta.block_tables, meta.context_lens, self.scale, meta.max_len_bound,
                **self._attn_kw,
            )
        o = self.o_proj.partial(o.reshape(-1, self.num_heads * self.head_dim))
        return self.o_proj.tp.all_reduce(o) if reduce else o


class LlamaDecoderLayer(nn.Module):
    # NOTE: a family with its own attention or MLP (model/qwen3.py) subclasses the layer and names them here
    attention_cls: type[LlamaAttention] = LlamaAttention
    # NOTE: built as mlp_cls(config, device, dtype, ops); called as mlp(h, reduce=False) by mlp_stage
    mlp_cls: type[nn.Module] = SwiGLU

    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        ops: ModelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.self_attn = self.attention_cls(config, rotary, ops, device, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.mlp = self.mlp_cls(config, device, dtype, ops)
        self.ops = ops

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata, kv_cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual-stream form: `x` is the previous layer's output delta, `residual` the stream before it
        (None for the first layer). Returns (this layer's delta, the stream before it)."""
        tp = self.self_attn.o_proj.tp
        h, residual = self.attention_stage(x, residual, meta, kv_cache)
        h, residual = self.mlp_stage(tp.all_reduce(h), residual, meta, kv_cache)
        return tp.all_reduce(h), residual

    # NOTE: the layer's two halves, each ending where an all-reduce starts (microbatch overlap interleaves
    # them: one microbatch's reduce runs while the other computes); each returns a partial sum, unreduced.
    def attention_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata, kv_cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm1 = self.input_layernorm
        fused = self.self_attn.forward_normed(x, RowNorm(residual, norm1.weight, norm1.eps), meta, kv_cache, False)
        if fused is not None:
            return fused
        if residual is None:
            residual, h = x, self.ops.rms_norm(x, norm1.weight, norm1.eps)
        else:
            h, residual = self.ops.add_rms_norm(x, residual, norm1.weight, norm1.eps)
        return self.self_attn(h, meta, kv_cache, reduce=False), residual

    def mlp_stage(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            raise ValueError("the MLP stage follows an attention stage: it needs the residual stream")
        norm2 = self.post_attention_layernorm
        fused = self.mlp.forward_normed(x, RowNorm(residual, norm2.weight, norm2.eps), reduce=False)
        if fused is not None:
            return fused
        h, residual = self.ops.add_rms_norm(x, residual, norm2.weight, norm2.eps)
        return self.mlp(h, reduce=False), residual


class LlamaModel(nn.Module):
    """`model(input_ids [T], meta, kv_caches) -> hidden [T, hidden]`; `compute_logits(hidden) -> [T, vocab]`.

    Parameters are allocated uninitialised on `device` in `dtype`; a loader fills them. `attn_backend`
    picks the operations (`ModelOps`): "torch" (reference) or "triton" (graphpool.kernels on CUDA; falls back
    to torch with a warning where unavailable), with the kernel switches named in `disabled_kernels` off
    (`kernels/switches.py`). `ops` overrides the choice (tests). A family's subclass names its layer in
    `layer_cls` (model/families.py picks the class of a config).
    """

    layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(
        self,
        config: ModelConfig,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        attn_backend: AttnBackend = "torch",
        max_positions: int | None = None,
        ops: ModelOps | None = None,
        disabled_kernels: Iterable[str] = (),
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.config = config
        self.dtype = dtype
        self.ops = ops if ops is not None else resolve_ops(attn_backend, device, disabled_kernels)
        self.attn_backend: AttnBackend = self.ops.backend
        self.max_positions = max_positions or config.max_position_embeddings
        if self.max_positions <= 0:
            raise ValueError(f"max_positions must be positive, got {self.max_positions}")
        # NOTE: before any allocation: the rotary cache and the KV sizing scale with this length.
        if self.max_positions > config.max_position_embeddings:
            raise ValueError(
                f"max_model_len={self.max_positions} is past this model's context of "
                f"{config.max_position_embeddings} tokens (max_position_embeddings): set max_model_len <= "
                f"{config.max_position_embeddings}"
            )
        self.embed_tokens = nn.Embedding(
            config.vocab_size,
            config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size, device=device, dtype=dtype),
            _freeze=True,
        )
        # NOTE: one rotary cache shared by all layers (a buffer, never reallocated per step).
        self.rotary = RotaryEmbedding(config, self.max_positions, device)
        self.layers = nn.ModuleList(
            self.make_layer(i, config, self.rotary, self.ops, device, dtype) for i in range(config.num_layers)
        )
        for i, layer in enumerate(self.layers):
            layer.self_attn.set_window(config.layer_window(i))
        if config.nope_layers:
            self.no_rotary = NoRotary(config.head_dim, self.max_positions, device)
            for i in config.nope_layers:
                self.layers[i].self_attn.rotary = self.no_rotary
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        # NOTE: a tensor-parallel shard (model.parallel.shard_model) holds its rank's KV heads and vocab rows
        self.tp: TPGroup = SINGLE
        self.num_kv_heads = config.num_kv_heads
        self.lm_head: nn.Parameter | None = None
        # NOTE: a GGUF's Q8_0 head kept 8-bit on the CPU (model/int4.py); it computes the logits when set
        self.q8_head: Q8Head | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Parameter(
                torch.empty(config.vocab_size, config.hidden_size, device=device, dtype=dtype),
                requires_grad=False,
            )

    def make_layer(self, index: int, config: ModelConfig, rotary: RotaryEmbedding, ops: ModelOps,
                   device: torch.device, dtype: torch.dtype) -> LlamaDecoderLayer:
        """Layer `index` (a family whose layers differ by index picks its class here)."""
        return self.layer_cls(config, rotary, ops, device, dtype)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def from_checkpoint(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A checkpoint tensor as this model stores it (the weight loader's hook: a family may store it in
        another form, computed once)."""
        return tensor

    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_caches: Sequence[KVCache]
    ) -> torch.Tensor:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} per-layer KV caches, got {len(kv_caches)}")
        x, residual = self.embed(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, meta, kv_cache)
        assert residual is not None
        return self.ops.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]

    def forward_microbatches(
        self, microbatches: Sequence[tuple[torch.Tensor, AttentionMetadata]], kv_caches: Sequence[KVCache]
    ) -> list[torch.Tensor]:
        """`forward` of several batches at once, their layers interleaved so that each all-reduce of one
        overlaps the next stage's compute of the others (tensor parallel's microbatch overlap): per layer
        stage, each microbatch waits for its own reduce, computes the stage and starts the next reduce.
        A microbatch of no rows is left out (every rank splits the same way, so their collectives still
        match). With one rank it computes exactly `forward`'s ops, microbatch by microbatch."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} per-layer KV caches, got {len(kv_caches)}")
        live = [i for i, (ids, _) in enumerate(microbatches) if ids.shape[0]]
        xs = {i: self.embed(microbatches[i][0]) for i in live}
        residuals: dict[int, torch.Tensor | None] = dict.fromkeys(live)
        pending = {i: DONE for i in live}
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            for stage in (layer.attention_stage, layer.mlp_stage):
                for i in live:
                    pending[i].wait()
                    xs[i], residuals[i] = stage(xs[i], residuals[i], microbatches[i][1], kv_cache)
                    pending[i] = self.tp.all_reduce_async(xs[i])
        out = [torch.empty((0, self.config.hidden_size), device=self.device, dtype=self.dtype)] * len(microbatches)
        for i in live:
            pending[i].wait()
            residual = residuals[i]
            assert residual is not None
            out[i] = self.ops.add_rms_norm(xs[i], residual, self.norm.weight, self.norm.eps)[0]
        return out

    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        """hidden [T, hidden] -> logits [T, vocab]: float32, or the model's dtype with ``upcast=False`` (a
        captured decode graph then holds a third of the logits bytes: 2 bytes a row entry instead of 2 + 4)."""
        if self.q8_head is not None and hidden.shape[0] <= Q8_HEAD_MAX_ROWS:
            logits = self.q8_head(hidden)
        else:
            logits = self.ops.linear(hidden, self.lm_head_weight, None)
        if self.tp.world_size > 1:  # this rank's vocab rows -> all of them (the last shard is zero-padded)
            logits = self.tp.gather_last_dim(logits)[:, : self.config.vocab_size]
        logits, cap = (logits.float() if upcast else logits), self.config.final_logit_softcapping
        # NOTE: in the logits' own dtype, as transformers caps them (monotonic: the greedy token is unchanged)
        return torch.tanh(logits / cap) * cap if cap else logits

    def allocate_kv_caches(self, num_blocks: int, block_size: int) -> list[KVCache]:
        """Zeroed per-layer caches `[num_blocks, block_size, num_kv_heads, head_dim]` in the model's dtype
        (this rank's KV heads under tensor parallelism)."""
        shape = (num_blocks, block_size, self.num_kv_heads, self.config.head_dim)
        return [
            (
                torch.zeros(shape, device=self.device, dtype=self.dtype),
                torch.zeros(shape, device=self.device, dtype=self.dtype),
            )
            for _ in self.layers
        ]
