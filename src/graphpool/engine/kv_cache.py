"""Paged KV cache: per-layer block tensors and the block manager (request -> block table)."""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from graphpool.model.config import ModelConfig

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


def allocate_kv_caches(
    model_config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[KVCache]:
    shape = (num_blocks, block_size, model_config.num_kv_heads, model_config.head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(model_config.num_layers)
    ]


class BlockManager:
    """Hands out KV blocks 1..num_blocks-1 and keeps each request's block table.

    A request's table row is also kept as an int32 numpy row (width `max_blocks_per_seq`, padded with the
    dummy block) so the runner can stack a batch's block tables without Python loops.
    """

    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self._free: deque[int] = deque(range(1, num_blocks))
        self._tables: dict[str, list[int]] = {}
        self._rows: dict[str, np.ndarray] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

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

    def can_allocate(self, num_tokens: int, reserve: int = 0) -> bool:
        return self.blocks_for(num_tokens) + reserve <= len(self._free)

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """Blocks for the first `num_tokens` positions of a new request."""
        if request_id in self._tables:
            raise RuntimeError(f"request {request_id!r} already holds KV blocks")
        n = self.blocks_for(num_tokens)
        if n > len(self._free) or n > self.max_blocks_per_seq:
            raise RuntimeError(f"cannot allocate {n} KV blocks ({len(self._free)} free)")
        blocks = [self._free.popleft() for _ in range(n)]
        row = np.full(self.max_blocks_per_seq, DUMMY_BLOCK, dtype=np.int32)
        row[:n] = blocks
        self._tables[request_id] = blocks
        self._rows[request_id] = row
        return blocks

    def can_append_slot(self, request_id: str, position: int) -> bool:
        """Whether the token at `position` has (or can get) a slot."""
        return position < len(self._tables[request_id]) * self.block_size or bool(self._free)

    def append_slot(self, request_id: str, position: int) -> int:
        """The flat slot of the token at `position`, taking a new block when it starts one."""
        table = self._tables[request_id]
        index = position // self.block_size
        if index == len(table):
            if not self._free:
                raise RuntimeError("no free KV block (call can_append_slot first)")
            if index >= self.max_blocks_per_seq:
                raise RuntimeError(f"request {request_id!r} is past max_model_len")
            block = self._free.popleft()
            table.append(block)
            self._rows[request_id][index] = block
        elif index > len(table):
            raise RuntimeError(f"position {position} skips a block of request {request_id!r}")
        return table[index] * self.block_size + position % self.block_size

    def slots(self, request_id: str, start: int, end: int) -> list[int]:
        """Flat slots of positions [start, end) (all already allocated)."""
        table, bs = self._tables[request_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def free(self, request_id: str) -> None:
        """Give a request's blocks back; unknown ids are a no-op."""
        blocks = self._tables.pop(request_id, None)
        self._rows.pop(request_id, None)
        if blocks:
            self._free.extend(blocks)
