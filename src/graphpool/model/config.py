"""Model configuration: one frozen dataclass for the Llama-shaped families (Llama 3.x, SmolLM2, Qwen2.x, Qwen3,
Qwen3-MoE, Mistral, Phi-3, Gemma 2, Gemma 3 text)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphpool.model.gemma2_config import gemma2_fields
from graphpool.model.gemma3_config import gemma3_fields
from graphpool.model.moe_config import MOE_REFUSED, MoeConfig, moe_fields
from graphpool.model.window_config import check_sliding, qwen_sliding_layers, smollm3_layers

# NOTE: model_type -> (q/k/v bias, decoder family). Qwen2 differs from Llama only by its q/k/v bias; Mistral
# is Llama with a sliding window; Phi-3 only fuses q/k/v and gate/up in its checkpoint (our layout).
_HF_MODEL_TYPES = {
    "llama": (False, "llama"),
    "qwen2": (True, "llama"),
    "mistral": (False, "llama"),
    "phi3": (False, "llama"),
    "qwen3": (False, "qwen3"),
    "gemma2": (False, "gemma2"),
    "gemma3_text": (False, "gemma3"),
    "qwen3_moe": (False, "qwen3_moe"),
    "smollm3": (False, "llama"),  # Llama with NoPE layers (ModelConfig.nope_layers)
    "olmo2": (False, "olmo2"),
    "granite": (False, "granite"),
}
# decoder families (model/families.py: their module classes); "qwen3": per-head q/k RMSNorm before rotary;
# "gemma2": Llama's attention (soft-capped scores) with Gemma's norms, GeLU MLP and embedding scale;
# "gemma3": Qwen3's attention plus Gemma's norms, GeLU MLP, embedding scale and two rotary bases;
# "qwen3_moe": Qwen3's attention, a routed mixture of SwiGLU experts in the sparse layers (ModelConfig.moe);
# "olmo2": norms after attention and MLP (none before), q/k RMSNorms over all heads together;
# "granite": Llama with four scales (ModelConfig.granite)
FAMILIES = ("llama", "qwen3", "gemma2", "gemma3", "qwen3_moe", "olmo2", "granite")
GEMMA_FAMILIES = ("gemma2", "gemma3")
# NOTE: types users ask for that graphpool refuses, with why (the generic "unsupported" would hide it)
_REFUSED_MODEL_TYPES = {
    "gemma": "the first Gemma's layer layout is not implemented (Gemma 2's and Gemma 3's, gemma2 and gemma3_text, "
             "are)",
    "gemma3": "the multimodal Gemma 3 (Gemma3ForConditionalGeneration) is not; its text-only form (gemma3_text, "
              "as gemma-3-1b) is",
    **MOE_REFUSED,
}
_GGUF_ARCHS = {"llama": False, "qwen2": True}


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style rotary frequency scaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor < 1.0:
            raise ValueError(f"rope scaling factor must be >= 1, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "rope scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings <= 0:
            raise ValueError("rope scaling original_max_position_embeddings must be positive")


@dataclass(frozen=True)
class GraniteScales:
    """Granite's scales (config.json's names): of the embedding, of the attention scores (in place of
    1/sqrt(head_dim)), of each layer output before it joins the residual stream, and the logits' divisor."""

    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"Granite's {name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    attention_bias: bool = False
    # per-frequency divisors of the rotary inverse frequencies [head_dim // 2] (a GGUF `rope_freqs` tensor:
    # how llama.cpp stores Llama-3 scaling); exclusive with rope_scaling
    rope_freq_factors: tuple[float, ...] | None = None
    # attention over the last N positions only (Mistral, Phi-3, the Gemmas' local layers, Qwen2/3 with
    # use_sliding_window), in the layers of sliding_layers (None: every layer)
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] | None = None
    # the decoder's module classes (one of FAMILIES): the same weights mean a different network per family
    family: str = "llama"
    # Gemma 2 and 3: attention scaled by query_pre_attn_scalar ** -0.5 (not head_dim's). Gemma 3's sliding-window
    # layers (local_layers) rotate with their own base local_rope_theta, unscaled
    query_pre_attn_scalar: float | None = None
    local_rope_theta: float | None = None
    local_layers: tuple[int, ...] = ()
    # Gemma 2: cap * tanh(x / cap) of the scaled attention scores and of the final logits (None: off)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # Qwen3-MoE: the router and experts of the sparse layers (the others keep the dense MLP)
    moe: MoeConfig | None = None
    # SmolLM3: the layers whose attention applies no rotary (NoPE), every fourth by default
    nope_layers: tuple[int, ...] = ()
    # Granite: its four scales (the granite family's, and it needs them)
    granite: GraniteScales | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"ModelConfig.family must be one of {FAMILIES}, got {self.family!r}")
        if (self.family == "qwen3_moe") != (self.moe is not None):
            raise ValueError("ModelConfig.moe is the qwen3_moe family's, and it needs one")
        if (self.family == "granite") != (self.granite is not None):
            raise ValueError("ModelConfig.granite is the granite family's, and it needs its scales")
        if (self.family in GEMMA_FAMILIES) != (self.query_pre_attn_scalar is not None):
            raise ValueError("query_pre_attn_scalar is Gemma 2's and Gemma 3's, and they need it")
        if (self.family == "gemma3") != (self.local_rope_theta is not None):
            raise ValueError("local_rope_theta is Gemma 3's, and it needs it")
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"ModelConfig.{name} must be a positive number (or None), got {value!r}")
        check_sliding(self.sliding_window, self.sliding_layers, self.num_layers)
        for name in ("local_layers", "nope_layers"):
            if any(not 0 <= i < self.num_layers for i in getattr(self, name)):
                raise ValueError(f"{name} must be layer indices below {self.num_layers}, got {getattr(self, name)}")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not (self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps)):
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta}")
        if self.rope_freq_factors is not None:
            if self.rope_scaling is not None:
                raise ValueError("rope_freq_factors and rope_scaling are exclusive")
            if len(self.rope_freq_factors) != self.head_dim // 2 or min(self.rope_freq_factors) <= 0:
                raise ValueError(f"rope_freq_factors must be {self.head_dim // 2} positive numbers")
        ids = [*self.eos_token_ids] + ([self.bos_token_id] if self.bos_token_id is not None else [])
        for tid in ids:
            if not 0 <= tid < self.vocab_size:
                raise ValueError(f"special token id {tid} outside the vocabulary [0, {self.vocab_size})")

    def layer_window(self, index: int) -> int:
        """Layer `index`'s sliding window in positions, 0 where it attends to the whole context."""
        if self.sliding_window is None or (self.sliding_layers is not None and index not in self.sliding_layers):
            return 0
        return self.sliding_window

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        dense = 3 * self.hidden_size * self.intermediate_size
        sparse = dense if self.moe is None else self.moe.sparse_mlp_params(self.hidden_size)
        layer = attn + 2 * self.hidden_size
        if self.family in ("qwen3", "gemma3", "qwen3_moe"):  # q/k norms
            layer += 2 * self.head_dim
        if self.family == "olmo2":  # q/k norms over all heads
            layer += self.q_size + self.kv_size
        if self.family in GEMMA_FAMILIES:  # pre/post feed-forward norms
            layer += 2 * self.hidden_size
        mlps = sum(sparse if self.moe is not None and self.moe.is_sparse(i) else dense for i in range(self.num_layers))
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + mlps + embed + self.hidden_size

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """From a Hugging Face `config.json` dict (transformers 4.x `rope_scaling` or 5.x `rope_parameters`)."""
        model_type = cfg.get("model_type")
        if model_type in _REFUSED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {model_type!r}: {_REFUSED_MODEL_TYPES[model_type]}; graphpool "
                             f"runs {sorted(_HF_MODEL_TYPES)} models")
        if model_type not in _HF_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}: graphpool runs {sorted(_HF_MODEL_TYPES)} models"
            )
        quant = cfg.get("quantization_config")
        if quant:
            method = quant.get("quant_method", "?") if isinstance(quant, Mapping) else "?"
            raise ValueError(f"quantized checkpoints are not supported (quantization_config: {method}): graphpool "
                             "loads bf16/fp16/fp32 safetensors; use the unquantized model")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        bias, family = _HF_MODEL_TYPES[model_type]
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        # a family's own fields, read here (Gemma 3's rotary and activation: the generic reading skips them)
        extra: dict[str, Any] = moe_fields(cfg) if family == "qwen3_moe" else {}
        if family == "gemma3":
            extra = gemma3_fields(cfg, head_dim)
            cfg = {**cfg, "rope_parameters": None, "rope_scaling": None, "hidden_act": "silu"}
        elif family == "gemma2":  # its activation is read there; the rotary is every family's
            extra = gemma2_fields(cfg, head_dim)
            cfg = {**cfg, "hidden_act": "silu"}
        rope = dict(cfg.get("rope_parameters") or {})
        if cfg.get("rope_scaling"):
            rope.update(cfg["rope_scaling"])
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling: RopeScaling | None = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        elif rope_type not in ("default", None):
            raise ValueError(f"unsupported rope type {rope_type!r} (supported: default, llama3)")
        eos = cfg.get("eos_token_id")
        eos_ids = (
            () if eos is None else (tuple(int(e) for e in eos) if isinstance(eos, list) else (int(eos),))
        )
        bos = cfg.get("bos_token_id")
        attention_bias = bias or bool(cfg.get("attention_bias", False))
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported (graphpool's MLP is SwiGLU: silu)")
        rotary_fraction = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        if rotary_fraction != 1.0:
            raise ValueError(f"partial_rotary_factor {rotary_fraction} is not supported (rotary over whole heads only)")
        window, sliding_layers = cfg.get("sliding_window"), None
        if model_type in ("qwen2", "qwen3", "qwen3_moe"):
            window, sliding_layers = qwen_sliding_layers(cfg)
        if model_type == "smollm3":
            extra["nope_layers"], window, sliding_layers = smollm3_layers(cfg)
        if model_type == "granite":
            extra["granite"] = GraniteScales(**{k: float(cfg.get(k, 1.0)) for k in (
                "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")})
        fields: dict[str, Any] = dict(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=eos_ids,
            attention_bias=attention_bias,
            sliding_window=None if window is None else int(window),
            sliding_layers=sliding_layers,
            family=family,
        )
        return cls(**(fields | extra))

    @classmethod
    def from_gguf_metadata(
        cls,
        meta: Mapping[str, Any],
        *,
        has_output_weight: bool,
        rope_freq_factors: tuple[float, ...] | None = None,
    ) -> ModelConfig:
        """From GGUF key/value metadata (plain Python values). `has_output_weight`: the file holds
        `output.weight` (an untied lm head); `rope_freq_factors`: its `rope_freqs` tensor, if any."""
        arch = meta.get("general.architecture")
        if arch not in _GGUF_ARCHS:
            raise ValueError(f"unsupported GGUF architecture {arch!r}: graphpool runs {sorted(_GGUF_ARCHS)}")

        def get(key: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{key}", default)

        hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
        vocab = get("vocab_size")
        if vocab is None:
            vocab = len(meta["tokenizer.ggml.tokens"])
        scaling: RopeScaling | None = None
        if get("rope.scaling.type") not in (None, "none"):
            raise ValueError(f"unsupported GGUF rope scaling {get('rope.scaling.type')!r}")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        bos = meta.get("tokenizer.ggml.bos_token_id")
        return cls(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=heads,
            num_kv_heads=int(get("attention.head_count_kv", heads)),
            head_dim=int(get("attention.key_length", hidden // heads)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(get("context_length", 8192)),
            tie_word_embeddings=not has_output_weight,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=() if eos is None else (int(eos),),
            attention_bias=_GGUF_ARCHS[arch],
            rope_freq_factors=rope_freq_factors,
        )
