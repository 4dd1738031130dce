"""Runs the model: prefill (chunks) eagerly or, when small, through a resident decode graph; decode through
the graph pool."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.decode_step import (
    decode_hidden,
    decode_hidden_microbatches,
    decode_input_specs,
    decode_sampled,
    run_decode,
)
from graphpool.engine.host_copy import HostStaging, to_device
from graphpool.engine.kv_cache import BlockManager, KVCache
from graphpool.engine.prefill_paths import PrefillPaths, last_rows
from graphpool.engine.prompt_logprobs import PromptScores, score_rows, span_rows
from graphpool.engine.scheduler import PrefillChunk
from graphpool.engine.sequence import Sequence
from graphpool.engine.tp_messages import StepAnnouncer
from graphpool.engine.warmup import prefill_warmup_lengths, warm_eager_prefill
from graphpool.kernels.sample import PARAM_COLUMNS
from graphpool.pool import FallbackReason, GraphPool
from graphpool.pool.capture import Capturer
from graphpool.pool.lockstep import CaptureSync, Decision

log = logging.getLogger(__name__)

# NOTE: the pool's reasons for a step it cannot run (its step bakes in the graph bound): such a step runs
# eagerly here, with a bound of its own (`ModelRunner._eager_bound`)
_OUTSIDE_THE_POOL = (FallbackReason.NO_CUDA, FallbackReason.LEN_TOO_LARGE)


def _pow2_bound(n: int) -> int:
    # NOTE: attention length bounds outside the graphs are powers of two: few decode-kernel variants (its
    # launch constants follow the bound, and each new one is a Triton JIT compile).
    return 1 << (n - 1).bit_length()


def _block_bound(n: int, block_size: int) -> int:
    # NOTE: the bound of the batch-following (CPU) path: the torch attention reads whole blocks, so a bound
    # of whole blocks reads nothing it does not need; a power of two would read up to twice the context.
    return -(-n // block_size) * block_size


class ModelRunner(PrefillPaths):
    """Builds each step's inputs from the sequences and runs the model.

    Decode goes through `GraphPool` with batch-first static inputs (pad values in brackets): input_ids [0],
    positions [0], slot_mapping [0: the dummy slot], block_tables [0: the dummy block], context_lens [1].
    """

    def __init__(self, model: torch.nn.Module, kv_caches: list[KVCache], config: EngineConfig,
                 block_manager: BlockManager, capturer: Capturer | None = None,
                 capture_sync: CaptureSync | None = None, sample_rows: int = 0) -> None:
        """`sample_rows`: decode steps of at most this many rows draw their tokens in the step (the model's kernel
        draw, `decode_sampled`; 0: every step's LM head and draw run after it)."""
        self.model = model
        self.kv_caches = kv_caches
        self.block_manager = block_manager
        self.device = config.torch_device
        self.staging = HostStaging(self.device)
        self.block_size = config.block_size
        self.len_bound = config.len_bound
        self.max_blocks = -(-self.len_bound // self.block_size)
        # NOTE: every step the pool serves (replayed or eager) bakes in the one bound len_bound: the decode
        # kernel's launch constants follow the bound, so a per-step bound made Triton JIT-compile new variants
        # while serving, and one bound keeps eager rows bitwise equal to replayed ones. Splits past a row's
        # length exit at once, so the larger bound costs little.
        # NOTE: microbatch overlap: every decode step is two microbatches (rows split in halves, the first
        # the larger), so the pool's sizes and decisions are per microbatch
        self.num_microbatches = config.num_microbatches
        self.sample_rows = sample_rows  # NOTE: 0 with microbatches (EngineConfig refuses both)
        if self.num_microbatches > 1:
            forward = functools.partial(decode_hidden_microbatches, model, kv_caches, max_len_bound=self.len_bound)
        elif self.sample_rows:
            forward = functools.partial(decode_sampled, model, kv_caches, max_len_bound=self.len_bound,
                                        sample_rows=self.sample_rows)
        else:
            forward = functools.partial(decode_hidden, model, kv_caches, max_len_bound=self.len_bound)
        self.pool = GraphPool(
            forward, decode_input_specs(self.max_blocks, sample=self.sample_rows > 0), config.pool_config,
            device=self.device, capturer=capturer, capture_sync=capture_sync,
        )
        self.announce: StepAnnouncer | None = None  # set on rank 0 under tensor parallel
        # NOTE: with neither CUDA nor a test capturer (standing in for CUDA graphs) no graph can ever replay and
        # no Triton kernel is compiled, so nothing needs the fixed bound: the torch attention costs rows x
        # bound, and 16 rows over max_model_len=2048 took 1.2-1.6 s a step. There every decode step runs
        # outside the pool and its bound follows the batch.
        self.bound_follows_batch = self.pool.graphs_off is FallbackReason.NO_CUDA
        self.graph_prefill_max_tokens = config.graph_prefill_max_tokens if self.pool.graphs_off is None else 0
        self.prefill_warmup = prefill_warmup_lengths(self.graph_prefill_max_tokens, config.token_budget,
                                                     config.max_model_len) if self.device.type == "cuda" else ()
        self.last_prefill_replayed = False  # whether the latest prefill replayed a decode graph
        self.prompt_scores: list[PromptScores] = []  # the latest prefill's or mixed step's prompt logprobs
        self._deferred: list[int] = []  # warm-up graphs left to capture_deferred, largest first
        self._deferred_done, self._deferred_s = 0, 0.0

    def prefill_replays(self, tokens: int, max_len: int) -> bool:
        """Whether a prefill step of `tokens` tokens, reaching position `max_len`, would replay a resident graph."""
        return self._prefill_decision(tokens, max_len) is not None

    def _prefill_decision(self, tokens: int, max_len: int) -> Decision | None:
        """The replay of a resident decode graph that serves a prefill step of `tokens` tokens reaching position
        `max_len`, or None: more than `graph_prefill_max_tokens`, or no resident graph serves it."""
        if not 0 < tokens <= self.graph_prefill_max_tokens:
            return None
        return self.pool.resident_decision(self._graph_rows(tokens), max_len)

    def _graph_rows(self, rows: int) -> int:
        """The pool's batch size of a step of `rows` rows (per microbatch)."""
        return -(-rows // self.num_microbatches)

    @torch.inference_mode()
    def prefill(self, chunks: list[PrefillChunk]) -> torch.Tensor:
        """Prefill chunks -> logits [number of last chunks, vocab], in chunk order: eagerly, or, for a step of
        at most `graph_prefill_max_tokens` tokens, by a replay of a resident decode graph (`_graph_prefill`).

        A chunk from position 0 runs the model's prefill attention (SDPA within the chunk). A chunk after a
        cached prefix (a prefix-cache hit or an earlier chunk) must also attend to the prefix's K/V, which the
        model's prefill attention does not read: it runs as decode-attention rows instead, one row per token
        over the paged cache (`_paged_prefill`). Prompt-logprobs spans leave scores in `prompt_scores`.
        """
        self.last_prefill_replayed = False
        self.prompt_scores = []
        tokens = sum(c.end - c.start for c in chunks)
        # NOTE: under tensor parallel a replayed step goes to the other ranks as a decode step with its decision
        replayed = self._graph_prefill(chunks, tokens)
        if replayed is not None:
            self.last_prefill_replayed = True
            return replayed
        if self.announce is not None:
            self.announce.prefill(chunks)
        fresh = [i for i, c in enumerate(chunks) if c.start == 0]
        resumed = [i for i, c in enumerate(chunks) if c.start > 0]
        if not resumed:
            # NOTE: the common step: the last rows come out in chunk order, gathered by one index_select
            rows = self._fresh_prefill(chunks)
            return self.model.compute_logits(rows) if rows.shape[0] else torch.empty((0, 0), device=self.device)
        hidden: dict[int, torch.Tensor] = {}
        if fresh:
            fresh_last = [i for i in fresh if chunks[i].is_last]
            hidden.update(zip(fresh_last, self._fresh_prefill([chunks[i] for i in fresh]).unbind(0), strict=True))
        hidden.update(self._paged_prefill([chunks[i] for i in resumed], resumed))
        last = [hidden[i] for i, c in enumerate(chunks) if c.is_last]
        if not last:
            return torch.empty((0, 0), device=self.device)
        return self.model.compute_logits(torch.stack(last))

    def _graph_prefill(self, chunks: list[PrefillChunk], tokens: int) -> torch.Tensor | None:
        """A small prefill step as one replay of a resident decode graph (`_rows_step` without decode rows) ->
        the last chunks' logits, or None when no resident graph serves it (never a capture: prefill steps
        borrow the decode step's graphs, they add none)."""
        with self.pool.lock:
            decision = self._prefill_decision(tokens, max((c.end for c in chunks), default=0))
            if decision is None:
                return None
            return self._rows_step([], [], chunks, decision)[0]

    @torch.inference_mode()
    def mixed(self, seqs: list[Sequence], slots: list[int], chunks: list[PrefillChunk],
              input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """A decode step that carries prompt chunks (`_rows_step`; the pool decides as for any decode step).
        `input_ids`: the decode rows' tokens on the device (async scheduling), as for `decode`."""
        self.prompt_scores = []
        return self._rows_step(seqs, slots, chunks, input_ids=input_ids)

    def _rows_step(self, seqs: list[Sequence], slots: list[int], chunks: list[PrefillChunk],
                   decision: Decision | None = None,
                   input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """The decoding sequences' rows, then one decode row a chunk token (context = its position + 1 over
        its request's block table: `_paged_prefill`'s form, so fresh and resumed chunks alike), as one decode
        step -> (logits of the decode rows, then of the last chunks' last rows; whether a graph replayed)."""
        ids, positions, chunk_slots, owner = self._token_rows(chunks)
        bm = self.block_manager
        tables = [np.stack([bm.row(s.request_id) for s in seqs])] if seqs else []
        tables.append(np.stack([bm.row(c.seq.request_id) for c in chunks])[owner])
        if input_ids is not None:  # the decode rows' tokens are still on the device; the chunks' are here
            input_ids = torch.cat((input_ids, to_device(ids, torch.int64, self.device)))
        scored = span_rows(chunks, len(seqs))
        wanted = list(range(len(seqs))) + last_rows(chunks, len(seqs))
        index = to_device(wanted, torch.int64, self.device) if wanted else None
        # NOTE: the LM head runs on the wanted rows alone (a chunk's other rows give no token) unless a chunk
        # scores its prompt tokens, or ranks gather the head's vocabulary shards (every rank the same rows)
        head_rows = index if not scored and self.announce is None else None
        logits, _, graph = self.decode_rows([s.last_token for s in seqs] + ids,
                                            [s.num_tokens for s in seqs] + [p + 1 for p in positions],
                                            slots + chunk_slots, np.concatenate(tables), decision, input_ids,
                                            head_rows=head_rows)
        if head_rows is not None:
            return logits, graph
        if scored:  # NOTE: every row's logits are here already: the spans' rows need no LM head of their own
            rows = logits.index_select(0, to_device(scored, torch.int64, self.device))
            self.prompt_scores.append(score_rows(rows, chunks, logits.shape[1], None))
        if index is None:
            return torch.empty((0, 0), device=self.device), graph
        # NOTE: copies (a replay's outputs are views of the graph's output buffers, reused by the next replay)
        return logits.index_select(0, index), graph

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], slots: list[int], input_ids: torch.Tensor | None = None,
               step_draw: Callable[[list[Sequence]], np.ndarray | None] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """One token per sequence -> (logits [bs, vocab], the tokens drawn in the step or None, whether a graph
        was replayed). `input_ids`: the tokens on the device, when the host does not have them yet (async
        scheduling). `step_draw`: the rows' draw parameters (`Sampler.step_draw`), asked for where the step runs
        within `sample_rows` (`decode_rows`), for the caller to take the step's own tokens.

        The logits are in the model's dtype (graph memory then holds a third of the bytes of float32 + the
        matmul's own output), a view into the graph's outputs: valid until the next step that runs the pool
        (any decode or mixed step, or a prefill that replays a decode graph: the graphs share their output
        memory), so the engine samples from them before it runs another. The sampler upcasts only when it
        needs probabilities.
        """
        rows = np.stack([self.block_manager.row(seq.request_id) for seq in seqs])
        return self.decode_rows([seq.last_token for seq in seqs], [seq.num_tokens for seq in seqs], slots, rows,
                                input_ids=input_ids, draw=(lambda: step_draw(seqs)) if step_draw else None)

    def _eager_bound(self, max_len: int) -> int:
        """The attention length bound of a step that runs outside the pool: the whole blocks of its longest
        context where the bound follows the batch, else that context rounded up to a power of two."""
        return _block_bound(max_len, self.block_size) if self.bound_follows_batch else _pow2_bound(max_len)

    @torch.inference_mode()
    def decode_rows(self, last_tokens: list[int] | None, lens: list[int], slots: list[int], rows: np.ndarray,
                    decision: Decision | None = None, input_ids: torch.Tensor | None = None,
                    draw: Callable[[], np.ndarray | None] | None = None, head_rows: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """The decode step from its host data: each row's input token, context length (its position + 1),
        KV slot and block-table row; what rank 0 sends the other ranks under tensor parallel, with the pool's
        `decision` (None: decide here). `input_ids` (rank 0, async scheduling): the input tokens are on the
        device; the other ranks get `last_tokens=None` and receive them by a broadcast from rank 0. `draw`: the rows'
        draw parameters [rows, PARAM_COLUMNS] int64, asked for only where the step draws (the graph it replays, or
        its live rows run eagerly, within `sample_rows`; else zeros, the argmax, whose tokens nobody takes).
        `head_rows` (device indices; not with `draw`): the rows whose logits are returned, the LM head run on
        those alone where it runs after the replay.
        -> (logits, the tokens the step drew from those parameters or None, whether a graph replayed)."""
        if head_rows is not None and draw is not None:
            raise ValueError("decode_rows takes head_rows or draw, not both (a draw's tokens are every row's)")
        max_len = max(lens)
        with self.pool.lock:
            # NOTE: the pool's one decision routes the step: a context past the graph bound (or no CUDA, where
            # the bound follows the batch) runs outside the pool, with a block table as wide as that bound
            if decision is None:
                decision = self.pool.decide(self._graph_rows(len(lens)), max_len)
            eager_bound = self._eager_bound(max_len) if decision.reason in _OUTSIDE_THE_POOL else 0
            width = eager_bound // self.block_size if self.bound_follows_batch else max(
                self.max_blocks, -(-max_len // self.block_size))
            rows = rows[:, :width]
            if self.announce is not None:  # NOTE: tensor parallel: rank 0 decides and sends the decision along
                self.announce.decode(None if input_ids is not None else last_tokens, lens, slots, rows, decision)
            lens_np = np.asarray(lens, dtype=np.int32)
            ids_on_host = last_tokens is not None and input_ids is None
            host = [np.asarray(last_tokens if ids_on_host else [], dtype=np.int64), lens_np.astype(np.int64) - 1,
                    np.asarray(slots, dtype=np.int64), lens_np, rows]
            params = None
            if self.sample_rows:
                runs = decision.size if decision.action != "eager" and decision.size is not None else len(lens)
                if draw is not None and not eager_bound and runs <= self.sample_rows:
                    params = draw()
                host.append(params if params is not None else np.zeros((len(lens), PARAM_COLUMNS), dtype=np.int64))
            if decision.action != "eager":
                # NOTE: a graph's step: the pool sends the host arrays with its padding in one copy
                ids_t, pos_t, slots_t, lens_t, tables_t, *params_t = map(torch.from_numpy, host)
            else:  # NOTE: one host-to-device copy for the step's positions, slots, lengths, tables (and tokens)
                ids_t, pos_t, slots_t, lens_t, tables_t, *params_t = self.staging.to_device(*host)
            if not ids_on_host:
                if input_ids is None:  # NOTE: a rank > 0 under async scheduling: rank 0 sends the tokens
                    input_ids = torch.empty(len(lens), dtype=torch.int64, device=self.device)
                ids_t = self.model.tp.broadcast(input_ids)
            inputs = {
                "input_ids": ids_t,
                "positions": pos_t,
                "slot_mapping": slots_t,
                "block_tables": tables_t,
                "context_lens": lens_t,
                **({"sample_params": params_t[0]} if params_t else {}),
            }
            logits, drawn, graph = run_decode(self.pool, self.model, self.kv_caches, inputs, self.num_microbatches,
                                              eager_bound=eager_bound, max_len=max_len, decision=decision,
                                              head_rows=head_rows)
            return logits, drawn if params is not None else None, graph

    def warmup(self, sizes: str | tuple[int, ...]) -> None:
        """The eager prefill path, then the graphs `sizes` asks for."""
        self.warm_prefill()
        self.capture_graphs(sizes)

    def warm_prefill(self) -> None:
        """The eager prefill path's first-call costs, paid now (engine/warmup.py)."""
        warm_eager_prefill(self.model, self.kv_caches, self.prefill_warmup)

    def warmup_sizes(self, sizes: str | tuple[int, ...]) -> list[int]:
        """The graphs a warm-up of `sizes` captures, largest first: the pool's padding cover ("cover"), every
        ladder size ("all"), or `sizes`; none with graphs off."""
        if self.pool.graphs_off is not None or sizes == "none":
            return []
        if sizes == "cover":
            return self.pool.default_warmup_sizes()
        return sorted(set(self.pool.ladder if sizes == "all" else sizes), reverse=True)

    def defer_graphs(self, sizes: str | tuple[int, ...]) -> None:
        """Leaves the warm-up graphs of `sizes` to `capture_deferred`, one a call."""
        self._deferred = self.warmup_sizes(sizes)
        self._deferred_done, self._deferred_s = 0, 0.0

    @property
    def deferred_graphs(self) -> int:
        """Deferred warm-up graphs not captured yet."""
        return len(self._deferred)

    @property
    def idle_captures_left(self) -> int:
        """Deferred warm-up graphs, and sizes the pool admitted while serving them padded (defer_captures)."""
        return len(self._deferred) + len(self.pool.wanted_sizes)

    def capture_deferred(self) -> bool:
        """Captures the next deferred warm-up graph (never evicting: one the pool has no room for is skipped),
        else the pool's next wanted size; True while more remain."""
        if self._deferred:
            t0 = time.perf_counter()
            self._deferred_done += len(self._capture([self._deferred.pop(0)]))
            self._deferred_s += time.perf_counter() - t0
            if not self._deferred:
                log.info("warm-up graphs: %d captured while idle, in %.2f s", self._deferred_done, self._deferred_s)
        elif self.pool.wanted_sizes:
            with torch.inference_mode():
                self.pool.capture_wanted()
        return self.idle_captures_left > 0

    def capture_graphs(self, sizes: str | tuple[int, ...]) -> list[int]:
        """Captures the warm-up graphs of `sizes` (see `warmup_sizes`); returns those captured."""
        return self._capture(self.warmup_sizes(sizes))

    def _capture(self, sizes: list[int]) -> list[int]:
        if not sizes:
            return []
        with torch.inference_mode():
            return self.pool.warmup(sizes)
