"""Continuous batching: prefill (in chunks within a token budget) and decode steps, strictly interleaved, or
mixed: decode steps that take prefill chunks into their leftover rows."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.prompt_logprobs import PromptSpan, prompt_span, wants_prompt_logprobs
from graphpool.engine.sequence import Sequence, Status


@dataclass(frozen=True)
class PrefillChunk:
    """Tokens [start, end) of `seq` to compute; positions [0, start) are already in the KV cache."""

    seq: Sequence
    start: int
    end: int
    prompt_logprobs: PromptSpan | None = None  # positions whose rows score prompt tokens (prompt logprobs)

    @property
    def is_last(self) -> bool:
        """The chunk ends at the sequence's last token: its logits are sampled."""
        return self.end == self.seq.num_tokens


@dataclass
class ScheduledBatch:
    is_prefill: bool
    # the sequences that get a token this step: the decoding ones (one a slot), then those whose last chunk runs
    seqs: list[Sequence]
    # the flat KV slot each decoding sequence's input token writes (none in a prefill step)
    slots: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # prompt chunks, in batch order: a prefill step's, or those a mixed step carries after its decode rows
    chunks: list[PrefillChunk] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "prefill" if self.is_prefill else ("mixed" if self.chunks else "decode")

    @property
    def num_tokens(self) -> int:
        return sum(c.end - c.start for c in self.chunks) + len(self.slots)


