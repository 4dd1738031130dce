"""Chunked prefill: the token budget splits long prompts over steps, prefill and decode steps interleave, and
greedy outputs are token for token those of an unchunked prefill (six layers of the real default model, CPU)."""

from __future__ import annotations

import itertools
import random

import pytest

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.scheduler import Scheduler
from graphpool.engine.sequence import Sequence, Status
from model_reference import run_waves


# scheduler alone -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seed", "budget", "caching"), [(0, 5, False), (1, 7, True), (2, 16, True), (3, 3, False)])
def test_chunks_cover_each_prompt_once_within_the_budget(seed: int, budget: int, caching: bool) -> None:
    rng = random.Random(seed)
    bs, max_len = 4, 40
    bm = BlockManager(24, bs, max_blocks_per_seq=max_len // bs, enable_prefix_caching=caching)
    sched = Scheduler(bm, max_num_seqs=6, token_budget=budget)
    pending = [Sequence(f"r{i}", [rng.randint(0, 1) for _ in range(rng.randint(1, 24))],
                        SamplingParams(temperature=0, max_tokens=rng.randint(1, 8)), frozenset(), None)
               for i in range(30)]
    covered: dict[str, int] = {}  # request -> next position its prefill must compute
    finished = 0
    previous_was_prefill = False
    for _ in range(5000):
        if not pending and not sched.has_unfinished():
            break
        if pending and rng.random() < 0.4:
            sched.add(pending.pop(0))
        could_decode = any(s.status is Status.RUNNING and not s.is_prefilling for s in sched.running)
        batch = sched.schedule()
        if batch is None:
            continue
        if batch.is_prefill:
            assert 0 < batch.num_tokens <= budget
            assert not (previous_was_prefill and could_decode), "two prefill steps in a row while a request could decode"
            for c in batch.chunks:
                rid = c.seq.request_id
                # a first chunk starts after the prefix-cache hit (whole blocks), a later one where the last ended
                assert c.start == covered[rid] if rid in covered else c.start % bs == 0
                assert c.start < c.end <= c.seq.num_tokens
                covered[rid] = c.end
                bm.commit(c.seq, c.end)
            assert batch.seqs == [c.seq for c in batch.chunks if c.end == c.seq.num_tokens]
        else:
            for s in batch.seqs:
                bm.commit(s, s.num_tokens)
        for s in batch.preempted:
            covered.pop(s.request_id, None)
        previous_was_prefill = batch.is_prefill
        for s in batch.seqs:  # "sample" one token
            covered.pop(s.request_id, None)
            s.token_ids.append(1)
            if s.num_output_tokens >= s.params.max_tokens or s.num_tokens >= max_len:
                sched.finish(s, "length")
                finished += 1
    assert finished == 30 and bm.num_free_blocks == bm.num_usable_blocks


def test_a_long_prompt_is_chunked_and_decodes_keep_going() -> None:
    bm = BlockManager(64, 4, max_blocks_per_seq=32)
    sched = Scheduler(bm, max_num_seqs=4, token_budget=8)
    short = Sequence("short", [1, 2, 3], SamplingParams(temperature=0, max_tokens=50), frozenset(), None)
    long = Sequence("long", list(range(40)), SamplingParams(temperature=0, max_tokens=2), frozenset(), None)
    sched.add(short)
    assert sched.schedule().seqs == [short]
    short.token_ids.append(9)
    sched.add(long)
    kinds = []
    while long.num_output_tokens == 0:
        batch = sched.schedule()
        kinds.append("p" if batch.is_prefill else "d")
        if batch.is_prefill:
            assert [(c.seq, c.end - c.start) for c in batch.chunks] == [(long, 8)]
        for s in batch.seqs:
            s.token_ids.append(9)
    assert kinds == ["d", "p"] * 5  # 40 tokens in 5 chunks of 8, a decode step before each
    assert short.num_output_tokens == 1 + 5


# the engine on six layers of the real default model ---------------------------------------------------------
MAX_MODEL_LEN = 192
TEXTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined a "
    "screw press with movable metal type, oil-based ink and a mould for casting letters quickly. Within fifty "
    "years presses were at work in more than two hundred cities, and the price of books fell sharply. Explain",
    "def merge_sort(values):\n    if len(values) <= 1:\n        return values\n    middle = len(values) // 2\n"
    "    left = merge_sort(values[:middle])\n    right = merge_sort(values[middle:])\n    merged = []\n"
    "    while left and right:\n        merged.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n",
    "Q: A train leaves the station at nine in the morning and travels at sixty kilometres an hour. A second "
    "train leaves the same station an hour later on the same track at ninety kilometres an hour. When and "
    "where does the second train catch up with the first one? Think step by step.\nA:",
]


