"""Async scheduling (`EngineConfig.async_scheduling`): the next decode step is launched before the host has
the current step's tokens, so the host's bookkeeping (detokenizing, stop checks, outputs, scheduling) runs
while the GPU works instead of between its steps.

One `LLMEngine.step()` call (`_step_async`): take the decode step in flight (or schedule one and `launch` it),
launch the next decode step on its device tokens when that is safe (`chain`), then wait for the first step's
tokens (`collect`) and process them. So every call still returns the outputs of exactly one step, and at most
one step is in flight between calls. For the chained launch each sequence gets a placeholder for the token
still on the device (the scheduler then sees the lengths the next step has); the engine puts the real token in
its place.

Prefill and mixed steps are launched the same way, unless a chunk in them scores prompt tokens (prompt
logprobs; those steps run as in the synchronous engine, `LLMEngine._run`), and the step after one is chained
on its device tokens too, so a request's first decode step does not wait for the host to process its prompt's
token. With mixed steps a chained step may also admit waiting prompts into its rows beside the decode rows
(their tokens are on the host; the decode rows' on the device), so an arrival does not break the chain;
nor does a prompt split over several steps, whose next chunk rides in the chained step the same way. A chunk
that is not its prompt's last gives no token; its KV is committed to the prefix cache when the step's tokens
are read.

A sequence that the first step finishes (a stop token, `max_tokens`, a stop string) has a row in the chained
step: its token there is dropped. Its KV blocks go back at once: the chained step's write into them was
enqueued before any later step that may take them, on the same stream. Under tensor parallel the chained
step's tokens reach the other ranks by a broadcast from rank 0 (`ModelRunner.decode_rows`). A batch holding a
guided request (structured output) is not chained: its next mask depends on the token in flight, so such
batches step synchronously.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graphpool.engine.bad_words import needs_history
from graphpool.engine.host_copy import to_device
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.logprobs import StepLogprobs, TokenLogprob
from graphpool.engine.prompt_logprobs import wants_prompt_logprobs
from graphpool.engine.runner import ModelRunner
from graphpool.engine.sampler import Sampler
from graphpool.engine.scheduler import ScheduledBatch, Scheduler
from graphpool.engine.sequence import Sequence
from graphpool.engine.timeline import StepClock, StepTimeline
from graphpool.pool.pinned import record_event

PLACEHOLDER = -1  # a token still on the device (never a vocabulary id)


@dataclass
class InFlight:
    """A launched step (decode, prefill or mixed) whose tokens the host has not read yet."""

    seqs: list[Sequence]
    tokens: torch.Tensor  # [bs] int64 on the device: the next step's input ids
    host: torch.Tensor  # their copy on the host, complete once `ready` is
    ready: torch.cuda.Event | None  # None off CUDA (the copy was synchronous)
    written: list[int]  # per row: KV positions in the cache once the step ran (for the prefix cache)
    graph: bool
    clock: StepClock
    kind: str = "decode"  # the batch's kind: "decode", "prefill" or "mixed"
    num_tokens: int = 0  # tokens computed (a row a decode row, a chunk's length a chunk)
    chained: bool = False  # the next step was launched on these tokens: placeholders stand for them
    logprobs: StepLogprobs | None = None  # the rows' that asked, copied to the host with the tokens
    # (sequence, KV positions written) of each prompt chunk that is not its prompt's last (no row, no token)
    chunk_commits: list[tuple[Sequence, int]] = field(default_factory=list)


class AsyncDecode:
    """The steps that async scheduling launches ahead: the one in flight, and how the next is chained."""

    def __init__(self, scheduler: Scheduler, block_manager: BlockManager, runner: ModelRunner, sampler: Sampler,
                 timeline: StepTimeline | None, device: torch.device) -> None:
        self.scheduler, self.block_manager, self.runner, self.sampler = scheduler, block_manager, runner, sampler
        self.timeline, self.device = timeline, device
        self.inflight: InFlight | None = None
        self.chained_steps = 0  # steps launched before the previous one's tokens reached the host
        self.chained_after_prompts = 0  # of those, the ones after a prefill or mixed step
        self.chained_with_prompts = 0  # of those, mixed steps (prompt chunks admitted beside the decode rows)
        self._pin = device.type == "cuda"
        # NOTE: two host buffers for the tokens, used by turns: a launch writes one while the step before it
        # is read from the other, and each is read (its copy waited for) before its next turn comes; so is the
        # event after each copy, recorded again on its turn
        self._hosts: list[torch.Tensor] = [torch.empty(0, dtype=torch.int64)] * 2
        self._ready = [torch.cuda.Event(), torch.cuda.Event()] if self._pin else [None, None]
        self._turn = 0

    def _host_buffer(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        self._turn ^= 1
        buf = self._hosts[self._turn]
        if buf.numel() < n or buf.dtype != dtype:
            buf = torch.empty(max(n, 2 * buf.numel()), dtype=dtype, pin_memory=self._pin)
            self._hosts[self._turn] = buf
        return buf[:n]

    @staticmethod
    def launchable(batch: ScheduledBatch) -> bool:
        """Whether `launch` can run the batch: some row gets a token, and no prompt chunk scores prompt tokens."""
        return bool(batch.seqs) and all(c.prompt_logprobs is None for c in batch.chunks)

    def launch(self, batch: ScheduledBatch, input_ids: torch.Tensor | None = None) -> InFlight:
        """Run a step's forward and sampling, and start its tokens' copy to the host."""
        clock = StepClock(self.timeline, self.runner.pool, chained=input_ids is not None)
        clock.forward_begins()
        drawn = None  # the tokens a small decode step drew itself (decode_step.decode_sampled)
        if batch.is_prefill:
            logits, graph = self.runner.prefill(batch.chunks), self.runner.last_prefill_replayed
        elif batch.chunks:
            logits, graph = self.runner.mixed(batch.seqs[:len(batch.slots)], batch.slots, batch.chunks,
                                              input_ids=input_ids)
        else:
            logits, drawn, graph = self.runner.decode(batch.seqs, batch.slots, input_ids=input_ids,
                                                      step_draw=self.sampler.step_draw)
        clock.forward_ends()
        tokens, logprobs = self.sampler.sample_step(logits, batch.seqs, drawn)
        host = self._host_buffer(tokens.shape[0], tokens.dtype)
        host.copy_(tokens, non_blocking=self._pin)
        if logprobs is not None:
            logprobs = logprobs.start_copy(self._pin)
        ready = self._ready[self._turn]
        if ready is not None:
            record_event(ready, self.device)
        # NOTE: a row's KV ends at its sequence's length: a decode row's, or a last chunk's (its prompt's end)
        return InFlight(list(batch.seqs), tokens, host, ready, [s.num_tokens for s in batch.seqs], graph, clock,
                        batch.kind, batch.num_tokens, logprobs=logprobs,
                        chunk_commits=[(c.seq, c.end) for c in batch.chunks if not c.is_last])

    def chain(self, cur: InFlight) -> InFlight | None:
        """Launch the step after `cur` on its device tokens, if the scheduler would run it with every running
        request that got a token in `cur` as a decode row: the others still prefilling, a KV slot for each, no
        guided row; and with nothing to prefill, or (with mixed steps) prompt chunks in the step's other rows
        (the next chunks of prompts split over steps, then admitted ones), none of which scores prompt tokens."""
        sched, bm = self.scheduler, self.block_manager
        live = [s for s in cur.seqs if not s.finished]
        prefilling = [s for s in sched.running if s.is_prefilling]
        if (not live or any(s.is_prefilling for s in live)
                or set(map(id, live)) | set(map(id, prefilling)) != set(map(id, sched.running))):
            return None
        if prefilling and not sched.mixed_rows:
            return None  # a prompt's next chunk runs in a prefill step
        if sched.can_admit() and (not sched.mixed_rows or any(map(wants_prompt_logprobs, sched.waiting))):
            return None  # a prefill step comes next (or one that scores prompt tokens): step with the real tokens
        if any(s.guide is not None or needs_history(s) for s in live):
            return None  # a guided row's mask (a bad word's ban) needs the token the host has not read yet
        new_blocks = sum(s.num_tokens >= bm.num_slots(s.request_id) for s in live)
        if new_blocks > bm.num_free_blocks:
            return None  # the scheduler would preempt: decide that with the real tokens
        for seq in live:
            seq.token_ids.append(PLACEHOLDER)
        cur.chained = True
        batch = sched.schedule()
        if (batch is None or batch.is_prefill or batch.preempted or batch.seqs[:len(batch.slots)] != live
                or not self.launchable(batch)):
            raise RuntimeError(f"async scheduling: the chained step is not the expected step: {batch}")
        rows = {id(s): i for i, s in enumerate(cur.seqs)}
        index = [rows[id(s)] for s in live]
        ids = cur.tokens
        if index != list(range(len(cur.seqs))):
            ids = ids.index_select(0, to_device(index, torch.int64, self.device))
        self.chained_steps += 1
        self.chained_after_prompts += cur.kind != "decode"
        self.chained_with_prompts += bool(batch.chunks)
        return self.launch(batch, ids)

    def collect(self, cur: InFlight) -> list[tuple[Sequence, int, int, TokenLogprob | None]]:
        """Wait for `cur`'s tokens -> (sequence, token, KV positions written, its logprob if asked) of each row
        whose request still runs (a row is dropped when its request was aborted or finished by the step before)."""
        if cur.ready is not None:
            cur.ready.synchronize()
        tokens = cur.host.tolist()
        logprobs = cur.logprobs.by_row(tokens) if cur.logprobs is not None else {}
        rows = zip(cur.seqs, tokens, cur.written, strict=True)
        return [(seq, token, written, logprobs.get(i)) for i, (seq, token, written) in enumerate(rows)
                if not seq.finished]

    def settle(self) -> None:
        """Forget the step in flight when every row of it is dropped: nothing to wait for."""
        if self.inflight is not None and all(s.finished for s in self.inflight.seqs):
            self.inflight = None