class Scheduler:
    """FCFS admission, chunked prefill, recompute preemption.

    A step is either a prefill step (chunks of admitted prompts, at most `token_budget` tokens in all) or a
    decode step (one token for every request whose prompt is computed). NOTE: strict interleaving: after a
    prefill step, if any request can decode, the next step is a decode step, so a stream waits for at most one
    prefill step between its tokens. A prompt is split only when it does not fit the rest of the budget of an
    otherwise empty step (later chunks take a slower attention path, see runner.prefill), so a step packs whole
    prompts first.

    NOTE: invariants: a request is in exactly one of `waiting` / `running` until it finishes; a running
    request holds KV blocks for its whole prompt from admission on (so a chunked prefill never needs more
    blocks) and for all its cached tokens; a waiting request holds none. `running` is in admission order, so
    the most recently admitted request is the last one.
    """

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, token_budget: int,
                 mixed_rows: int = 0, mixed_prompt_tokens: int | None = None, idle_prefill_rows: int = 0,
                 idle_prefill_steps: int = 0,
                 graph_ready: Callable[[int, int], bool] | None = None) -> None:
        """``mixed_rows`` > 0: mixed steps, a decode step of D rows takes prompt chunks into its other
        ``min(mixed_rows, token_budget) - D`` rows, at most ``mixed_prompt_tokens`` of them (None: all; no
        admission in a step that preempted).
        ``idle_prefill_rows`` > 0 (with mixed steps): while nothing decodes, a prompt with at most
        ``idle_prefill_steps`` times that many tokens left is prefilled in steps of that many tokens (each a
        decode graph's replay) instead of one eager step, when ``graph_ready(rows, prompt length)`` says such a
        step would replay (None: always)."""
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.mixed_rows = mixed_rows
        self.mixed_prompt_tokens = mixed_prompt_tokens
        self.idle_prefill_rows = idle_prefill_rows
        self.idle_prefill_steps = idle_prefill_steps
        self.graph_ready = graph_ready
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._last_was_prefill = False

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        if self.mixed_rows:
            return self._schedule_mixed()
        can_decode = any(not s.is_prefilling for s in self.running)
        if not (self._last_was_prefill and can_decode):
            prefill = self._schedule_prefill()
            if prefill is not None:
                self._last_was_prefill = True
                return prefill
        self._last_was_prefill = False
        decode = self._schedule_decode()
        if decode is None:
            prefill = self._schedule_prefill()
            self._last_was_prefill = prefill is not None
            return prefill
        return decode

    def can_admit(self) -> bool:
        """Whether a prefill step could admit the first waiting request now (what `schedule` would try
        first; no side effects)."""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return False
        seq = self.waiting[0]
        return self.block_manager.can_allocate(seq.num_tokens, reserve=len(self.running), cached=self._cached(seq))

    def _cached(self, seq: Sequence) -> list[int]:
        """The cached prefix blocks `seq` reuses: none while it needs prompt logprobs (a cached position's
        logits are never computed)."""
        return [] if wants_prompt_logprobs(seq) else self.block_manager.match_prefix(seq)

    def _schedule_mixed(self) -> ScheduledBatch | None:
        decode = self._schedule_decode()
        if decode is None:
            return self._schedule_prefill(self._idle_budget())
        room = min(self.mixed_rows, self.token_budget) - len(decode.seqs)
        if self.mixed_prompt_tokens is not None:
            room = min(room, self.mixed_prompt_tokens)
        if decode.preempted or room <= 0:
            return decode
        prefill = self._schedule_prefill(room)
        if prefill is None:
            return decode
        return ScheduledBatch(is_prefill=False, seqs=decode.seqs + prefill.seqs, slots=decode.slots,
                              chunks=prefill.chunks)

    def _idle_budget(self) -> int | None:
        """A prefill step's budget while nothing decodes: `idle_prefill_rows` when the next prompt (one still
        prefilling, else the first waiting) has at most `idle_prefill_steps` steps of them left and such a step
        would replay a graph, else None (the token budget: steps that would run eagerly are fewer, larger)."""
        seq = next((s for s in self.running if s.is_prefilling), self.waiting[0] if self.waiting else None)
        rows = self.idle_prefill_rows
        if not rows or seq is None or seq.num_tokens - seq.num_computed_tokens > self.idle_prefill_steps * rows:
            return None
        return rows if self.graph_ready is None or self.graph_ready(rows, seq.num_tokens) else None

    def _schedule_prefill(self, budget: int | None = None) -> ScheduledBatch | None:
        bm = self.block_manager
        budget = self.token_budget if budget is None else budget
        chunks: list[PrefillChunk] = []

        def add_chunk(seq: Sequence) -> None:
            nonlocal budget
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            chunks.append(PrefillChunk(seq, start, end, prompt_span(seq, start, end)))
            seq.num_computed_tokens += n
            budget -= n

        for seq in self.running:  # prompts admitted earlier and still prefilling go first
            if budget == 0:
                break
            if seq.is_prefilling and not (chunks and seq.num_tokens - seq.num_computed_tokens > budget):
                add_chunk(seq)
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            cached = self._cached(seq)
            num_cached = len(cached) * bm.block_size
            if chunks and seq.num_tokens - num_cached > budget:
                break
            # NOTE: keep one free block per running request so admission does not force an immediate
            # preemption on the next decode step; with nothing running, any request that fits is admitted.
            if not bm.can_allocate(seq.num_tokens, reserve=len(self.running), cached=cached):
                break
            self.waiting.popleft()
            bm.allocate(seq.request_id, seq.num_tokens, cached)
            bm.pool.queries_tokens += seq.num_tokens
            bm.pool.hits_tokens += num_cached
            seq.status = Status.RUNNING
            seq.num_computed_tokens = num_cached
            if seq.num_cached_tokens is None:  # NOTE: a preempted request's later admissions are its own output
                seq.num_cached_tokens = min(num_cached, seq.num_prompt_tokens)
            self.running.append(seq)
            if seq.is_prefilling:  # else only its last token is left: the next decode step computes it
                add_chunk(seq)
        if not chunks:
            return None
        return ScheduledBatch(is_prefill=True, seqs=[c.seq for c in chunks if c.is_last], chunks=chunks)

    def _schedule_decode(self) -> ScheduledBatch | None:
        bm = self.block_manager
        batch: list[Sequence] = []
        slots: list[int] = []
        preempted: list[Sequence] = []
        for seq in [s for s in self.running if not s.is_prefilling]:
            if seq.status is not Status.RUNNING:  # preempted for an earlier one
                continue
            position = seq.num_tokens - 1
            while not bm.can_append_slot(seq.request_id, position):
                victim = next((s for s in reversed(self.running) if s is not seq and s not in batch), None)
                if victim is None:
                    break
                preempted.append(self._preempt(victim))
            if not bm.can_append_slot(seq.request_id, position):
                preempted.append(self._preempt(seq))
                continue
            slots.append(bm.append_slot(seq.request_id, position))
            seq.num_computed_tokens = seq.num_tokens
            batch.append(seq)
        if not batch:
            return None
        return ScheduledBatch(is_prefill=False, seqs=batch, slots=slots, preempted=preempted)

    def _preempt(self, seq: Sequence) -> Sequence:
        """Free the most recently admitted request's blocks; it is prefilled again (prompt + output so far)."""
        self.block_manager.free(seq.request_id)
        self.running.remove(seq)
        seq.status = Status.WAITING
        seq.num_computed_tokens = 0
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
