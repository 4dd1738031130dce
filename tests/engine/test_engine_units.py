"""Engine parts without a model: sampling params, config, block manager, scheduler, sampler."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import SamplingParams
from graphpool.engine.scheduler import Scheduler
from graphpool.engine.sequence import Sequence, Status
from graphpool.engine.values import parse_bytes
from graphpool.pool import FallbackReason


# sampling params ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": "x"}, "seed"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
    ],
)
def test_sampling_params_rejects_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_normalises_stop() -> None:
    p = SamplingParams(stop="\n\n", stop_token_ids=(5, 6))
    assert p.stop == ["\n\n"] and p.stop_token_ids == [5, 6] and p.max_stop_len == 2
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


# config ------------------------------------------------------------------------------------------------
def test_parse_bytes() -> None:
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes(4096) == 4096
    assert parse_bytes("4096") == 4096
    for bad in ("lots", "12XB", "", "-3MiB"):
        with pytest.raises(ValueError, match="byte size"):
            parse_bytes(bad)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "tpu"}, "device"),
        ({"dtype": "int8"}, "dtype"),
        ({"attn_backend": "flash"}, "attn_backend"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"block_size": 12}, "power of two"),
        ({"kv_cache_fraction": 1.5}, "kv_cache_fraction"),
        ({"num_kv_blocks": 1}, "num_kv_blocks"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"graph_memory_budget": "huge"}, "byte size"),
        ({"graph_warmup": "some"}, "graph_warmup"),
        ({"max_graph_pool_size": 0}, "max_graph_pool_size"),
        ({"graph_mempool": "shared", "graph_memory_budget": "1GiB"}, "per_graph"),
        ({"graph_miss_policy": "maybe"}, "miss_policy"),
    ],
)
def test_engine_config_rejects_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_engine_config_pool_config_and_defaults() -> None:
    c = EngineConfig(device="cpu", max_model_len=1024, graph_max_len_in_batch=4096, graph_memory_budget="64MiB",
                     graph_warmup="1,2,4", max_graph_pool_size=4)
    assert c.len_bound == 1024  # clamped to max_model_len
    assert c.graph_memory_budget == 64 * 2**20
    assert c.graph_warmup == (1, 2, 4)
    # NOTE: the default model is a GGUF: 4-bit linear weights and bfloat16 on the CPU (tests/model/test_model_int4.py)
    assert c.torch_dtype == torch.bfloat16 and c.graphs_off is FallbackReason.NO_CUDA
    pc = c.pool_config
    assert pc.max_graph_pool_size == 4 and pc.graph_memory_budget == 64 * 2**20 and pc.max_len_in_batch == 1024
    assert not EngineConfig(device="cpu", disable_cudagraph=True).pool_config.enabled
    assert c.pool_config is c.pool_config  # built once
    wider = dataclasses.replace(c, max_graph_pool_size=8)
    assert wider.pool_config.max_graph_pool_size == 8 and c.pool_config.max_graph_pool_size == 4



def test_engine_config_sizes_the_pool_for_warmup_all() -> None:
    # "all" at the default pool size would capture 16 of the 46 sizes and evict while serving.
    full = EngineConfig(device="cpu", graph_warmup="all")
    assert full.max_graph_pool_size == 46 == len(full.pool_config.ladder().sizes)
    small = EngineConfig(device="cpu", graph_warmup="all", graph_max_batch_size=16, graph_split_batch_size=8)
    assert small.max_graph_pool_size == 16  # a 9-size ladder fits the default
    assert EngineConfig(device="cpu").max_graph_pool_size == 16
    assert EngineConfig(device="cpu", graph_warmup="all", max_graph_pool_size=64).max_graph_pool_size == 64
    with pytest.raises(ValueError, match=r"captures 46 graphs .* max_graph_pool_size is 16.*>= 46"):
        EngineConfig(device="cpu", graph_warmup="all", max_graph_pool_size=16)
    with pytest.raises(ValueError, match=r"captures 3 graphs .* max_graph_pool_size is 2"):
        EngineConfig(device="cpu", graph_warmup="1,2,4", max_graph_pool_size=2)


def test_a_max_batch_size_below_the_split_gives_every_size_its_own_graph() -> None:
    assert EngineConfig(device="cpu", graph_max_batch_size=8).pool_config.ladder().sizes == tuple(range(1, 9))
    overlap = EngineConfig(device="cpu", graph_max_batch_size=8, enable_microbatch_overlap=True)
    assert overlap.pool_config.ladder().sizes == (1, 2, 3, 4)


def test_resolve_device_gives_an_indexed_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.engine.values import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    # NOTE: torch.cuda.set_device refuses an index-less device ("cuda"): the server's engine thread died on it.
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="2 CUDA device"):
        resolve_device("cuda:2")

# block manager -----------------------------------------------------------------------------------------
def test_block_manager_allocate_append_free() -> None:
    bm = BlockManager(num_blocks=6, block_size=4, max_blocks_per_seq=8)
    assert bm.num_free_blocks == 5 and bm.num_usable_blocks == 5
    assert bm.can_allocate(20) and not bm.can_allocate(21) and not bm.can_allocate(17, reserve=1)
    blocks = bm.allocate("a", 5)  # positions 0..4 -> 2 blocks
    assert len(blocks) == 2 and 0 not in blocks
    assert bm.slots("a", 0, 5) == [blocks[0] * 4 + i for i in range(4)] + [blocks[1] * 4]
    assert list(bm.row("a")[:3]) == [*blocks, 0]
    assert bm.append_slot("a", 5) == blocks[1] * 4 + 1  # same block
    assert bm.num_free_blocks == 3
    bm.append_slot("a", 6)
    bm.append_slot("a", 7)
    slot = bm.append_slot("a", 8)  # a new block
    assert bm.num_free_blocks == 2 and slot == bm.table("a")[2] * 4
    with pytest.raises(RuntimeError):
        bm.allocate("a", 1)
    bm.free("a")
    bm.free("a")  # no-op
    assert bm.num_free_blocks == 5 and not bm.has("a")


def test_block_manager_never_hands_out_the_dummy_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, max_blocks_per_seq=4)
    got = bm.allocate("x", 6)
    assert sorted(got) == [1, 2, 3] and not bm.can_append_slot("x", 6)
    with pytest.raises(RuntimeError, match="no free KV block"):
        bm.append_slot("x", 6)


# scheduler under random arrivals -----------------------------------------------------------------------
def _seq(rid: str, prompt_len: int, max_tokens: int) -> Sequence:
    return Sequence(rid, [1] * prompt_len, SamplingParams(temperature=0, max_tokens=max_tokens), frozenset(), None)


@pytest.mark.parametrize("seed", range(6))
def test_scheduler_invariants_under_random_arrivals(seed: int) -> None:
    rng = random.Random(seed)
    block_size, num_blocks, max_num_seqs = 4, rng.choice([8, 12, 30]), rng.choice([2, 4, 16])
    max_model_len = 24
    bm = BlockManager(num_blocks, block_size, max_blocks_per_seq=max_model_len // block_size)
    sched = Scheduler(bm, max_num_seqs=max_num_seqs, token_budget=max_model_len * 2)
    pending = [
        _seq(f"r{i}", rng.randint(1, 12), rng.randint(1, 12)) for i in range(40)
    ]
    pending = [s for s in pending if bm.blocks_for(min(s.num_tokens + s.params.max_tokens, max_model_len))
               <= bm.num_usable_blocks]
    all_seqs = list(pending)
    finished: list[Sequence] = []
    steps = 0
    while pending or sched.has_unfinished():
        steps += 1
        assert steps < 5000, "scheduler made no progress"
        for _ in range(rng.randint(0, 3)):
            if pending:
                sched.add(pending.pop(0))
        if rng.random() < 0.03 and sched.running:  # an abort
            victim = rng.choice(sched.running)
            sched.finish(victim, "abort")
            finished.append(victim)
        batch = sched.schedule()
        if batch is None:
            assert not sched.running and (not sched.waiting or pending)
            continue
        # invariants: disjoint queues, running within limits, every running seq owns enough blocks
        ids_running = {s.request_id for s in sched.running}
        ids_waiting = {s.request_id for s in sched.waiting}
        assert not ids_running & ids_waiting
        assert len(sched.running) <= max_num_seqs
        assert all(s.status is Status.RUNNING for s in sched.running)
        assert all(s.status is Status.WAITING and not bm.has(s.request_id) for s in sched.waiting)
        held = [b for s in sched.running for b in bm.table(s.request_id)]
        assert len(held) == len(set(held)) and 0 not in held
        assert len(held) + bm.num_free_blocks == bm.num_usable_blocks
        for s in sched.running:  # every token but the last (the next decode input) has a slot
            assert len(bm.table(s.request_id)) * block_size >= s.num_tokens - 1
        for s in batch.seqs:  # the batch's sequences have slots for all their tokens
            assert len(bm.table(s.request_id)) * block_size >= s.num_tokens
        if batch.is_prefill:
            assert sum(s.num_tokens for s in batch.seqs) <= max_model_len * 2 or len(batch.seqs) == 1
        else:
            assert set(batch.seqs) <= set(sched.running) and len(batch.slots) == len(batch.seqs)
            assert len(set(batch.slots)) == len(batch.slots)
        for s in batch.seqs:  # "sample" one token
            s.token_ids.append(7)
            if s.num_output_tokens >= s.params.max_tokens or s.num_tokens >= max_model_len:
                sched.finish(s, "length")
                finished.append(s)
    assert {s.request_id for s in finished} == {s.request_id for s in all_seqs}
    for s in finished:
        if s.finish_reason == "length":
            assert s.num_output_tokens == min(s.params.max_tokens, max_model_len - s.num_prompt_tokens)
    assert bm.num_free_blocks == bm.num_usable_blocks


def test_scheduler_preempts_most_recent_and_resumes_first() -> None:
    bm = BlockManager(num_blocks=5, block_size=2, max_blocks_per_seq=8)  # 4 usable blocks
    sched = Scheduler(bm, max_num_seqs=8, token_budget=64)
    a, b = _seq("a", 2, 8), _seq("b", 2, 8)
    sched.add(a)
    sched.add(b)
    assert sched.schedule().seqs == [a, b]  # one prefill for both
    for _ in range(2):
        for s in (a, b):
            s.token_ids.append(1)
        batch = sched.schedule()
        assert not batch.is_prefill and batch.seqs == [a, b]
    for s in (a, b):
        s.token_ids.append(1)
    batch = sched.schedule()  # a needs its 3rd block, none free: b (admitted last) is preempted
    assert batch.seqs == [a] and batch.preempted == [b] and list(sched.waiting) == [b]
    assert b.status is Status.WAITING and not bm.has("b") and sched.num_preemptions == 1


# sampler -----------------------------------------------------------------------------------------------
def _sampling_seq(rid: str, **kwargs: object) -> Sequence:
    params = SamplingParams(**kwargs)  # type: ignore[arg-type]
    gen = None
    if params.seed is not None:
        gen = torch.Generator().manual_seed(params.seed)
    return Sequence(rid, [1], params, frozenset(), gen)


def test_sampler_greedy_is_exact_argmax() -> None:
    logits = torch.randn(8, 1000)
    seqs = [_sampling_seq(str(i), temperature=0) for i in range(8)]
    assert torch.equal(Sampler(torch.device("cpu"), 0).sample(logits, seqs), logits.argmax(-1))
    mixed = [_sampling_seq(str(i), temperature=0 if i % 2 else 1.0) for i in range(8)]
    out = Sampler(torch.device("cpu"), 0).sample(logits, mixed)
    assert torch.equal(out[1::2], logits.argmax(-1)[1::2])


def test_sampler_takes_greedy_tokens_with_its_argmax_after_penalties() -> None:
    logits = torch.randn(4, 50)

    def shifted(x: torch.Tensor) -> torch.Tensor:  # NOTE: not the argmax, so where it is used shows
        return (x.argmax(-1) + 1) % x.shape[1]

    sampler = Sampler(torch.device("cpu"), 0, argmax=shifted)
    greedy = [_sampling_seq(str(i), temperature=0) for i in range(4)]
    assert torch.equal(sampler.sample(logits, greedy), shifted(logits))
    mixed = [_sampling_seq(str(i), temperature=0 if i % 2 else 1.0) for i in range(4)]
    assert torch.equal(sampler.sample(logits, mixed)[1::2], shifted(logits)[1::2])
    penalised = [*greedy[:3], _sampling_seq("p", temperature=0, repetition_penalty=1.5)]
    out = sampler.sample(logits, penalised)
    row = logits[3].clone()
    row[1] = row[1] / 1.5 if row[1] > 0 else row[1] * 1.5  # the prompt's one token, repetition-penalised
    assert out.tolist() == [*shifted(logits[:3]).tolist(), int(shifted(row[None])[0])]


def test_sampler_takes_model_dtype_logits() -> None:
    logits = torch.randn(8, 1000).to(torch.bfloat16)  # what a bf16 decode graph outputs
    greedy = [_sampling_seq(str(i), temperature=0) for i in range(8)]
    assert torch.equal(Sampler(torch.device("cpu"), 0).sample(logits, greedy), logits.float().argmax(-1))
    mixed = [_sampling_seq(str(i), temperature=0 if i % 2 else 0.8, top_p=0.9) for i in range(8)]
    out = Sampler(torch.device("cpu"), 0).sample(logits, mixed)
    assert out.dtype == torch.int64 and torch.equal(out[1::2], logits.float().argmax(-1)[1::2])


def test_sampler_top_k_and_top_p_restrict_support() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 50)
    top5 = set(logits[0].topk(5).indices.tolist())
    sampler = Sampler(torch.device("cpu"), 0)
    seq = _sampling_seq("k", temperature=1.5, top_k=5)
    assert {sampler.sample(logits, [seq]).item() for _ in range(300)} <= top5
    probs = torch.softmax(logits[0], -1)
    order = probs.argsort(descending=True)
    cum = probs[order].cumsum(0)
    nucleus = set(order[: int((cum < 0.6).sum()) + 1].tolist())
    seq = _sampling_seq("p", temperature=1.0, top_p=0.6)
    seen = {sampler.sample(logits, [seq]).item() for _ in range(400)}
    assert seen <= nucleus and len(seen) > 1


def test_sampler_matches_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    sampler = Sampler(torch.device("cpu"), 1)
    seq = _sampling_seq("d", temperature=1.0)
    counts = torch.bincount(torch.stack([sampler.sample(logits, [seq]) for _ in range(3000)]).flatten(), minlength=3)
    assert torch.allclose(counts / 3000, torch.tensor([0.5, 0.3, 0.2]), atol=0.04)


def test_sampler_draws_follow_the_softmax_over_a_wide_vocabulary() -> None:
    """Chi-square of 20,000 unseeded and 4,000 seeded draws over 40 tokens against the softmax (the rare ones
    pooled); the inverse CDF's ends pick the first and last tokens of non-zero probability."""
    from graphpool.engine.draw import inverse_cdf

    probs = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0]] * 4)
    u = torch.tensor([[0.0], [0.25], [0.5], [1 - 2**-24]])
    assert inverse_cdf(probs, u).tolist() == [1, 3, 3, 4]  # an edge belongs to the token above it
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(2)) * 3
    probs = torch.softmax(logits[0] / 0.7, -1)
    sampler = Sampler(torch.device("cpu"), 5)
    rows = [_sampling_seq(f"u{i}", temperature=0.7) for i in range(2000)]
    unseeded = torch.cat([sampler.sample(logits.expand(2000, -1), rows) for _ in range(10)])
    seeded = [sampler.sample(logits, [_sampling_seq(f"s{i}", temperature=0.7, seed=i)]) for i in range(4000)]
    for draws in (unseeded, torch.cat(seeded)):
        expected = probs * len(draws)
        keep = expected >= 5  # NOTE: the rare tokens pooled into one cell, as chi-square asks
        assert not keep.all()
        obs = torch.bincount(draws, minlength=40).float()
        obs = torch.cat([obs[keep], obs[~keep].sum().view(1)])
        exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
        chi2 = float(((obs - exp) ** 2 / exp).sum())
        assert chi2 < {22: 48.27, 15: 37.70}[len(obs) - 1], chi2  # p = 0.001 at those degrees of freedom