@pytest.fixture(scope="module")
def loaded(short_model):
    return short_model  # tests/conftest.py: the embedded model, six of its layers


@pytest.fixture(scope="module")
def prompts(loaded) -> list[list[int]]:
    ids = [loaded[2].encode(t + "\n\n" + TEXTS[(i + 1) % len(TEXTS)]) for i, t in enumerate(TEXTS)]
    assert min(len(p) for p in ids) > 64 and max(len(p) for p in ids) + 8 <= MAX_MODEL_LEN
    return ids


def _engine(loaded, **kwargs) -> LLMEngine:
    settings = {"device": "cpu", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 64,
                "enable_prefix_caching": False} | kwargs
    return LLMEngine(EngineConfig(**settings), loaded=loaded)


def _generate(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 8) -> dict[str, list[int]]:
    return run_waves(engine, prompts, [range(len(prompts))], max_tokens)


@pytest.fixture(scope="module")
def unchunked(loaded, prompts) -> dict[str, list[int]]:
    return _generate(_engine(loaded), prompts)


@pytest.mark.parametrize("budget", [16, 33, 64])
def test_chunked_equals_unchunked_greedy(loaded, prompts, unchunked, budget: int) -> None:
    engine = _engine(loaded, max_num_batched_tokens=budget)
    steps = []
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.token_ids
        steps.append(engine.last_step)
    assert out == unchunked
    prefill_tokens = [s.num_tokens for s in steps if s.kind == "prefill"]
    # a prompt whose last chunk would be its last token alone leaves that token to a decode step
    total = sum(len(p) for p in prompts)
    assert max(prefill_tokens) <= budget and total - len(prompts) <= sum(prefill_tokens) <= total
    assert len(prefill_tokens) >= total // budget


def test_chunked_with_prefix_caching_equals_unchunked(loaded, prompts, unchunked) -> None:
    engine = _engine(loaded, max_num_batched_tokens=33, enable_prefix_caching=True)
    assert _generate(engine, prompts[:1]) == {"r0": unchunked["r0"]}
    # the same prompt again: its cached blocks are reused, the rest is chunked
    again = _generate(engine, [prompts[0]])
    assert again == {"r0": unchunked["r0"]}
    stats = engine.prefix_cache_stats()
    assert stats.hits_tokens == (len(prompts[0]) - 1) // 16 * 16


def test_a_decode_gets_tokens_while_a_long_prompt_prefills(loaded, prompts) -> None:
    engine = _engine(loaded, max_num_batched_tokens=16)
    engine.add_request("short", prompts[0][:10], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    engine.step()  # its prefill: it decodes from now on
    engine.add_request("long", prompts[1], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    short_tokens = 0
    kinds = []
    while True:
        outputs = {o.request_id: o for o in engine.step()}
        kinds.append(engine.last_step.kind)
        short_tokens += len(outputs["short"].new_token_ids) if "short" in outputs else 0
        if "long" in outputs:
            break
    chunks = -(-(len(prompts[1]) - 1) // 16)  # a last token left alone is computed by a decode step
    assert kinds.count("prefill") == chunks
    assert short_tokens >= chunks - 1  # a decode step between every two chunks
    assert all(a != b or a == "decode" for a, b in itertools.pairwise(kinds))
