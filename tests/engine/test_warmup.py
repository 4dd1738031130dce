"""The start-up warm-up of the eager prefill path (engine/warmup.py): which lengths, and that it leaves every
request's KV cache alone (it writes only the dummy block)."""

from __future__ import annotations

import dataclasses

import torch

from graphpool.engine.kv_cache import DUMMY_BLOCK
from graphpool.engine.warmup import WARMUP_MAX_TOKENS, prefill_warmup_lengths, warm_eager_prefill
from graphpool.kernels.gemv import MAX_ROWS
from graphpool.model.llama import LlamaModel
from graphpool.model.presets import PRESETS
from graphpool.model.weights import init_random_weights


def test_the_lengths_pass_the_graph_prefill_bound_and_stop_at_the_cap() -> None:
    assert prefill_warmup_lengths(256, 4096, 2048) == (257, 2048)
    assert prefill_warmup_lengths(0, 4096, 8192) == (1, WARMUP_MAX_TOKENS)
    assert prefill_warmup_lengths(256, 512, 300) == (257, 300)
    assert prefill_warmup_lengths(256, 4096, 100) == (100,)


def test_the_warmup_writes_only_the_dummy_block() -> None:
    config = dataclasses.replace(PRESETS["qwen2.5-0.5b"], num_layers=2, hidden_size=128, intermediate_size=256,
                                 vocab_size=1001, bos_token_id=1, eos_token_ids=(2,))
    model = LlamaModel(config, max_positions=64)
    init_random_weights(model, seed=1)
    kv = model.allocate_kv_caches(8, 4)
    for k, v in kv:
        k.normal_()
        v.normal_()
    before = [(k.clone(), v.clone()) for k, v in kv]
    warm_eager_prefill(model, kv, (5, 40))
    for (k, v), (k0, v0) in zip(kv, before, strict=True):
        keep = torch.ones(k.shape[0], dtype=torch.bool)
        keep[DUMMY_BLOCK] = False
        assert torch.equal(k[keep], k0[keep]) and torch.equal(v[keep], v0[keep])
        assert not torch.equal(k[DUMMY_BLOCK], k0[DUMMY_BLOCK])  # it did run the layers


def test_the_warmup_runs_the_samplers_kernels_in_the_models_dtype_and_float32() -> None:
    """Their first calls compile on CUDA: the warm-up makes them, for the logits the decode step gives (the
    model's dtype) and for the float32 copy that penalties, min_tokens and grammars sample from, and the draw
    both without a cut (2 ints a row) and with one (5: its own compiled variant)."""
    config = dataclasses.replace(PRESETS["qwen2.5-0.5b"], num_layers=1, hidden_size=64, intermediate_size=128,
                                 vocab_size=301, bos_token_id=1, eos_token_ids=(2,))
    model = LlamaModel(config, max_positions=32, dtype=torch.bfloat16)
    init_random_weights(model, seed=1)
    seen: list[tuple] = []

    def argmax(x: torch.Tensor) -> torch.Tensor:
        seen.append(("argmax", x.dtype, tuple(x.shape)))
        return x.argmax(-1)

    def draw(x: torch.Tensor, params: torch.Tensor) -> None:
        assert params.dtype == torch.int64
        seen.append(("draw", x.dtype, tuple(x.shape), params.shape[0]))

    model.ops = dataclasses.replace(model.ops, step_argmax=argmax, step_sample=draw)
    warm_eager_prefill(model, model.allocate_kv_caches(4, 4), (5,))
    assert seen == [("argmax", torch.bfloat16, (1, 301)), ("draw", torch.bfloat16, (1, 301), 2),
                    ("draw", torch.bfloat16, (1, 301), 5), ("argmax", torch.float32, (1, 301)),
                    ("draw", torch.float32, (1, 301), 2), ("draw", torch.float32, (1, 301), 5)]


def test_the_warmup_runs_the_few_row_gemv_in_the_layers_and_the_lm_head() -> None:
    """A two-row step takes the few-row GEMV (its own compiled variants, one per projection width): the warm-up
    prefills MAX_ROWS tokens and takes the LM head over each of them, besides its given lengths."""
    config = dataclasses.replace(PRESETS["qwen2.5-0.5b"], num_layers=1, hidden_size=64, intermediate_size=128,
                                 vocab_size=301, bos_token_id=1, eos_token_ids=(2,))
    model = LlamaModel(config, max_positions=32)
    init_random_weights(model, seed=1)
    prefills: list[int] = []
    heads: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: prefills.append(args[0].shape[0]))
    head = model.compute_logits
    model.compute_logits = lambda h, **kw: heads.append(h.shape[0]) or head(h, **kw)  # type: ignore[method-assign]
    warm_eager_prefill(model, model.allocate_kv_caches(4, 4), (5, 9))
    assert prefills == [MAX_ROWS, 5, 9]
    assert heads == [MAX_ROWS, 1, 1]
