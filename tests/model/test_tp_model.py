"""Tensor-parallel model shards (graphpool.model.parallel) on two gloo processes: the same logits as the
whole model, for prefill and paged decode; what cannot be sharded is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gloo_ranks import run_ranks
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.llama import LlamaModel
from graphpool.model.parallel import rank_config, shard_model
from graphpool.model.presets import PRESETS
from graphpool.model.tp_group import TPGroup
from graphpool.model.weights import init_random_weights

# qwen2.5-0.5b's head layout (14 heads, 2 KV heads, q/k/v bias) at small widths; an odd vocabulary, so the
# last vocab shard is padded
SMALL = dataclasses.replace(PRESETS["qwen2.5-0.5b"], num_layers=2, hidden_size=128, intermediate_size=256,
                            vocab_size=1001, bos_token_id=1, eos_token_ids=(2,))
PROMPT = [5, 17, 900, 1000, 3, 64]
BLOCK = 4


def _logits(rank: int, world: int, tied: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill logits of PROMPT, then the logits of one decode step after it, on this rank's shard."""
    model = LlamaModel(dataclasses.replace(SMALL, tie_word_embeddings=tied), max_positions=64)
    init_random_weights(model, seed=3)
    with torch.no_grad():  # a nonzero o_proj bias: checks that the row-parallel sum adds it once
        model.layers[0].self_attn.o_proj.bias = torch.nn.Parameter(torch.full((SMALL.hidden_size,), 0.1))
    shard_model(model, TPGroup(rank, world))
    kv = model.allocate_kv_caches(8, BLOCK)
    assert kv[0][0].shape[2] == SMALL.num_kv_heads // world
    n = len(PROMPT)
    with torch.inference_mode():
        meta = AttentionMetadata(is_prefill=True, positions=torch.arange(n), slot_mapping=torch.arange(BLOCK, BLOCK + n),
                                 seq_lens=[n])
        prefill = model.compute_logits(model(torch.tensor(PROMPT), meta, kv))
        meta = AttentionMetadata(is_prefill=False, positions=torch.tensor([n]), slot_mapping=torch.tensor([BLOCK + n]),
                                 block_tables=torch.tensor([[1, 2, 3]], dtype=torch.int32),
                                 context_lens=torch.tensor([n + 1], dtype=torch.int32), max_len_bound=12)
        decode = model.compute_logits(model(torch.tensor([7]), meta, kv))
    return prefill, decode


@pytest.mark.parametrize("tied", [True, False])
def test_two_shards_give_the_logits_of_the_whole_model(tied: bool) -> None:
    want = _logits(0, 1, tied)
    got = run_ranks(_logits, 2, tied)
    for rank_out in got:
        for g, w in zip(rank_out, want, strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
            assert torch.equal(g.argmax(-1), w.argmax(-1))


def test_what_does_not_divide_is_refused() -> None:
    model = LlamaModel(SMALL, max_positions=16)
    with pytest.raises(ValueError, match="num_heads"):
        shard_model(model, TPGroup(0, 4))  # 14 heads over 4 ranks
    with pytest.raises(ValueError, match="num_kv_heads"):
        rank_config(dataclasses.replace(SMALL, num_heads=16, num_kv_heads=2), 4)
    assert rank_config(SMALL, 2).num_kv_heads == 1 and rank_config(SMALL, 2).num_heads == 7
    with pytest.raises(ValueError, match="rank"):
        TPGroup(2, 2)