def test_sampler_seeded_rows_ignore_the_rest_of_the_batch() -> None:
    logits = torch.randn(4, 300)

    def run(batch_logits: torch.Tensor, n_others: int) -> list[int]:
        sampler = Sampler(torch.device("cpu"), 123)
        seeded = _sampling_seq("s", temperature=0.9, top_p=0.95, seed=7)
        others = [_sampling_seq(f"o{i}", temperature=1.0) for i in range(n_others)]
        return [int(sampler.sample(batch_logits, [seeded, *others])[0]) for _ in range(20)]

    assert run(logits[:1], 0) == run(logits, 3)


def test_a_draw_takes_every_row_with_its_cut_keyed_by_seed_and_position() -> None:
    """The kernel draw's routing (a CPU double records what it is handed): seeded keys depend on the seed and
    the row's output count only; rows with top-k, top-p or min-p go to the draw with their cut (the packing
    grows by three columns only when some row has one); a greedy batch never draws."""
    from graphpool.engine.sampler import _step_key

    calls: list[list[list[float]]] = []

    def draw(logits: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        bs = logits.shape[0]
        cols = params.view(-1, bs)
        floats = cols.to(torch.int32).view(torch.float32).tolist()
        calls.append([cols[0].tolist(), floats[1], *([cols[2].tolist(), floats[3], floats[4]] if len(cols) == 5 else [])])
        return torch.full((bs,), 7, dtype=torch.int64)  # NOTE: 7 marks the kernel's rows

    sampler = Sampler(torch.device("cpu"), 0, draw=draw)
    logits = torch.randn(3, 50)
    seeded = _sampling_seq("s", temperature=0.5, seed=11)
    batch = [seeded, _sampling_seq("p", temperature=1.0, top_p=0.5, top_k=4, min_p=0.25),
             _sampling_seq("g", temperature=0)]
    assert sampler.sample(logits, batch).tolist() == [7, 7, 7]
    keys, temps, top_k, top_p, min_p = calls[-1]
    assert keys[0] == _step_key(11, 0) and temps == [0.5, 1.0, 0.0]
    assert top_k == [0, 4, 0] and top_p == [1.0, 0.5, 1.0] and min_p == [0.0, 0.25, 0.0]
    sampler.sample(logits[:1], [seeded])
    assert len(calls[-1]) == 2 and calls[-1][0] == [_step_key(11, 0)]  # alone, no cut: the same key
    seeded.token_ids.append(5)
    sampler.sample(logits[:1], [seeded])
    assert calls[-1][0] == [_step_key(11, 1)] != [_step_key(11, 0)]  # the next position: another key
    n = len(calls)
    sampler.sample(logits, [_sampling_seq(str(i), temperature=0) for i in range(3)])
    assert len(calls) == n
    assert _step_key(-1, 4) == _step_key(2**64 - 1, 4)  # a negative seed s draws as 2**64 + s
