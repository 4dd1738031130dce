"""Prefix caching: the block pool's ref counts and LRU eviction (randomized invariants against a shadow of
the KV contents), hit accounting, and greedy outputs equal with and without it on six layers of the real
default model."""

from __future__ import annotations

import random

import pytest

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.sequence import Sequence
from model_reference import run_waves


def _seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(temperature=0, max_tokens=4), frozenset(), None)


def _admit(bm: BlockManager, seq: Sequence) -> int:
    cached = bm.match_prefix(seq)
    bm.allocate(seq.request_id, seq.num_tokens, cached)
    return len(cached) * bm.block_size


# block manager --------------------------------------------------------------------------------------------
def test_hits_are_full_blocks_before_the_last_token() -> None:
    bm = BlockManager(num_blocks=32, block_size=4, max_blocks_per_seq=8, enable_prefix_caching=True)
    first = _seq("a", list(range(12)))  # 3 full blocks
    assert _admit(bm, first) == 0
    bm.commit(first, 12)
    assert bm.pool.num_cached() == 3
    # the same 12 tokens: the last block holds the last token, which must be computed -> 2 blocks hit
    assert _admit(bm, _seq("b", list(range(12)))) == 8
    # the cached 12 tokens + 1: every full block hits, one token is left to compute
    assert _admit(bm, _seq("c", list(range(13)))) == 12
    # diverging inside block 1: only block 0 hits; same tokens at other positions do not
    assert _admit(bm, _seq("d", [0, 1, 2, 3, 4, 99, 6, 7, 8])) == 4
    assert _admit(bm, _seq("e", list(range(4, 16)))) == 0
    shared = bm.table("a")[0]
    assert bm.pool.ref_count(shared) == 4 and bm.table("b")[0] == bm.table("c")[0] == bm.table("d")[0] == shared
    for rid in "abcde":
        bm.free(rid)
    assert bm.num_free_blocks == bm.num_usable_blocks and bm.pool.num_cached() == 3


def test_disabled_cache_never_shares() -> None:
    bm = BlockManager(num_blocks=32, block_size=4, max_blocks_per_seq=8)
    a, b = _seq("a", list(range(12))), _seq("b", list(range(13)))
    _admit(bm, a)
    bm.commit(a, 12)
    assert _admit(bm, b) == 0 and not set(bm.table("a")) & set(bm.table("b"))


def test_unreferenced_cached_blocks_are_evicted_lru_and_only_when_needed() -> None:
    bm = BlockManager(num_blocks=7, block_size=2, max_blocks_per_seq=6, enable_prefix_caching=True)  # 6 usable
    a = _seq("a", [1, 2, 3, 4, 5])  # blocks [1,2] [3,4] [5]
    _admit(bm, a)
    bm.commit(a, 5)
    bm.free("a")  # two cached blocks stay, tail-first in the LRU
    assert bm.num_free_blocks == 6 and bm.pool.num_cached() == 2
    b = _seq("b", [9] * 10)  # 5 fresh blocks: the 4 plain free ones, then the LRU's oldest ([3, 4], the tail)
    _admit(bm, b)
    assert bm.pool.num_cached() == 1 and bm.num_free_blocks == 1
    head = bm.match_prefix(_seq("c", [1, 2, 3, 4, 6]))
    assert len(head) == 1 and bm.pool.ref_count(head[0]) == 0 and head[0] not in bm.table("b")
    bm.free("b")
    assert _admit(bm, _seq("c", [1, 2, 3, 4, 6])) == 2  # the head block [1, 2] survived
    assert bm.pool.ref_count(head[0]) == 1 and bm.table("c")[0] == head[0]


@pytest.mark.parametrize("seed", range(8))
def test_referenced_blocks_are_never_reused(seed: int) -> None:
    """Random admissions (prompts over a 3-token alphabet, so prefixes are shared), decode appends, commits and
    frees against a shadow of what every KV slot holds: a request always reads its own tokens back."""
    rng = random.Random(seed)
    bs, num_blocks = 2, rng.choice([6, 10, 24])
    bm = BlockManager(num_blocks, bs, max_blocks_per_seq=16, enable_prefix_caching=True)
    shadow: dict[int, int] = {}  # flat slot -> token written there
    live: dict[str, Sequence] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.35:
            seq = _seq(f"r{step}", [rng.randint(0, 2) for _ in range(rng.randint(1, 12))])
            cached = bm.match_prefix(seq)
            if not bm.can_allocate(seq.num_tokens, cached=cached):
                continue
            start = _admit(bm, seq)
            for pos, slot in enumerate(bm.slots(seq.request_id, start, seq.num_tokens), start):
                shadow[slot] = seq.token_ids[pos]
            bm.commit(seq, seq.num_tokens)
            live[seq.request_id] = seq
        elif op < 0.7 and live:
            seq = live[rng.choice(sorted(live))]
            pos = seq.num_tokens
            if pos < 16 * bs and bm.can_append_slot(seq.request_id, pos):
                seq.token_ids.append(rng.randint(0, 2))
                shadow[bm.append_slot(seq.request_id, pos)] = seq.token_ids[pos]
                bm.commit(seq, seq.num_tokens)
        elif live:
            bm.free(live.pop(rng.choice(sorted(live))).request_id)
        held: dict[int, int] = {}
        for seq in live.values():
            table = bm.table(seq.request_id)
            for b in table:
                held[b] = held.get(b, 0) + 1
            slots = bm.slots(seq.request_id, 0, seq.num_tokens)
            assert [shadow[s] for s in slots] == seq.token_ids, "a block a request holds was overwritten"
        assert 0 not in held
        assert all(bm.pool.ref_count(b) == n for b, n in held.items())
        assert len(held) + bm.num_free_blocks == bm.num_usable_blocks
    for rid in list(live):
        bm.free(rid)
    assert bm.num_free_blocks == bm.num_usable_blocks


