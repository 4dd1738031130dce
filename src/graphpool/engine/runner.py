"""Runs the model: prefill eagerly, decode through the graph pool."""

from __future__ import annotations

import functools
from itertools import accumulate

import numpy as np
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.decode_step import decode_forward, decode_input_specs
from graphpool.engine.kv_cache import BlockManager, KVCache
from graphpool.engine.sequence import Sequence
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.pool import GraphPool
from graphpool.pool.capture import Capturer


class ModelRunner:
    """Builds each step's inputs from the sequences and runs the model.

    Decode goes through `GraphPool` with batch-first static inputs (pad values in brackets): input_ids [0],
    positions [0], slot_mapping [0: the dummy slot], block_tables [0: the dummy block], context_lens [1].
    """

    def __init__(self, model: torch.nn.Module, kv_caches: list[KVCache], config: EngineConfig,
                 block_manager: BlockManager, capturer: Capturer | None = None) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_manager = block_manager
        self.device = config.torch_device
        self.block_size = config.block_size
        self.len_bound = config.len_bound
        self.max_blocks = -(-self.len_bound // self.block_size)
        self._pin = self.device.type == "cuda"
        # NOTE: a capturer stands in for CUDA graphs (tests run the graph path on the CPU with one)
        self.graphs_enabled = not config.disable_cudagraph and (self.device.type == "cuda" or capturer is not None)
        # NOTE: every step the pool serves (replayed or eager) bakes in the one bound len_bound: the decode
        # kernel's launch constants follow the bound, so a per-step bound made Triton JIT-compile new variants
        # while serving, and one bound keeps eager rows bitwise equal to replayed ones. Splits past a row's
        # length exit at once, so the larger bound costs little.
        self.pool = GraphPool(
            functools.partial(decode_forward, model, kv_caches, max_len_bound=self.len_bound),
            decode_input_specs(self.max_blocks), config.pool_config(), device=self.device, capturer=capturer,
        )

    def _to_device(self, values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, pin_memory=self._pin).to(self.device, non_blocking=True)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Whole sequences (prompt + any output so far, after a preemption), eagerly -> logits [n, vocab]."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        for seq in seqs:
            n = seq.num_tokens
            ids.extend(seq.token_ids)
            positions.extend(range(n))
            slots.extend(self.block_manager.slots(seq.request_id, 0, n))
            seq_lens.append(n)
        meta = AttentionMetadata(
            is_prefill=True,
            positions=self._to_device(positions, torch.int64),
            slot_mapping=self._to_device(slots, torch.int64),
            seq_lens=seq_lens,
        )
        hidden = self.model(self._to_device(ids, torch.int64), meta, self.kv_caches)
        last = self._to_device([n - 1 for n in accumulate(seq_lens)], torch.int64)
        return self.model.compute_logits(hidden.index_select(0, last))

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], slots: list[int]) -> tuple[torch.Tensor, bool]:
        """One token per sequence -> (logits [bs, vocab], whether a graph was replayed).

        The logits are in the model's dtype (graph memory then holds a third of the bytes of float32 + the
        matmul's own output), a view into the graph's output buffer: valid until the next decode. The
        sampler upcasts only when it needs probabilities.
        """
        lens = [seq.num_tokens for seq in seqs]
        max_len = max(lens)
        # NOTE: contexts beyond the graph bound could never replay a graph: they skip the pool, with a wider
        # block table and a bound rounded up to a power of two (few kernel variants).
        width = max(self.max_blocks, -(-max_len // self.block_size))
        rows = np.stack([self.block_manager.row(seq.request_id) for seq in seqs])[:, :width]
        block_tables = torch.from_numpy(rows)
        if self._pin:
            block_tables = block_tables.pin_memory()
        inputs = {
            "input_ids": self._to_device([seq.last_token for seq in seqs], torch.int64),
            "positions": self._to_device([n - 1 for n in lens], torch.int64),
            "slot_mapping": self._to_device(slots, torch.int64),
            "block_tables": block_tables.to(self.device, non_blocking=True),
            "context_lens": self._to_device(lens, torch.int32),
        }
        if max_len > self.len_bound:
            bound = 1 << (max_len - 1).bit_length()
            return decode_forward(self.model, self.kv_caches, inputs, max_len_bound=bound), False
        logits = self.pool.run(inputs, max_len_in_batch=max_len)
        return logits, self.pool.last_replayed

    def warmup(self, sizes: str | tuple[int, ...]) -> None:
        if not self.graphs_enabled or sizes == "none":
            return
        with torch.inference_mode():
            if sizes == "cover":
                self.pool.warmup(None)
            else:
                self.pool.warmup(tuple(self.pool.ladder) if sizes == "all" else sizes)
