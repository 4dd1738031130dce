"""Continuous batching: admit and prefill waiting requests, else decode every running request."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    is_prefill: bool
    seqs: list[Sequence]
    # decode only: the flat KV slot each sequence's input token writes
    slots: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    """FCFS admission, recompute preemption.

    NOTE: invariants: a request is in exactly one of `waiting` / `running` until it finishes; a running
    request holds KV blocks for all its cached tokens; a waiting request holds none. `running` is in
    admission order, so the most recently admitted request is the last one.
    """

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, token_budget: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        prefill = self._schedule_prefill()
        if prefill is not None:
            return prefill
        return self._schedule_decode()

    def _schedule_prefill(self) -> ScheduledBatch | None:
        bm = self.block_manager
        batch: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if batch and tokens + seq.num_tokens > self.token_budget:
                break
            # NOTE: keep one free block per running request so admission does not force an immediate
            # preemption on the next decode step; with nothing running, any request that fits is admitted.
            if not bm.can_allocate(seq.num_tokens, reserve=len(self.running)):
                break
            self.waiting.popleft()
            bm.allocate(seq.request_id, seq.num_tokens)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append(seq)
            tokens += seq.num_tokens
        return ScheduledBatch(is_prefill=True, seqs=batch) if batch else None

    def _schedule_decode(self) -> ScheduledBatch | None:
        bm = self.block_manager
        pending = list(self.running)
        batch: list[Sequence] = []
        slots: list[int] = []
        preempted: list[Sequence] = []
        while pending:
            seq = pending.pop(0)
            position = seq.num_tokens - 1
            while not bm.can_append_slot(seq.request_id, position) and pending:
                preempted.append(self._preempt(pending.pop()))
            if not bm.can_append_slot(seq.request_id, position):
                preempted.append(self._preempt(seq))
                continue
            slots.append(bm.append_slot(seq.request_id, position))
            batch.append(seq)
        if not batch:
            return None
        return ScheduledBatch(is_prefill=False, seqs=batch, slots=slots, preempted=preempted)

    def _preempt(self, seq: Sequence) -> Sequence:
        """Free the most recently admitted request's blocks; it is prefilled again (prompt + output so far)."""
        self.block_manager.free(seq.request_id)
        self.running.remove(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        return seq

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished, leave the queues and free its blocks (a no-op for one already finished)."""
        if seq.status is Status.FINISHED:
            return
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq.request_id)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
