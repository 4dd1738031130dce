"""KV block pool with prefix caching: reference counts, a hash -> block map of full blocks, LRU reuse.

A full block is keyed by a hash chain: key(block i) = H(key(block i-1), token ids of block i), so equal keys
mean equal token prefixes (blake2b-128: collisions are not a practical concern, unlike a 64-bit `hash()`).
A block is in exactly one of three states: referenced (ref count > 0, held by one or more requests), cached
and unreferenced (in `_lru`, its KV still valid and findable by key), or plain free (in `_free`, no key).
Fresh blocks come from `_free` first; only when it is empty is the least recently released cached block
evicted (its key dropped). Referenced blocks are never handed out again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

BlockKey = bytes


def chain_key(parent: BlockKey | None, tokens: Sequence[int]) -> BlockKey:
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


def extend_keys(keys: list[BlockKey], token_ids: Sequence[int], block_size: int, num_blocks: int) -> None:
    """Append the keys of full blocks `len(keys) .. num_blocks-1` of `token_ids` (keys only ever grow: a
    request's tokens are append-only)."""
    for i in range(len(keys), num_blocks):
        keys.append(chain_key(keys[-1] if keys else None, token_ids[i * block_size:(i + 1) * block_size]))


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counters since start, in prompt tokens: `queries` = tokens of every admitted prompt (re-admissions
    after a preemption included), `hits` = those found in cached blocks."""

    enabled: bool
    queries_tokens: int
    hits_tokens: int
    cached_blocks: int  # blocks with a key (referenced or not)

    @property
    def hit_rate(self) -> float:
        return self.hits_tokens / self.queries_tokens if self.queries_tokens else 0.0


class BlockPool:
    """Blocks 1..num_blocks-1 (block 0 is the reserved dummy block) with ref counts and the prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.enable_caching = enable_caching
        self._refs = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self._key_of: dict[int, BlockKey] = {}
        self._block_of: dict[BlockKey, int] = {}
        self.queries_tokens = 0
        self.hits_tokens = 0

    @property
    def num_free(self) -> int:
        """Blocks a request can take now (plain free + evictable cached)."""
        return len(self._free) + len(self._lru)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def num_cached(self) -> int:
        return len(self._block_of)

    def lookup(self, keys: Iterable[BlockKey]) -> list[int]:
        """The cached blocks of the longest prefix of `keys` found (stops at the first miss)."""
        blocks: list[int] = []
        if not self.enable_caching:
            return blocks
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def num_unreferenced(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` sit in the LRU (taking them uses up free capacity)."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def acquire(self, blocks: Iterable[int]) -> None:
        """Reference cached blocks (a prefix hit)."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._lru[b]
            self._refs[b] += 1

    def take(self, n: int) -> list[int]:
        """`n` fresh blocks, referenced once; evicts LRU cached blocks when no plain free block is left."""
        if n > self.num_free:
            raise RuntimeError(f"cannot allocate {n} KV blocks ({self.num_free} free)")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:
                b, _ = self._lru.popitem(last=False)
                del self._block_of[self._key_of.pop(b)]
            self._refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference of each block; a block left unreferenced stays cached (if keyed) or is freed.

        NOTE: released tail-first, so a chain's later blocks (the least shared) are evicted before its head.
        """
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] < 0:
                raise RuntimeError(f"KV block {b} released more often than referenced")
            if self._refs[b] == 0:
                if b in self._key_of:
                    self._lru[b] = None
                else:
                    self._free.append(b)

    def register(self, block: int, key: BlockKey) -> None:
        """Make a referenced, fully written block findable by `key`. A key already cached keeps its block
        (two requests that computed the same prefix at once): this block stays private and is freed later."""
        if not self.enable_caching or key in self._block_of or block in self._key_of:
            return
        self._block_of[key] = block
        self._key_of[block] = key

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.enable_caching, self.queries_tokens, self.hits_tokens, self.num_cached())
