"""What rank 0 sends the other tensor-parallel ranks each step, and the views their runners read it through.

A step is a tuple whose first item names it:
- `("prefill", chunks, rows)`: the step's prefill chunks as `ChunkView`s and each request's block-table row;
  the other ranks run `ModelRunner.prefill` on them through a `BlockTableView`, so that every rank builds the
  very same model inputs with the very same code;
- `("decode", last_tokens, lens, slots, rows, decision)`: `ModelRunner.decode_rows`' arguments, the graph
  pool's `Decision` included (it also sends a step past the graph bound outside the pool); `last_tokens`
  None: the input tokens are still on rank 0's device (async scheduling) and come by a broadcast from it;
- `("stats",)`: reply with the rank's `PoolStats` (between steps); `("stop",)`: leave the group and exit.
A rank replies `("loaded", None)` once its shard is loaded, `("ready", None)` after the graph warm-up, and
`("error", traceback text)` when it fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.prompt_logprobs import PromptSpan
from graphpool.engine.scheduler import PrefillChunk
from graphpool.pool.lockstep import Decision


class StepAnnouncer(Protocol):
    """Tensor parallel, rank 0: hands each step's batch to the other ranks before this rank's forward (whose
    collectives need them running the same forward). engine/tp_leader.py."""

    def prefill(self, chunks: list[PrefillChunk]) -> None: ...

    def decode(self, last_tokens: list[int] | None, lens: list[int], slots: list[int], rows: np.ndarray,
               decision: Decision) -> None: ...


@dataclass(frozen=True)
class SeqView:
    """What the runner reads of a sequence in a prefill: its id and its tokens up to the chunk's end (and the
    one after it, which a prompt-logprobs span's last row scores)."""

    request_id: str
    token_ids: list[int]


@dataclass(frozen=True)
class ChunkView:
    seq: SeqView
    start: int
    end: int
    is_last: bool
    prompt_logprobs: PromptSpan | None = None  # every rank scores the same rows (the LM head is a collective)


class BlockTableView:
    """The block manager as a prefill reads it (`row`, `slots`), over the rows rank 0 sent for the step."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._rows: Mapping[str, np.ndarray] = {}

    def update(self, rows: Mapping[str, np.ndarray]) -> None:
        self._rows = rows

    def row(self, request_id: str) -> np.ndarray:
        return self._rows[request_id]

    def slots(self, request_id: str, start: int, end: int) -> list[int]:
        """The flat KV slots of positions [start, end), as `BlockManager.slots` gives them."""
        row, bs = self._rows[request_id], self.block_size
        return [int(row[p // bs]) * bs + p % bs for p in range(start, end)]


def prefill_message(chunks: list[PrefillChunk], block_manager: BlockManager) -> tuple[object, ...]:
    views = [ChunkView(SeqView(c.seq.request_id, c.seq.token_ids[:c.end + 1]), c.start, c.end, c.is_last,
                       c.prompt_logprobs) for c in chunks]
    return ("prefill", views, {c.seq.request_id: block_manager.row(c.seq.request_id) for c in chunks})
