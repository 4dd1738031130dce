"""A minimal paged-KV greedy loop over the model alone (no scheduler, no graphs): a reference for tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.llama import LlamaModel

# Prompts of the parity tests against transformers (CPU engine tests use the first five, the GPU test all).
PARITY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived",
    "The theory of relativity was proposed by Albert Einstein in 1905. It says that",
    "Q: What is 7 times 8?\nA:",
    "Here is a recipe for pancakes. Ingredients:",
    "The three primary colors are",
    "import numpy as np\n\ndef softmax(x):",
]


@torch.no_grad()
def paged_greedy(
    model: LlamaModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, block_size: int = 16
) -> list[list[int]]:
    """Prefill all prompts in one batch, then decode them together greedily for `max_new_tokens` tokens
    (no stop tokens). Sequence i owns a contiguous run of blocks; block 0 stays reserved as the dummy."""
    device = model.device
    max_len = max(len(p) for p in prompts) + max_new_tokens
    blocks_per_seq = -(-max_len // block_size)
    tables = torch.tensor(
        [[1 + i * blocks_per_seq + j for j in range(blocks_per_seq)] for i in range(len(prompts))],
        dtype=torch.int32,
        device=device,
    )
    kv = model.allocate_kv_caches(1 + len(prompts) * blocks_per_seq, block_size)

    def slots(i: int, positions: torch.Tensor) -> torch.Tensor:
        return tables[i].long()[positions // block_size] * block_size + positions % block_size

    positions = [torch.arange(len(p), device=device) for p in prompts]
    meta = AttentionMetadata(
        is_prefill=True,
        positions=torch.cat(positions),
        slot_mapping=torch.cat([slots(i, pos) for i, pos in enumerate(positions)]),
        seq_lens=[len(p) for p in prompts],
    )
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=device)
    hidden = model(ids, meta, kv)
    last = torch.tensor([len(p) for p in prompts], device=device).cumsum(0) - 1
    next_ids = model.compute_logits(hidden[last]).argmax(-1)
    out = [next_ids]
    pos = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
    for _ in range(max_new_tokens - 1):
        meta = AttentionMetadata(
            is_prefill=False,
            positions=pos,
            slot_mapping=torch.stack([slots(i, pos[i]) for i in range(len(prompts))]),
            block_tables=tables,
            context_lens=(pos + 1).to(torch.int32),
            max_len_bound=max_len,
        )
        next_ids = model.compute_logits(model(next_ids, meta, kv)).argmax(-1)
        out.append(next_ids)
        pos = pos + 1
    return torch.stack(out, dim=1).tolist()


# Llama-3 rope scaling of `tiny_hf_model("llama", ...)`: a short original context so that positions past 32
# exercise the scaled frequencies.
TINY_HF_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def tiny_hf_model(kind: str, tied: bool, **overrides: Any) -> torch.nn.Module:
    """A tiny random transformers model in eval mode: "llama" (Llama-3 rope scaling), "mistral" (a sliding window of 200), "qwen2" (q/k/v bias),
    "qwen3" (q/k norms, head_dim 32 != hidden / heads), "phi3" (fused q/k/v and gate/up weights, a sliding
    window of 200), "gemma2" (3 layers, a window of 128, soft caps 2 and 3: transformers' eager attention),
    "gemma3" (gemma3_text, 3 layers, a window of 128), "smollm3" (4 layers, the rotary left out of layers 1 and 3),
    "olmo2" (norms after attention and MLP, q/k norms over all heads), "granite" (Granite 3's four scales, at values
    far from 1) or "qwen3_moe" (Qwen3's attention, 3 layers, 8 experts, top-2); 2 layers, hidden 64, 4 query / 2 KV heads, vocab 300, or the config fields in `overrides`;
    weights seeded (torch.manual_seed(0))."""
    import transformers

    common = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tied,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **overrides,
    }
    torch.manual_seed(0)
    model: torch.nn.Module
    if kind == "llama":
        scaling = {"rope_type": "llama3", **TINY_HF_ROPE_SCALING}
        config = transformers.LlamaConfig(**common, rope_theta=10000.0, rope_scaling=scaling)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "mistral":
        config = transformers.MistralConfig(**{"sliding_window": 200, **common}, rope_theta=1e6)
        model = transformers.MistralForCausalLM(config)
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, rope_theta=1e6))
    elif kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{"head_dim": 32, **common}, rope_theta=1e6))
    elif kind == "phi3":
        config = transformers.Phi3Config(**{"sliding_window": 200, **common}, pad_token_id=0, rope_theta=10000.0)
        model = transformers.Phi3ForCausalLM(config)
    elif kind == "gemma2":
        # 3 layers: sliding, full, sliding; soft caps low enough to bend these weights' scores and logits
        fields = {"head_dim": 32, "sliding_window": 128, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 2.0,
                  "final_logit_softcapping": 3.0, **common, "num_hidden_layers": 3}
        config = transformers.Gemma2Config(**fields, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                                           pad_token_id=0, attn_implementation="eager")
        model = transformers.Gemma2ForCausalLM(config)
    elif kind == "gemma3":
        # 3 layers: sliding, sliding, full (pattern 3); linear rope scaling on the full layer
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
        fields = {"head_dim": 32, "sliding_window": 128, "query_pre_attn_scalar": 24, **common, "num_hidden_layers": 3}
        config = transformers.Gemma3TextConfig(**fields, layer_types=["sliding_attention"] * 2 + ["full_attention"],
                                               rope_parameters=rope, pad_token_id=0)
        model = transformers.Gemma3ForCausalLM(config)
    elif kind == "smollm3":
        # 4 layers, NoPE in every second (layers 1 and 3)
        fields = {**common, "num_hidden_layers": overrides.get("num_hidden_layers", 4), "no_rope_layer_interval": 2}
        model = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**fields, rope_theta=2e6, pad_token_id=0))
    elif kind == "granite":
        scales = {"embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
                  "logits_scaling": 8.0}
        model = transformers.GraniteForCausalLM(transformers.GraniteConfig(**common, **scales, rope_theta=1e7,
                                                                           pad_token_id=0))
    elif kind == "olmo2":
        model = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**common, rope_theta=5e5, pad_token_id=0))
        with torch.no_grad():  # NOTE: norm weights other than ones, so each one's place is checked
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.uniform_(0.5, 1.5)
    elif kind == "qwen3_moe":
        # 3 layers, 8 experts of width 48, top-2 renormalised; layer 1 dense (mlp_only_layers) unless overridden
        fields = {"head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                  "norm_topk_prob": True, "mlp_only_layers": [1], **common}
        fields["num_hidden_layers"] = overrides.get("num_hidden_layers", 3)
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**fields, rope_theta=1e6))
    else:
        raise ValueError(f"no tiny model of kind {kind!r}")
    # bigger-than-default weights (and nonzero biases) so that a wrong layout cannot hide behind tiny values
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    return model.eval()


def hf_greedy(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens from transformers with its own KV cache (EOS not special: always `n`)."""
    tokens: list[int] = []
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = hf(torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def record_steps(engine: Any) -> list:
    """Wraps `engine.step` (an LLMEngine's) so that every step's StepInfo (`engine.last_step`, when there is
    one) is appended to the list returned."""
    steps: list = []
    step = engine.step

    def recording_step() -> Any:
        out = step()
        if engine.last_step is not None:
            steps.append(engine.last_step)
        return out

    engine.step = recording_step
    return steps


def run_waves(engine: Any, prompts: Sequence[Sequence[int]], waves: Sequence[Sequence[int]], max_tokens: int,
              ignore_eos: bool = True, prefix: str = "r") -> dict[str, list[int]]:
    """Greedy token ids per request id (``prefix`` + prompt index) from an LLMEngine, wave by wave: a wave is
    added once the previous one finished (so its prompts' prefixes are cached by then)."""
    from graphpool.engine.sampling_params import SamplingParams

    out: dict[str, list[int]] = {}
    for wave in waves:
        for i in wave:
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)
            engine.add_request(f"{prefix}{i}", list(prompts[i]), params)
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    out[o.request_id] = o.token_ids
    return out


def prefill_logits_match(model: LlamaModel, hf: torch.nn.Module, vocab_size: int) -> torch.Tensor:
    """One 100-token prefill through the paged model: its logits equal transformers' (float32 tolerance);
    returns the prompt ids (seeded)."""
    ids = torch.randint(0, vocab_size, (100,), generator=torch.Generator().manual_seed(1))
    kv = model.allocate_kv_caches(8, 16)
    meta = AttentionMetadata(True, torch.arange(100), torch.arange(100) + 16, seq_lens=[100])
    with torch.no_grad():
        ours = model.compute_logits(model(ids, meta, kv))
        ref = hf(ids[None]).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    return ids


def save_tiny_hf_folder(folder: Path, generation_config: dict[str, Any] | None = None, *,
                        tokenizer: bool = False) -> Path:
    """`tiny_hf_model("llama", tied=True)` saved as a Hugging Face folder; with `tokenizer`, the embedded default
    model's tokenizer and chat template beside it (and the model's vocabulary widened to theirs); with
    `generation_config`, that generation_config.json in place of the one transformers writes."""
    import json

    from graphpool.model.gguf_loader import default_gguf_path
    from graphpool.model.tokenizer import tokenizer_from_gguf

    tiny_hf_model("llama", tied=True, **({"vocab_size": 49152} if tokenizer else {})).save_pretrained(folder)
    if tokenizer:
        tokenizer_from_gguf(default_gguf_path(), None, ()).hf.save_pretrained(folder)
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder
