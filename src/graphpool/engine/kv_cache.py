"""Paged KV cache: per-layer block tensors and the block manager (request -> block table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from graphpool.engine.prefix_cache import BlockPool, extend_keys
from graphpool.model.config import ModelConfig

if TYPE_CHECKING:
    from graphpool.engine.sequence import Sequence

KVCache = tuple[torch.Tensor, torch.Tensor]
DUMMY_BLOCK = 0  # NOTE: never handed out; padded graph rows write slot 0 and read block 0
_CPU_KV_BYTES = 512 * 2**20  # default KV budget on CPU


def kv_bytes_per_block(model_config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * model_config.num_layers * block_size * model_config.num_kv_heads * model_config.head_dim * itemsize


def choose_num_blocks(
    model_config: ModelConfig, *, block_size: int, dtype: torch.dtype, device: torch.device,
    kv_cache_fraction: float, max_num_seqs: int, max_model_len: int, num_kv_blocks: int | None,
) -> int:
    """How many KV blocks to allocate (block 0 included).

    On CUDA: `kv_cache_fraction` of the free device memory, measured after the model is loaded. Graph memory
    is not carved out here: the pool bounds it by its own byte budget, so leave `1 - kv_cache_fraction`
    of headroom for graphs and activations. Capped at what max_num_seqs full-length requests could use.
    """
    if num_kv_blocks is not None:
        return num_kv_blocks
    per_block = kv_bytes_per_block(model_config, block_size, dtype)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = int(free * kv_cache_fraction)
    else:
        budget = _CPU_KV_BYTES
    needed = max_num_seqs * -(-max_model_len // block_size) + 1
    blocks = min(budget // per_block, needed)
    if blocks < 2:
        raise ValueError(
            f"not enough memory for a KV cache: one block needs {per_block} bytes and the budget is {budget} "
            "bytes (raise kv_cache_fraction or set num_kv_blocks)"
        )
    return blocks


class BlockManager:
    """Hands out KV blocks 1..num_blocks-1 and keeps each request's block table.

    A request's table row is also kept as an int32 numpy row (width `max_blocks_per_seq`, padded with the
    dummy block) so the runner can stack a batch's block tables without Python loops. With
    `enable_prefix_caching`, full blocks are shared between requests through `BlockPool` (ref counts, LRU).
    """

    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: int,
                 enable_prefix_caching: bool = False) -> None:
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self._tables: dict[str, list[int]] = {}
        self._rows: dict[str, np.ndarray] = {}
        self._registered: dict[str, int] = {}  # how many leading blocks of a request are keyed in the pool

    @property
    def enable_prefix_caching(self) -> bool:
        return self.pool.enable_caching

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def row(self, request_id: str) -> np.ndarray:
        return self._rows[request_id]

    def has(self, request_id: str) -> bool:
        return request_id in self._tables

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of `seq`'s tokens. NOTE: only blocks before the last token: the
        last token is always computed (its logits are sampled) and never written into a shared block."""
        if not self.pool.enable_caching:
            return []
        extend_keys(seq.block_keys, seq.token_ids, self.block_size, (seq.num_tokens - 1) // self.block_size)
        return self.pool.lookup(seq.block_keys[:(seq.num_tokens - 1) // self.block_size])

    def can_allocate(self, num_tokens: int, reserve: int = 0, cached: list[int] | tuple[int, ...] = ()) -> bool:
        needed = self.blocks_for(num_tokens) - len(cached) + self.pool.num_unreferenced(cached)
        return needed + reserve <= self.pool.num_free

    def allocate(self, request_id: str, num_tokens: int, cached: list[int] | None = None) -> list[int]:
        """Blocks for the first `num_tokens` positions of a new request: the `cached` prefix blocks (from
        `match_prefix`, now referenced once more), then fresh ones."""
        if request_id in self._tables:
            raise RuntimeError(f"request {request_id!r} already holds KV blocks")
        cached = cached or []
        n = self.blocks_for(num_tokens)
        if n > self.max_blocks_per_seq or not self.can_allocate(num_tokens, cached=cached):
            raise RuntimeError(f"cannot allocate {n} KV blocks ({self.num_free_blocks} free)")
        self.pool.acquire(cached)
        blocks = cached + self.pool.take(n - len(cached))
        row = np.full(self.max_blocks_per_seq, DUMMY_BLOCK, dtype=np.int32)
        row[:n] = blocks
        self._tables[request_id] = blocks
        self._rows[request_id] = row
        self._registered[request_id] = len(cached)
        return blocks

    def num_slots(self, request_id: str) -> int:
        """Positions the request's blocks hold (the next position at or past it takes a new block)."""
        return len(self._tables[request_id]) * self.block_size

    def can_append_slot(self, request_id: str, position: int) -> bool:
        """Whether the token at `position` has (or can get) a slot."""
        return position < len(self._tables[request_id]) * self.block_size or self.pool.num_free > 0

    def append_slot(self, request_id: str, position: int) -> int:
        """The flat slot of the token at `position`, taking a new block when it starts one."""
        table = self._tables[request_id]
        index = position // self.block_size
        if index == len(table):
            if not self.pool.num_free:
                raise RuntimeError("no free KV block (call can_append_slot first)")
            if index >= self.max_blocks_per_seq:
                raise RuntimeError(f"request {request_id!r} is past max_model_len")
            (block,) = self.pool.take(1)
            table.append(block)
            self._rows[request_id][index] = block
        elif index > len(table):
            raise RuntimeError(f"position {position} skips a block of request {request_id!r}")
        return table[index] * self.block_size + position % self.block_size

    def slots(self, request_id: str, start: int, end: int) -> list[int]:
        """Flat slots of positions [start, end) (all already allocated)."""
        table, bs = self._tables[request_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def commit(self, seq: Sequence, num_written: int) -> None:
        """Key the request's blocks that the first `num_written` positions fill completely (call once their
        KV is in the cache, i.e. after the step's forward)."""
        if not self.pool.enable_caching or seq.request_id not in self._tables:
            return
        full = min(num_written // self.block_size, len(self._tables[seq.request_id]))
        done = self._registered[seq.request_id]
        if full <= done:
            return
        extend_keys(seq.block_keys, seq.token_ids, self.block_size, full)
        table = self._tables[seq.request_id]
        for i in range(done, full):
            self.pool.register(table[i], seq.block_keys[i])
        self._registered[seq.request_id] = full

    def free(self, request_id: str) -> None:
        """Give a request's blocks back (cached ones stay reusable until evicted); unknown ids: a no-op."""
        blocks = self._tables.pop(request_id, None)
        self._rows.pop(request_id, None)
        self._registered.pop(request_id, None)
        if blocks:
            self.pool.release(blocks)
