"""Our model on the embedded SmolLM2-135M-Instruct GGUF against transformers loading the same file."""

from __future__ import annotations

import pytest
import torch

from graphpool.model import PRESETS, AttentionMetadata, LlamaModel, Tokenizer
from graphpool.model.gguf_loader import unpermute_qk
from model_reference import hf_greedy, paged_greedy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4,",
    "The three primary colors are",
]


@pytest.fixture(scope="module")
def ours(default_model) -> tuple[LlamaModel, Tokenizer]:
    model, _, tok = default_model
    assert tok is not None
    return model, tok


@pytest.fixture(scope="module")
def hf_model(hf_default_model) -> torch.nn.Module:
    return hf_default_model


def test_gguf_config_is_smollm2(ours: tuple[LlamaModel, Tokenizer]) -> None:
    cfg, preset = ours[0].config, PRESETS["smollm2-135m"]
    assert cfg.tie_word_embeddings and ours[0].lm_head is None
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
    ):
        assert getattr(cfg, field) == getattr(preset, field), field
    assert cfg.rope_theta == preset.rope_theta and cfg.head_dim == 64


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    heads, head_dim, cols = 3, 8, 5
    w = torch.randn(heads * head_dim, cols)
    # llama.cpp's convert script: interleave the two rotary halves of every head
    permuted = w.reshape(heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(w.shape)
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_qk(permuted, heads), w)
    processor = LlamaTensorProcessor(config={"num_attention_heads": heads, "num_key_value_heads": heads})
    hf = processor.process(permuted.numpy(), "blk.0.attn_q.weight").weights
    assert torch.equal(unpermute_qk(permuted, heads), torch.from_numpy(hf))


def test_prefill_logits_match_transformers(
    ours: tuple[LlamaModel, Tokenizer], hf_model: torch.nn.Module
) -> None:
    model, tok = ours
    prompts = [tok.encode(p) for p in PROMPTS[:3]]
    # all three prompts in one prefill batch: attention must stay within each sequence
    kv = model.allocate_kv_caches(16, 16)
    total = sum(len(p) for p in prompts)
    meta = AttentionMetadata(
        is_prefill=True,
        positions=torch.cat([torch.arange(len(p)) for p in prompts]),
        slot_mapping=torch.arange(total) + 16,
        seq_lens=[len(p) for p in prompts],
    )
    with torch.no_grad():
        logits = model.compute_logits(model(torch.tensor([t for p in prompts for t in p]), meta, kv))
        start = 0
        for p in prompts:
            ref = hf_model(torch.tensor([p])).logits[0].float()
            torch.testing.assert_close(logits[start : start + len(p)], ref, atol=2e-4, rtol=1e-4)
            start += len(p)


def test_greedy_tokens_match_transformers(
    ours: tuple[LlamaModel, Tokenizer], hf_model: torch.nn.Module
) -> None:
    model, tok = ours
    prompts = [tok.encode(p) for p in PROMPTS]
    got = paged_greedy(model, prompts, 32, block_size=16)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(hf_model, prompt, 32), tok.decode(prompt)


def test_paged_decode_equals_prefill_recomputation(ours: tuple[LlamaModel, Tokenizer]) -> None:
    model, tok = ours
    seqs = [
        tok.encode("The quick brown fox jumps over the lazy dog. " * 2),
        tok.encode("Hello there, friend! How are you doing on this fine day?"),
    ]
    block_size, keep = 4, 5  # prefill `keep` tokens, then decode the rest one at a time
    # scattered, non-contiguous blocks (block 0 is the reserved dummy)
    perm = (torch.randperm(40, generator=torch.Generator().manual_seed(0)) + 1).tolist()
    tables = torch.tensor([perm[:10], perm[10:20]], dtype=torch.int32)

    def slot(i: int, p: int) -> int:
        return int(tables[i, p // block_size]) * block_size + p % block_size

    kv = model.allocate_kv_caches(41, block_size)
    with torch.no_grad():
        model(
            torch.tensor([t for s in seqs for t in s[:keep]]),
            AttentionMetadata(
                True,
                torch.arange(keep).repeat(2),
                torch.tensor([slot(i, p) for i in range(2) for p in range(keep)]),
                seq_lens=[keep, keep],
            ),
            kv,
        )
        steps = min(len(s) for s in seqs) - keep
        decoded = []
        for p in range(keep, keep + steps):
            meta = AttentionMetadata(
                False,
                torch.tensor([p, p]),
                torch.tensor([slot(0, p), slot(1, p)]),
                block_tables=tables,
                context_lens=torch.tensor([p + 1, p + 1], dtype=torch.int32),
                max_len_bound=40,
            )
            decoded.append(model.compute_logits(model(torch.tensor([s[p] for s in seqs]), meta, kv)))
        for i, s in enumerate(seqs):
            n = keep + steps
            full_kv = model.allocate_kv_caches(41, block_size)
            full = model.compute_logits(
                model(
                    torch.tensor(s[:n]),
                    AttentionMetadata(True, torch.arange(n), torch.arange(n) + 4, seq_lens=[n]),
                    full_kv,
                )
            )
            torch.testing.assert_close(
                torch.stack([d[i] for d in decoded]), full[keep:n], atol=1e-4, rtol=1e-4
            )


def test_tokenizer_round_trip_and_chat_template(ours: tuple[LlamaModel, Tokenizer]) -> None:
    _, tok = ours
    text = "Hello world! Graph pools are memory-honest. 123 + 456 = 579"
    ids = tok.encode(text)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text
    assert ids[0] != tok.bos_token_id  # SmolLM2's tokenizer adds no BOS by default
    assert 2 in tok.eos_token_ids  # <|im_end|>
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi!"}])
    rendered = tok.decode(chat, skip_special_tokens=False)
    assert rendered.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nHi!<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


def test_chat_answers_paris(ours: tuple[LlamaModel, Tokenizer]) -> None:
    model, tok = ours
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    tokens = paged_greedy(model, [prompt], 12)[0]
    assert "Paris" in tok.decode(tokens)