# the engine on six layers of the real default model ---------------------------------------------------------
MAX_MODEL_LEN = 128
SYSTEM = ("You are a helpful assistant. Answer briefly and precisely. The user asks about the geography and "
          "history of Europe: its rivers, mountains, kings, wars, treaties and the cities along the trade routes.")
QUESTIONS = ["What is the capital of France?", "Who was Charlemagne?", "Name a long river."]


@pytest.fixture(scope="module")
def loaded(short_model):
    return short_model  # tests/conftest.py: the embedded model, six of its layers


@pytest.fixture(scope="module")
def prompts(loaded) -> list[list[int]]:
    tok = loaded[2]
    system = tok.encode(SYSTEM)
    assert len(system) >= 33
    # shared system prompt + questions; a prompt that is exactly 2 cached blocks + 1 token; one of exactly 2 blocks
    return [system + tok.encode(" " + q) for q in QUESTIONS] + [system[:33], system[:32]]


def _generate(loaded, prompts: list[list[int]], waves: list[list[int]], max_tokens: int = 6,
              ignore_eos: bool = False, **kwargs) -> tuple[dict[str, list[int]], LLMEngine]:
    config = EngineConfig(**({"device": "cpu", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 64} | kwargs))
    engine = LLMEngine(config, loaded=loaded)
    out = run_waves(engine, prompts, waves, max_tokens, ignore_eos=ignore_eos, prefix="p")
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
    return out, engine


def test_greedy_outputs_equal_with_and_without_prefix_caching(loaded, prompts) -> None:
    waves = [[0], [1, 2, 3, 4]]
    off, engine_off = _generate(loaded, prompts, waves, enable_prefix_caching=False)
    on, engine_on = _generate(loaded, prompts, waves)
    assert on == off and len(on) == 5
    assert engine_off.prefix_cache_stats().hits_tokens == 0
    stats = engine_on.prefix_cache_stats()
    system_blocks = len(prompts[3]) // 16  # 2 full blocks of the system prompt are shared by all
    assert stats.queries_tokens == sum(len(p) for p in prompts)
    # wave 2: three prompts hit the cached system blocks of prompt 0 (prompt 4 = 2 blocks: only 1 may hit)
    expected = sum(min((len(prompts[0]) - 0) // 16, (len(p) - 1) // 16, _common(prompts[0], p) // 16) * 16
                   for p in prompts[1:])
    assert stats.hits_tokens == expected and stats.hits_tokens >= 3 * system_blocks * 16


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_prefix_caching_survives_preemption_and_abort(loaded, prompts) -> None:
    """A cache too small for the batch (recompute preemption) and an abort: same outputs, every block back."""
    waves = [[0], [1, 2]]
    ref, _ = _generate(loaded, prompts, waves, max_tokens=16, ignore_eos=True, enable_prefix_caching=False)
    # room for wave 2's prompts (their shared system blocks once) + the one block per running request that
    # admission keeps free: 16 more tokens each need 2 more blocks, so one of them is preempted
    shared = min(_common(prompts[0], prompts[i]) for i in (1, 2)) // 16
    assert all(-(-(len(prompts[i]) + 15) // 16) > -(-len(prompts[i]) // 16) for i in (1, 2))
    usable = shared + sum(-(-len(prompts[i]) // 16) - shared for i in (1, 2)) + 1
    got, engine = _generate(loaded, prompts, waves, max_tokens=16, ignore_eos=True, num_kv_blocks=usable + 1)
    assert got == ref and engine.scheduler.num_preemptions > 0
    engine.add_request("x", prompts[1], SamplingParams(temperature=0, max_tokens=8))
    engine.add_request("y", prompts[2], SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    engine.step()
    engine.abort_request("x")
    while engine.has_unfinished_requests():
        engine.step()
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks
    assert all(bm.pool.ref_count(b) == 0 for b in range(1, bm.num_blocks))
