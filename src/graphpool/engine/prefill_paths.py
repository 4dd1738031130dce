"""The eager prefill paths of `ModelRunner`: chunks from position 0 through the model's prefill attention, and
chunks after a cached prefix as decode-attention rows over the paged cache; both leave the prompt-logprobs
scores of the spans that ask for them."""

from __future__ import annotations

import numpy as np
import torch

from graphpool.engine.host_copy import HostStaging, to_device
from graphpool.engine.kv_cache import BlockManager, KVCache
from graphpool.engine.prompt_logprobs import PromptScores, score_rows, span_rows
from graphpool.engine.scheduler import PrefillChunk
from graphpool.model.attn_metadata import AttentionMetadata


def last_rows(chunks: list[PrefillChunk], first: int) -> list[int]:
    """Row indices of the last chunks' last tokens when the chunks' tokens are rows from row ``first`` on."""
    rows: list[int] = []
    end = first
    for c in chunks:
        end += c.end - c.start
        if c.is_last:
            rows.append(end - 1)
    return rows


_PAGED_POSITIONS = 1 << 18  # context positions the torch attention of one paged-prefill piece may gather


class PrefillPaths:
    """What the runner's prefill steps share: host lists to the device, and the two eager paths."""

    model: torch.nn.Module
    kv_caches: list[KVCache]
    block_manager: BlockManager
    device: torch.device
    block_size: int
    max_blocks: int
    prompt_scores: list[PromptScores]
    staging: HostStaging

    def _eager_bound(self, max_len: int) -> int:
        raise NotImplementedError

    def _ints_to_device(self, *lists: list[int]) -> tuple[torch.Tensor, ...]:
        """int64 lists -> device tensors in one host-to-device copy (views of one tensor, in order)."""
        return tuple(self.staging.to_device(*(np.asarray(x, dtype=np.int64) for x in lists)))

    def _tables_to_device(self, rows: np.ndarray) -> torch.Tensor:
        """Block-table rows [n, width] (int32, host) -> the device, through pinned memory on CUDA."""
        return self.staging.to_device(rows)[0]

    def _fresh_prefill(self, chunks: list[PrefillChunk]) -> torch.Tensor:
        """Chunks from position 0 -> the hidden rows of their last tokens [chunks that are last, hidden]."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        for c in chunks:
            ids.extend(c.seq.token_ids[:c.end])
            positions.extend(range(c.end))
            slots.extend(self.block_manager.slots(c.seq.request_id, 0, c.end))
            seq_lens.append(c.end)
        scored = span_rows(chunks, 0)
        ids_t, pos_t, slots_t, last_t, scored_t = self._ints_to_device(ids, positions, slots, last_rows(chunks, 0),
                                                                       scored)
        meta = AttentionMetadata(is_prefill=True, positions=pos_t, slot_mapping=slots_t, seq_lens=seq_lens)
        out = self.model(ids_t, meta, self.kv_caches)
        if scored:
            self._score(out.index_select(0, scored_t), chunks)
        return out.index_select(0, last_t)

    def _score(self, hidden: torch.Tensor, chunks: list[PrefillChunk]) -> None:
        """Prompt logprobs from the hidden rows of the chunks' spans, through the LM head (a collective under
        tensor parallel: every rank scores the same rows)."""
        self.prompt_scores.append(score_rows(hidden, chunks, self.model.config.vocab_size, self.model.compute_logits))

    def _paged_prefill(self, chunks: list[PrefillChunk], index: list[int]) -> dict[int, torch.Tensor]:
        """Token p of a chunk is a decode row with context p + 1 over its request's block table: the model
        writes a layer's K/V for all rows before that layer's attention, so a row sees the prefix and the
        chunk's earlier tokens, i.e. exactly causal attention. NOTE: the torch attention gathers every row's
        context (rows x bound positions), so its rows run in pieces of at most _PAGED_POSITIONS positions; a
        later piece reads what an earlier one wrote."""
        bm = self.block_manager
        ids, positions, slots, owner = self._token_rows(chunks)
        max_ctx = max(c.end for c in chunks)
        bound = self._eager_bound(max_ctx)
        width = max(self.max_blocks, -(-bound // self.block_size))
        table_rows = np.stack([bm.row(c.seq.request_id) for c in chunks])
        if table_rows.shape[1] < width:
            table_rows = np.pad(table_rows, ((0, 0), (0, width - table_rows.shape[1])))
        table_rows = table_rows[:, :width]
        piece = len(ids)
        if self.model.attn_backend == "torch":
            piece = max(1, _PAGED_POSITIONS // (-(-bound // self.block_size) * self.block_size))
        last_row = {k: i for i, k in enumerate(owner)}  # the last row of each chunk
        wanted = {last_row[k]: index[k] for k, c in enumerate(chunks) if c.is_last}
        out: dict[int, torch.Tensor] = {}
        scored, scored_parts = span_rows(chunks, 0), []
        for lo in range(0, len(ids), piece):
            hi = min(lo + piece, len(ids))
            ids_t, pos_t, slots_t = self._ints_to_device(ids[lo:hi], positions[lo:hi], slots[lo:hi])
            meta = AttentionMetadata(
                is_prefill=False,
                positions=pos_t,
                slot_mapping=slots_t,
                block_tables=self._tables_to_device(table_rows[owner[lo:hi]]),
                context_lens=to_device([p + 1 for p in positions[lo:hi]], torch.int32, self.device),
                max_len_bound=bound,
            )
            hidden = self.model(ids_t, meta, self.kv_caches)
            out.update({wanted[r]: hidden[r - lo] for r in range(lo, hi) if r in wanted})
            if scored:
                rows = to_device([r - lo for r in scored if lo <= r < hi], torch.int64, self.device)
                scored_parts.append(hidden.index_select(0, rows))
        if scored:
            self._score(torch.cat(scored_parts), chunks)
        return out

    def _token_rows(self, chunks: list[PrefillChunk]) -> tuple[list[int], list[int], list[int], list[int]]:
        """The chunks' tokens as decode rows: input id, position, KV slot and owning chunk of each."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        owner: list[int] = []
        for k, c in enumerate(chunks):
            ids.extend(c.seq.token_ids[c.start:c.end])
            positions.extend(range(c.start, c.end))
            slots.extend(self.block_manager.slots(c.seq.request_id, c.start, c.end))
            owner.extend([k] * (c.end - c.start))
        return ids, positions, slots, owner

