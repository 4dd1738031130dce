"""Microbatch overlap (`enable_microbatch_overlap`): a decode step as two microbatches whose layers are
interleaved, so each all-reduce of one overlaps the other's next stage. The tensor-parallel engine test is
in test_tp_engine.py; the default engine stack with it on in test_default_stack.py."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import torch

from graphpool.engine.args import add_engine_args, engine_config_from_args
from graphpool.engine.config import EngineConfig
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.llama import LlamaModel
from graphpool.model.presets import PRESETS
from graphpool.model.weights import init_random_weights

SMALL = dataclasses.replace(PRESETS["qwen2.5-0.5b"], num_layers=2, hidden_size=128, intermediate_size=256,
                            vocab_size=1001, bos_token_id=1, eos_token_ids=(2,))
BLOCK = 4


def _model() -> tuple[LlamaModel, list[tuple[torch.Tensor, torch.Tensor]]]:
    model = LlamaModel(SMALL, max_positions=64)
    init_random_weights(model, seed=5)
    kv = model.allocate_kv_caches(32, BLOCK)
    with torch.inference_mode():  # KV for 5 sequences of 6 tokens each: sequence s in blocks 2s+1, 2s+2
        for s in range(5):
            ids = torch.randint(3, 1000, (6,), generator=torch.Generator().manual_seed(s))
            meta = AttentionMetadata(is_prefill=True, positions=torch.arange(6),
                                     slot_mapping=torch.arange(6) + (2 * s + 1) * BLOCK, seq_lens=[6])
            model(ids, meta, kv)
    return model, kv


def _decode_batch(seqs: list[int]) -> tuple[torch.Tensor, AttentionMetadata]:
    """One decode row per sequence (its 7th token)."""
    n = len(seqs)
    tables = torch.tensor([[2 * s + 1, 2 * s + 2] for s in seqs], dtype=torch.int32).reshape(n, 2)
    return torch.tensor([7 + s for s in seqs]), AttentionMetadata(
        is_prefill=False, positions=torch.full((n,), 6), slot_mapping=torch.tensor([(2 * s + 2) * BLOCK + 2 for s in seqs]),
        block_tables=tables, context_lens=torch.full((n,), 7, dtype=torch.int32), max_len_bound=8)


def test_interleaved_microbatches_compute_what_each_alone_does() -> None:
    model, kv = _model()
    with torch.inference_mode():
        for split in ([0, 1, 2], [3, 4]), ([4], []):
            mbs = [_decode_batch(seqs) for seqs in split]
            got = model.forward_microbatches(mbs, kv)
            for (ids, meta), out in zip(mbs, got, strict=True):
                assert out.shape == (ids.shape[0], SMALL.hidden_size)
                if ids.shape[0]:
                    assert torch.equal(out, model(ids, meta, kv))  # one rank: the very same ops


class _Recorder:
    """A stand-in tensor-parallel group (one rank's arithmetic) that logs when each reduce starts and is
    waited for, by the microbatch's row count."""

    world_size = 1

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def all_reduce_async(self, x: torch.Tensor) -> Any:
        self.events.append(("start", x.shape[0]))
        log = self.events

        class _Wait:
            def wait(self) -> None:
                log.append(("wait", x.shape[0]))

        return _Wait()


def test_each_reduce_runs_while_the_other_microbatch_computes() -> None:
    model, kv = _model()
    rec = _Recorder()
    model.tp = rec  # type: ignore[assignment]
    with torch.inference_mode():
        model.forward_microbatches([_decode_batch([0, 1, 2]), _decode_batch([3, 4])], kv)
    stages = 2 * SMALL.num_layers
    assert [e for e in rec.events if e[0] == "start"] == [("start", 3), ("start", 2)] * stages
    assert sorted(rec.events) == sorted([("start", 3), ("start", 2), ("wait", 3), ("wait", 2)] * stages)
    for k, (kind, rows) in enumerate(rec.events):
        if kind != "wait":
            continue
        started = max(j for j in range(k) if rec.events[j] == ("start", rows))
        between = rec.events[started + 1:k]
        last_stage = k >= len(rec.events) - 2
        # the other microbatch's stage was issued after this reduce started and before it is waited for
        assert last_stage or ("start", 5 - rows) in between, (k, rec.events)


def test_the_config_halves_the_graph_sizes_per_microbatch() -> None:
    on = EngineConfig(device="cpu", enable_microbatch_overlap=True, graph_max_batch_size=64,
                      graph_split_batch_size=16, graph_grow_step_size=8)
    off = dataclasses.replace(on, enable_microbatch_overlap=False)
    pool_on, pool_off = on.pool_config, off.pool_config
    assert (pool_on.num_microbatches, pool_off.num_microbatches) == (2, 1)
    assert pool_on.ladder().max_size == 32 and pool_off.ladder().max_size == 64
    assert {2 * s for s in pool_on.ladder().sizes} <= set(range(2, 65, 2))
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--enable-microbatch-overlap"])
    assert engine_config_from_args(args, device="cpu").enable_microbatch_overlap
    assert not engine_config_from_args(parser.parse_args([]), device="cpu").enable_microbatch_overlap


def test_one_rank_with_overlap_says_there_is_nothing_to_overlap(caplog) -> None:
    from graphpool.engine.engine import LLMEngine

    with caplog.at_level("WARNING", logger="graphpool.engine.engine"):
        LLMEngine(EngineConfig(model="random:qwen2.5-0.5b?layers=1", device="cpu", max_model_len=64, num_kv_blocks=16,
                               enable_microbatch_overlap=True))
    assert any("no all-reduce to overlap" in r.message for r in caplog.records)
